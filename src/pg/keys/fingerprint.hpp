// The request fingerprint: SHA-256 of a jsonb value's canonical text, as
// UTF-8 bytes (pg/keys/digest_bytes.hpp). The text is jsonb's own output
// (its key order and spacing are fixed) with every number in its shortest
// form, so that requests equal as jsonb (1500 and 1500.0) have one
// fingerprint; UTF-8, so that a dump restored into a database of another
// encoding keeps its fingerprints.
#pragma once

#include <cstdint>

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

// A bytea datum holding the 32-byte digest of `request` (a jsonb datum).
Datum fingerprint_of(Datum request);

// Whether a stored fingerprint belongs to another request than `request`
// (a jsonb datum) with fingerprint `fingerprint`. A fingerprint stored by a
// version before 0.4.0 hashed jsonb's output as it is, numbers as written,
// and one stored before 0.7.0 the text in the database's encoding: one that
// matches such a form is the same request.
bool fingerprint_differs(Datum stored, Datum fingerprint, Datum request);

// A tombstone keeps the first 4 bytes of its key's fingerprint, read as a
// big-endian signed integer. A request whose fingerprint has other first
// bytes is another request; one with the same ones is taken for the same
// (another request matches by chance once in 2^32: it is then answered as a
// duplicate of finished work instead of a mismatch, and still never runs).
std::int32_t fingerprint_prefix(Datum fingerprint);
// Whether `request` (with fingerprint `fingerprint`) is another request than
// the one whose prefix a tombstone kept, in either form fingerprint_differs
// accepts.
bool fingerprint_prefix_differs(std::int32_t stored, Datum fingerprint, Datum request);

}  // namespace idem::pg
