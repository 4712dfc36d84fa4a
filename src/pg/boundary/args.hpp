// Where SQL arguments are read and checked against the documented limits.
// Each reader raises (through idem::Error) 22004 for a NULL that is not
// allowed, 22023 for an empty name or an interval out of range, and 22001
// for a value that is too long.
#pragma once

#include <cstdint>
#include <optional>

#include "core/validate.hpp"
#include "pg/boundary/postgres.hpp"

namespace idem::pg {

// A required name (key, resource, source, ...): not NULL, not empty, at most max_bytes.
text* name_arg(FunctionCallInfo fcinfo, int n, const char* name,
               std::size_t max_bytes = kMaxNameBytes);
// The scope argument: a required name of at most 63 bytes.
text* scope_arg(FunctionCallInfo fcinfo, int n);
// An optional name (owner, job_ref): NULL gives nullptr; may be empty; bounded.
text* optional_name_arg(FunctionCallInfo fcinfo, int n, const char* name);
// A required token.
std::int64_t token_arg(FunctionCallInfo fcinfo, int n);
// A required text value bounded by idempotency.max_value_bytes (an error message).
text* value_text_arg(FunctionCallInfo fcinfo, int n, const char* name);
// An optional jsonb bounded by idempotency.max_value_bytes; NULL gives 0.
Datum optional_jsonb_arg(FunctionCallInfo fcinfo, int n, const char* name);
// lease, extend, ttl: NULL gives idempotency.default_lease; positive, at most max_lease.
Micros lease_arg(FunctionCallInfo fcinfo, int n, const char* name);
// wait: NULL gives nothing; otherwise positive, at most max_lease.
std::optional<Micros> wait_arg(FunctionCallInfo fcinfo, int n);
// retain, retry_in: NULL gives nothing; otherwise 0 .. 100 years.
std::optional<Micros> span_arg(FunctionCallInfo fcinfo, int n, const char* name);
// The same for an argument a later version added: nullopt when the
// installed function has not got it (a database not yet updated).
std::optional<Micros> optional_span_arg(FunctionCallInfo fcinfo, int n, const char* name);

// The bytes of a text, and a C string copy of it for messages.
inline std::size_t text_bytes(const text* value) { return VARSIZE_ANY_EXHDR(value); }

}  // namespace idem::pg
