#include "pg/access/subscription_target.hpp"

#include "pg/access/extension_objects.hpp"

extern "C" {
#include "access/htup_details.h"
#include "catalog/pg_subscription.h"
#include "catalog/pg_subscription_rel.h"
#include "utils/catcache.h"
#include "utils/syscache.h"
}

namespace idem::pg {

namespace {

// A subscription that has `table` among its tables (pg_subscription_rel, by
// its index on (srrelid, srsubid)), or InvalidOid.
Oid subscription_of(Oid table) {
    CatCList* rows = SearchSysCacheList1(SUBSCRIPTIONRELMAP, ObjectIdGetDatum(table));
    Oid subscription = InvalidOid;
    if (rows->n_members > 0)
        subscription = reinterpret_cast<Form_pg_subscription_rel>(
                           GETSTRUCT(&rows->members[0]->tuple))
                           ->srsubid;
    ReleaseSysCacheList(rows);
    return subscription;
}

}  // namespace

const char* feeding_subscription() {
    const ExtensionObjects* objects = find_extension_objects();
    if (objects == nullptr) return nullptr;
    const Oid tables[] = {objects->keys, objects->tombstones, objects->outbox, objects->inbox,
                          objects->locks};
    for (Oid table : tables) {
        if (!OidIsValid(table)) continue;
        const Oid subscription = subscription_of(table);
        if (!OidIsValid(subscription)) continue;
        const char* name = get_subscription_name(subscription, true);
        return name != nullptr ? name : "(dropped meanwhile)";
    }
    return nullptr;
}

}  // namespace idem::pg
