#include "pg/keys/step_key.hpp"

extern "C" {
#include "lib/stringinfo.h"
}

#include "pg/keys/digest_bytes.hpp"

namespace idem::pg {

namespace {

constexpr int kDigestBytesShown = 16;

void append_part(StringInfo material, const text* part) {
    const DigestBytes utf8 = digest_bytes(part);
    appendStringInfo(material, "%d:", utf8.length);
    appendBinaryStringInfo(material, utf8.data, utf8.length);
    release(utf8);
}

}  // namespace

text* step_key(const KeyId& id, const text* step) {
    StringInfoData material;
    initStringInfo(&material);
    append_part(&material, id.scope);
    append_part(&material, id.key);
    append_part(&material, step);
    uint8 digest[PG_SHA256_DIGEST_LENGTH];
    pg_cryptohash_ctx* ctx = pg_cryptohash_create(PG_SHA256);
    const bool hashed =
        pg_cryptohash_init(ctx) == 0 &&
        pg_cryptohash_update(ctx, reinterpret_cast<const uint8*>(material.data), material.len) == 0 &&
        pg_cryptohash_final(ctx, digest, sizeof digest) == 0;
    pg_cryptohash_free(ctx);
    pfree(material.data);
    if (!hashed) elog(ERROR, "idempotency: could not compute the step's key");

    StringInfoData derived;
    initStringInfo(&derived);
    appendBinaryStringInfo(&derived, VARDATA_ANY(step), static_cast<int>(VARSIZE_ANY_EXHDR(step)));
    appendStringInfoChar(&derived, '-');
    static const char kHex[] = "0123456789abcdef";
    for (int i = 0; i < kDigestBytesShown; ++i) {
        appendStringInfoChar(&derived, kHex[digest[i] >> 4]);
        appendStringInfoChar(&derived, kHex[digest[i] & 0xf]);
    }
    text* result = cstring_to_text_with_len(derived.data, derived.len);
    pfree(derived.data);
    return result;
}

}  // namespace idem::pg
