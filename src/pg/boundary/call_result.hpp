// The row a call of a function returning a composite type answers with,
// when ALTER EXTENSION UPDATE commits while the calling statement waits.
//
// A statement planned before the update expects the row type it was planned
// with; the update may since have added attributes (always last) to that
// type, or dropped the function and made it again with more arguments. The
// executor then checks the returned row against the planned one, and the
// function's pg_proc row may be gone: both failed the statement
// (42804 "query expects 8 attributes", XX000 "cache lookup failed").
#pragma once

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

// The descriptor to form this call's row with: the declared type as it is
// now, read from the call's expression (not from pg_proc); or, when the
// statement was planned with fewer attributes, those, as an anonymous
// record type, so that the executor's check passes. Made at the first call
// of a call site and kept in its FmgrInfo (fn_extra).
TupleDesc call_result_desc(FunctionCallInfo fcinfo);

// `row` (a composite Datum of the type as it is now) as the row `desc`
// describes: itself when they agree, else its first attributes.
Datum row_as_planned(Datum row, TupleDesc desc);

}  // namespace idem::pg
