// The request fingerprint: SHA-256 of a jsonb value's canonical text. The
// text is jsonb's own output (its key order and spacing are fixed) with
// every number in its shortest form, so that requests equal as jsonb (1500
// and 1500.0) have one fingerprint.
#pragma once

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

// A bytea datum holding the 32-byte digest of `request` (a jsonb datum).
Datum fingerprint_of(Datum request);

// Whether a stored fingerprint belongs to another request than `request`
// (a jsonb datum) with fingerprint `fingerprint`. A fingerprint stored by a
// version before 0.4.0 hashed jsonb's output as it is, numbers as written:
// one that matches that form is the same request.
bool fingerprint_differs(Datum stored, Datum fingerprint, Datum request);

}  // namespace idem::pg
