#include "pg/keys/digest_bytes.hpp"

extern "C" {
#include "mb/pg_wchar.h"
}

namespace idem::pg {

bool digests_native_bytes() {
    const int encoding = GetDatabaseEncoding();
    return encoding == PG_UTF8 || encoding == PG_SQL_ASCII;
}

DigestBytes digest_bytes(const char* bytes, int length) {
    if (digests_native_bytes()) return {bytes, length, false};
    const char* utf8 = pg_server_to_any(bytes, length, PG_UTF8);
    if (utf8 == bytes) return {bytes, length, false};
    return {utf8, static_cast<int>(strlen(utf8)), true};
}

void release(const DigestBytes& bytes) {
    if (bytes.converted) pfree(const_cast<char*>(bytes.data));
}

}  // namespace idem::pg
