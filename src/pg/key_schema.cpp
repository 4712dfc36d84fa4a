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
bool callback_installed = false;

void forget_layout(Datum, Oid) { keys_purge_at = Known::Unknown; }

}  // namespace

bool extension_has(const char* table, const char* column) {
    const Oid schema = get_namespace_oid("idempotency", true);
    if (!OidIsValid(schema)) return false;
    const Oid relation = get_relname_relid(table, schema);
    if (!OidIsValid(relation)) return false;
    return column == nullptr || get_attnum(relation, column) != InvalidAttrNumber;
}

bool keys_have_purge_at() {
    if (keys_purge_at == Known::Unknown) {
        if (!callback_installed) {
            CacheRegisterRelcacheCallback(forget_layout, 0);
            callback_installed = true;
        }
        keys_purge_at = extension_has("idempotency_keys", "purge_at") ? Known::Yes : Known::No;
    }
    return keys_purge_at == Known::Yes;
}

}  // namespace idem::pg
