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
    if (digests_native_bytes()) return {bytes, length};
    const char* utf8 = pg_server_to_any(bytes, length, PG_UTF8);
    return {utf8, utf8 == bytes ? length : static_cast<int>(strlen(utf8))};
}

}  // namespace idem::pg
