#include "pg/boundary/arrays.hpp"

extern "C" {
#include "utils/array.h"
}

namespace idem::pg {

Datum int8_array(const Datum* values, int count) {
    return PointerGetDatum(
        construct_array(const_cast<Datum*>(values), count, INT8OID, 8, true, TYPALIGN_DOUBLE));
}

int int8_elements(Datum array, Datum** values) {
    int count = 0;
    deconstruct_array(DatumGetArrayTypeP(array), INT8OID, 8, true, TYPALIGN_DOUBLE, values,
                      nullptr, &count);
    return count;
}

}  // namespace idem::pg
