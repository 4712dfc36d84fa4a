#include "pg/keys/fingerprint.hpp"

#include <cstring>

extern "C" {
#include "lib/stringinfo.h"
#include "utils/json.h"
#include "utils/numeric.h"
}

namespace idem::pg {

namespace {

void append_scalar(StringInfo out, const JsonbValue& value) {
    switch (value.type) {
        case jbvNull: appendStringInfoString(out, "null"); break;
        case jbvBool: appendStringInfoString(out, value.val.boolean ? "true" : "false"); break;
        case jbvNumeric: appendStringInfoString(out, numeric_normalize(value.val.numeric)); break;
        case jbvString: {
            char* string = pnstrdup(value.val.string.val, value.val.string.len);
            escape_json(out, string);
            pfree(string);
            break;
        }
        default: elog(ERROR, "idempotency: unexpected jsonb value in a request");
    }
}

// jsonb's own text layout ("{"a": 1, "b": [1, 2]}"), numbers normalized.
char* canonical_text(Jsonb* jsonb) {
    StringInfoData out;
    initStringInfo(&out);
    JsonbIterator* it = JsonbIteratorInit(&jsonb->root);
    JsonbValue value;
    JsonbIteratorToken token;
    bool first = true;  // no ", " before the first member of a container
    bool raw_scalar = false;
    while ((token = JsonbIteratorNext(&it, &value, false)) != WJB_DONE) {
        switch (token) {
            case WJB_BEGIN_ARRAY:
                if (!first) appendStringInfoString(&out, ", ");
                raw_scalar = value.val.array.rawScalar;
                if (!raw_scalar) appendStringInfoChar(&out, '[');
                first = true;
                break;
            case WJB_BEGIN_OBJECT:
                if (!first) appendStringInfoString(&out, ", ");
                appendStringInfoChar(&out, '{');
                first = true;
                break;
            case WJB_KEY:
                if (!first) appendStringInfoString(&out, ", ");
                append_scalar(&out, value);
                appendStringInfoString(&out, ": ");
                first = true;  // the value follows the key without a comma
                break;
            case WJB_VALUE:
            case WJB_ELEM:
                if (!first) appendStringInfoString(&out, ", ");
                append_scalar(&out, value);
                first = false;
                break;
            case WJB_END_ARRAY:
                if (!raw_scalar) appendStringInfoChar(&out, ']');
                raw_scalar = false;
                first = false;
                break;
            case WJB_END_OBJECT:
                appendStringInfoChar(&out, '}');
                first = false;
                break;
            default: break;
        }
    }
    return out.data;
}

Datum sha256_of(const char* text) {
    bytea* digest = static_cast<bytea*>(palloc(VARHDRSZ + PG_SHA256_DIGEST_LENGTH));
    SET_VARSIZE(digest, VARHDRSZ + PG_SHA256_DIGEST_LENGTH);
    pg_cryptohash_ctx* ctx = pg_cryptohash_create(PG_SHA256);
    if (pg_cryptohash_init(ctx) < 0 ||
        pg_cryptohash_update(ctx, reinterpret_cast<const uint8*>(text), strlen(text)) < 0 ||
        pg_cryptohash_final(ctx, reinterpret_cast<uint8*>(VARDATA(digest)),
                            PG_SHA256_DIGEST_LENGTH) < 0) {
        pg_cryptohash_free(ctx);
        elog(ERROR, "idempotency: could not compute the request fingerprint");
    }
    pg_cryptohash_free(ctx);
    return PointerGetDatum(digest);
}

bool differ(Datum a, Datum b) {
    bytea* left = DatumGetByteaPP(a);
    bytea* right = DatumGetByteaPP(b);
    const std::size_t size = VARSIZE_ANY_EXHDR(left);
    return size != VARSIZE_ANY_EXHDR(right) ||
           std::memcmp(VARDATA_ANY(left), VARDATA_ANY(right), size) != 0;
}

}  // namespace

Datum fingerprint_of(Datum request) {
    char* canonical = canonical_text(DatumGetJsonbP(request));
    const Datum digest = sha256_of(canonical);
    pfree(canonical);
    return digest;
}

bool fingerprint_differs(Datum stored, Datum fingerprint, Datum request) {
    if (!differ(stored, fingerprint)) return false;
    Jsonb* jsonb = DatumGetJsonbP(request);
    char* as_written = JsonbToCString(nullptr, &jsonb->root, VARSIZE(jsonb));
    const bool differs = differ(stored, sha256_of(as_written));
    pfree(as_written);
    return differs;
}

std::int32_t fingerprint_prefix(Datum fingerprint) {
    const bytea* digest = DatumGetByteaPP(fingerprint);
    const unsigned char* bytes = reinterpret_cast<const unsigned char*>(VARDATA_ANY(digest));
    const std::size_t size = VARSIZE_ANY_EXHDR(digest);
    std::uint32_t prefix = 0;
    for (std::size_t i = 0; i < 4; ++i) prefix = (prefix << 8) | (i < size ? bytes[i] : 0);
    return static_cast<std::int32_t>(prefix);
}

bool fingerprint_prefix_differs(std::int32_t stored, Datum fingerprint, Datum request) {
    if (fingerprint_prefix(fingerprint) == stored) return false;
    Jsonb* jsonb = DatumGetJsonbP(request);
    char* as_written = JsonbToCString(nullptr, &jsonb->root, VARSIZE(jsonb));
    const bool differs = fingerprint_prefix(sha256_of(as_written)) != stored;
    pfree(as_written);
    return differs;
}

}  // namespace idem::pg
