#include "pg/fingerprint.hpp"

#include <cstring>

namespace idem::pg {

Datum fingerprint_of(Datum request) {
    Jsonb* jsonb = DatumGetJsonbP(request);
    char* canonical = JsonbToCString(nullptr, &jsonb->root, VARSIZE(jsonb));

    bytea* digest = static_cast<bytea*>(palloc(VARHDRSZ + PG_SHA256_DIGEST_LENGTH));
    SET_VARSIZE(digest, VARHDRSZ + PG_SHA256_DIGEST_LENGTH);
    pg_cryptohash_ctx* ctx = pg_cryptohash_create(PG_SHA256);
    if (pg_cryptohash_init(ctx) < 0 ||
        pg_cryptohash_update(ctx, reinterpret_cast<const uint8*>(canonical), strlen(canonical)) < 0 ||
        pg_cryptohash_final(ctx, reinterpret_cast<uint8*>(VARDATA(digest)),
                            PG_SHA256_DIGEST_LENGTH) < 0) {
        pg_cryptohash_free(ctx);
        elog(ERROR, "idempotency: could not compute the request fingerprint");
    }
    pg_cryptohash_free(ctx);
    pfree(canonical);
    return PointerGetDatum(digest);
}

bool fingerprints_differ(Datum a, Datum b) {
    bytea* left = DatumGetByteaPP(a);
    bytea* right = DatumGetByteaPP(b);
    const std::size_t size = VARSIZE_ANY_EXHDR(left);
    return size != VARSIZE_ANY_EXHDR(right) ||
           std::memcmp(VARDATA_ANY(left), VARDATA_ANY(right), size) != 0;
}

}  // namespace idem::pg
