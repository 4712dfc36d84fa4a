#include "pg/keys/fingerprint.hpp"

#include <cstring>

#include "pg/keys/digest_bytes.hpp"

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

Datum sha256_of(const char* data, std::size_t length) {
    bytea* digest = static_cast<bytea*>(palloc(VARHDRSZ + PG_SHA256_DIGEST_LENGTH));
    SET_VARSIZE(digest, VARHDRSZ + PG_SHA256_DIGEST_LENGTH);
    pg_cryptohash_ctx* ctx = pg_cryptohash_create(PG_SHA256);
    if (pg_cryptohash_init(ctx) < 0 ||
        pg_cryptohash_update(ctx, reinterpret_cast<const uint8*>(data), length) < 0 ||
        pg_cryptohash_final(ctx, reinterpret_cast<uint8*>(VARDATA(digest)),
                            PG_SHA256_DIGEST_LENGTH) < 0) {
        pg_cryptohash_free(ctx);
        elog(ERROR, "idempotency: could not compute the request fingerprint");
    }
    pg_cryptohash_free(ctx);
    return PointerGetDatum(digest);
}

// The digest of a text's UTF-8 bytes (pg/keys/digest_bytes.hpp).
Datum utf8_sha256(const char* text) {
    const DigestBytes utf8 = digest_bytes(text, static_cast<int>(strlen(text)));
    const Datum digest = sha256_of(utf8.data, static_cast<std::size_t>(utf8.length));
    release(utf8);
    return digest;
}

// Whether `matches` accepts the digest of a form an earlier version stored
// for `request`: its text as written (before 0.4.0), and in a database
// whose encoding is neither UTF-8 nor SQL_ASCII its canonical text in that
// encoding (before 0.7.0).
template <typename Matches>
bool earlier_form_matches(Datum request, Matches matches) {
    Jsonb* jsonb = DatumGetJsonbP(request);
    char* as_written = JsonbToCString(nullptr, &jsonb->root, VARSIZE(jsonb));
    bool found = matches(sha256_of(as_written, strlen(as_written)));
    pfree(as_written);
    if (!found && !digests_native_bytes()) {
        char* canonical = canonical_text(jsonb);
        found = matches(sha256_of(canonical, strlen(canonical)));
        pfree(canonical);
    }
    return found;
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
    const Datum digest = utf8_sha256(canonical);
    pfree(canonical);
    return digest;
}

bool fingerprint_differs(Datum stored, Datum fingerprint, Datum request) {
    if (!differ(stored, fingerprint)) return false;
    return !earlier_form_matches(request, [&](Datum digest) { return !differ(stored, digest); });
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
    return !earlier_form_matches(request,
                                 [&](Datum digest) { return fingerprint_prefix(digest) == stored; });
}

}  // namespace idem::pg
