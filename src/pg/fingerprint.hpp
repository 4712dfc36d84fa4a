// The request fingerprint: SHA-256 of a jsonb value's canonical text
// (jsonb's own output, whose key order and spacing are fixed).
#pragma once

#include "pg/postgres.hpp"

namespace idem::pg {

// A bytea datum holding the 32-byte digest of `request` (a jsonb datum).
Datum fingerprint_of(Datum request);
// Whether two fingerprint (bytea) datums differ.
bool fingerprints_differ(Datum a, Datum b);

}  // namespace idem::pg
