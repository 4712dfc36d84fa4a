// SQL functions run as their owner, with the search path pinned to
// pg_catalog, while they work on the extension's tables: a role allowed to
// call them needs no privilege on the tables, and nothing on the caller's
// search path (an operator, a type, a temporary table) can stand in for an
// object the statements name. This is what SECURITY DEFINER with SET
// search_path does, without its cost on every call (that GUC is saved,
// parsed and restored each time, and the plans' search path re-checked),
// and with its rules: code that runs inside (a trigger the owner added)
// cannot change the role, and the deferred triggers a call's writes queue
// fire at the commit, as for a SECURITY DEFINER function's statements.
//
// The background workers are sessions of their own: they work as the owner
// in a security-restricted operation, as autovacuum works as a table's
// owner, so that nothing the owner's code queues can run after the switch
// back, as the worker's superuser.
#pragma once

#include <type_traits>

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

// Trivially destructible: an error may leave the scope without
// leave_owner_scope(). The transaction or subtransaction abort then restores
// the user and pops the search path, as it does for SECURITY DEFINER.
struct OwnerScope {
    Oid saved_user;
    int saved_context;
    int guc_level;       // PostgreSQL 17+: the GUC nest level of the pinned path
    Oid saved_caller;    // the calling role of an enclosing scope
};
static_assert(std::is_trivially_destructible_v<OwnerScope>);

OwnerScope enter_owner_scope(FunctionCallInfo fcinfo);
// The same for work done on a function's behalf after it returned (at
// commit), as `owner`; `restricted`: in a security-restricted operation (a
// background worker's).
OwnerScope enter_owner_scope_of(Oid owner, bool restricted = false);
void leave_owner_scope(const OwnerScope& scope);

// The role that called the function running now, as it was before the
// switch to the owner (what a relay's rights are checked against).
Oid calling_role();

}  // namespace idem::pg
