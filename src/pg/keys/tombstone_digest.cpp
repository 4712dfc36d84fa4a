#include "pg/keys/tombstone_digest.hpp"

extern "C" {
#include "utils/uuid.h"
}

#include "pg/keys/digest_bytes.hpp"

namespace idem::pg {

namespace {

bool hash_utf8(pg_cryptohash_ctx* ctx, const text* value) {
    const DigestBytes utf8 = digest_bytes(value);
    const bool ok =
        pg_cryptohash_update(ctx, reinterpret_cast<const uint8*>(utf8.data), utf8.length) == 0;
    release(utf8);
    return ok;
}

}  // namespace

Datum tombstone_digest(const KeyId& id) {
    static const uint8 kSeparator = 0;
    uint8 hash[PG_SHA256_DIGEST_LENGTH];
    pg_cryptohash_ctx* ctx = pg_cryptohash_create(PG_SHA256);
    const bool ok = pg_cryptohash_init(ctx) == 0 && hash_utf8(ctx, id.scope) &&
                    pg_cryptohash_update(ctx, &kSeparator, 1) == 0 && hash_utf8(ctx, id.key) &&
                    pg_cryptohash_final(ctx, hash, sizeof hash) == 0;
    pg_cryptohash_free(ctx);
    if (!ok) elog(ERROR, "idempotency: could not compute a key's tombstone digest");
    pg_uuid_t* digest = static_cast<pg_uuid_t*>(palloc(sizeof(pg_uuid_t)));
    memcpy(digest->data, hash, UUID_LEN);
    return UUIDPGetDatum(digest);
}

}  // namespace idem::pg
