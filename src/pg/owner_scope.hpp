// SQL functions run as their owner, with the search path pinned to
// pg_catalog, while they work on the extension's tables: a role allowed to
// call them needs no privilege on the tables, and nothing on the caller's
// search path (an operator, a type, a temporary table) can stand in for an
// object the statements name. This is what SECURITY DEFINER with
// SET search_path does, without its cost on every call (that GUC is saved,
// parsed and restored each time, and the plans' search path re-checked).
#pragma once

#include "pg/postgres.hpp"

namespace idem::pg {

// Trivially destructible: an error may leave the scope without
// leave_owner_scope(). The transaction or subtransaction abort then restores
// the user and pops the search path, as it does for SECURITY DEFINER.
struct OwnerScope {
    Oid saved_user;
    int saved_context;
    int guc_level;  // PostgreSQL 17+: the GUC nest level of the pinned path
};

OwnerScope enter_owner_scope(FunctionCallInfo fcinfo);
// The same for work done on a function's behalf after it returned (at
// commit), as `owner`.
OwnerScope enter_owner_scope_of(Oid owner);
void leave_owner_scope(const OwnerScope& scope);

}  // namespace idem::pg
