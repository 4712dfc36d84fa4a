// Conversion between the core's Status and the idem_status enum values of
// the installed extension. The label OIDs are cached per backend and looked
// up again when the enum type changes (DROP and CREATE EXTENSION).
#pragma once

#include "core/status.hpp"
#include "pg/boundary/postgres.hpp"

namespace idem::pg {

Datum status_datum(Oid enum_type, Status status);
Status status_from_datum(Oid enum_type, Datum value);

}  // namespace idem::pg
