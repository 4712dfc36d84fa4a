#include "pg/boundary/arrays.hpp"

extern "C" {
#include "utils/array.h"
}

namespace idem::pg {

namespace {

Datum fixed_array(const Datum* values, int count, Oid type) {
    return PointerGetDatum(
        construct_array(const_cast<Datum*>(values), count, type, 8, true, TYPALIGN_DOUBLE));
}

}  // namespace

Datum int4_array(const Datum* values, int count) {
    return PointerGetDatum(
        construct_array(const_cast<Datum*>(values), count, INT4OID, 4, true, TYPALIGN_INT));
}

Datum int8_array(const Datum* values, int count) { return fixed_array(values, count, INT8OID); }

Datum timestamptz_array(const Datum* values, int count) {
    return fixed_array(values, count, TIMESTAMPTZOID);
}

Datum text_array(const Datum* values, int count) {
    return PointerGetDatum(
        construct_array(const_cast<Datum*>(values), count, TEXTOID, -1, false, TYPALIGN_INT));
}

int int8_elements(Datum array, Datum** values) {
    int count = 0;
    deconstruct_array(DatumGetArrayTypeP(array), INT8OID, 8, true, TYPALIGN_DOUBLE, values,
                      nullptr, &count);
    return count;
}

}  // namespace idem::pg
