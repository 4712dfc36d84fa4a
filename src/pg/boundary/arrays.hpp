// One-dimensional arrays of built-in element types, built from Datums or
// taken apart, without repeating each type's length, by-value flag and
// alignment at every call.
#pragma once

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

Datum int8_array(const Datum* values, int count);

// The elements of a bigint[] known to hold no NULL; returns their count.
int int8_elements(Datum array, Datum** values);

}  // namespace idem::pg
