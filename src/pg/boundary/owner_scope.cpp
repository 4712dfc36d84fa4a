#include "pg/boundary/owner_scope.hpp"

extern "C" {
#include "catalog/namespace.h"
#include "catalog/pg_proc.h"
#include "utils/inval.h"
}

namespace idem::pg {

namespace {

// Owners of the functions this backend called, by function oid. Emptied
// when pg_proc changes (ALTER FUNCTION ... OWNER TO, REASSIGN OWNED).
struct OwnerEntry {
    Oid function;
    Oid owner;
};
constexpr int kOwnerCacheSize = 32;
OwnerEntry owner_cache[kOwnerCacheSize];
int owner_cache_used = 0;
bool owner_cache_callback_installed = false;

void forget_owners(Datum, int, uint32) { owner_cache_used = 0; }

Oid function_owner(Oid function) {
    for (int i = 0; i < owner_cache_used; ++i)
        if (owner_cache[i].function == function) return owner_cache[i].owner;
    if (!owner_cache_callback_installed) {
        CacheRegisterSyscacheCallback(PROCOID, forget_owners, 0);
        owner_cache_callback_installed = true;
    }
    HeapTuple tuple = SearchSysCache1(PROCOID, ObjectIdGetDatum(function));
    if (!HeapTupleIsValid(tuple)) elog(ERROR, "idempotency: cache lookup failed for function %u", function);
    const Oid owner = reinterpret_cast<Form_pg_proc>(GETSTRUCT(tuple))->proowner;
    ReleaseSysCache(tuple);
    if (owner_cache_used == kOwnerCacheSize) owner_cache_used = 0;
    owner_cache[owner_cache_used++] = {function, owner};
    return owner;
}

// The role that called the running function (see calling_role).
Oid current_caller = InvalidOid;

#if PG_VERSION_NUM < 170000
// pg_catalog alone; no temporary schema, so no temporary relation or type.
OverrideSearchPath catalog_only_path = {NIL, true, false, 0};
#endif

}  // namespace

OwnerScope enter_owner_scope(FunctionCallInfo fcinfo) {
    return enter_owner_scope_of(function_owner(fcinfo->flinfo->fn_oid));
}

OwnerScope enter_owner_scope_of(Oid owner, bool restricted) {
    OwnerScope scope{};
    GetUserIdAndSecContext(&scope.saved_user, &scope.saved_context);
    scope.saved_caller = current_caller;
    current_caller = scope.saved_user;
    SetUserIdAndSecContext(owner, scope.saved_context | SECURITY_LOCAL_USERID_CHANGE |
                                      (restricted ? SECURITY_RESTRICTED_OPERATION : 0));
#if PG_VERSION_NUM < 170000
    PushOverrideSearchPath(&catalog_only_path);
#else
    scope.guc_level = NewGUCNestLevel();
    set_config_option("search_path", "pg_catalog, pg_temp", PGC_USERSET, PGC_S_SESSION,
                      GUC_ACTION_SAVE, true, 0, false);
#endif
    return scope;
}

void leave_owner_scope(const OwnerScope& scope) {
#if PG_VERSION_NUM < 170000
    PopOverrideSearchPath();
#else
    AtEOXact_GUC(true, scope.guc_level);
#endif
    SetUserIdAndSecContext(scope.saved_user, scope.saved_context);
    current_caller = scope.saved_caller;
}

Oid calling_role() { return OidIsValid(current_caller) ? current_caller : GetUserId(); }

}  // namespace idem::pg
