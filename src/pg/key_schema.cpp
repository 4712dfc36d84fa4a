#include "pg/key_schema.hpp"

#include "pg/postgres.hpp"

extern "C" {
#include "catalog/namespace.h"
#include "utils/inval.h"
}

namespace idem::pg {

namespace {

enum class Known { No, Yes, Unknown };
Known keys_purge_at = Known::Unknown;
Oid keys_table = InvalidOid;  // the table the answer is about
bool callback_installed = false;

void forget_layout(Datum, Oid relation) {
    if (relation == InvalidOid || relation == keys_table) keys_purge_at = Known::Unknown;
}

Oid extension_table(const char* table) {
    const Oid schema = get_namespace_oid("idempotency", true);
    return OidIsValid(schema) ? get_relname_relid(table, schema) : InvalidOid;
}

}  // namespace

bool extension_has(const char* table, const char* column) {
    const Oid relation = extension_table(table);
    if (!OidIsValid(relation)) return false;
    return column == nullptr || get_attnum(relation, column) != InvalidAttrNumber;
}

bool keys_have_purge_at() {
    if (keys_purge_at == Known::Unknown) {
        if (!callback_installed) {
            CacheRegisterRelcacheCallback(forget_layout, 0);
            callback_installed = true;
        }
        keys_table = extension_table("idempotency_keys");
        if (!OidIsValid(keys_table)) return false;  // no table: nothing to cache
        keys_purge_at =
            get_attnum(keys_table, "purge_at") != InvalidAttrNumber ? Known::Yes : Known::No;
    }
    return keys_purge_at == Known::Yes;
}

}  // namespace idem::pg
