#include "pg/keys/tombstone_digest.hpp"

extern "C" {
#include "mb/pg_wchar.h"
#include "utils/uuid.h"
}

namespace idem::pg {

namespace {

// Adds the text's bytes, converted to UTF-8, to the hash. A SQL_ASCII
// database's text has no declared encoding: its bytes are taken as they
// are (the same as UTF-8 for text written in UTF-8), where a conversion
// would refuse a byte that is not valid UTF-8.
bool hash_utf8(pg_cryptohash_ctx* ctx, const text* value) {
    const char* bytes = VARDATA_ANY(value);
    const int length = static_cast<int>(VARSIZE_ANY_EXHDR(value));
    char* utf8 = GetDatabaseEncoding() == PG_SQL_ASCII
                     ? const_cast<char*>(bytes)
                     : pg_server_to_any(bytes, length, PG_UTF8);
    const int utf8_length = utf8 == bytes ? length : static_cast<int>(strlen(utf8));
    const bool ok = pg_cryptohash_update(ctx, reinterpret_cast<const uint8*>(utf8), utf8_length) == 0;
    if (utf8 != bytes) pfree(utf8);
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
