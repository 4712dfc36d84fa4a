#include "pg/keys/steps_value.hpp"

extern "C" {
#include "utils/fmgrprotos.h"
#include "utils/numeric.h"
}

namespace idem::pg {

namespace {

void push_key(JsonbParseState** state, const char* name, int bytes) {
    JsonbValue key;
    key.type = jbvString;
    key.val.string.val = const_cast<char*>(name);
    key.val.string.len = bytes;
    pushJsonbValue(state, WJB_KEY, &key);
}

void push_int(JsonbParseState** state, const char* name, std::int32_t value) {
    push_key(state, name, static_cast<int>(strlen(name)));
    JsonbValue number;
    number.type = jbvNumeric;
    number.val.numeric = int64_to_numeric(value);
    pushJsonbValue(state, WJB_VALUE, &number);
}

}  // namespace

int steps_count(Datum steps) { return static_cast<int>(JB_ROOT_COUNT(DatumGetJsonbP(steps))); }

bool step_recorded(Datum steps, const text* name) {
    Jsonb* object = DatumGetJsonbP(steps);
    JsonbValue found;
    return getKeyJsonValueFromContainer(&object->root, VARDATA_ANY(name),
                                        static_cast<int>(VARSIZE_ANY_EXHDR(name)),
                                        &found) != nullptr;
}

Datum steps_with(Datum steps, const text* name, std::int32_t n, std::int32_t attempt,
                 Datum result) {
    JsonbParseState* state = nullptr;
    pushJsonbValue(&state, WJB_BEGIN_OBJECT, nullptr);
    push_key(&state, VARDATA_ANY(name), static_cast<int>(VARSIZE_ANY_EXHDR(name)));
    pushJsonbValue(&state, WJB_BEGIN_OBJECT, nullptr);
    push_int(&state, "n", n);
    push_int(&state, "attempt", attempt);
    push_key(&state, "result", 6);
    JsonbValue value;
    if (result == 0) {
        value.type = jbvNull;
    } else {
        // A container pushed as a value is copied in, scalars included.
        Jsonb* given = DatumGetJsonbP(result);
        value.type = jbvBinary;
        value.val.binary.data = &given->root;
        value.val.binary.len = static_cast<int>(VARSIZE(given) - VARHDRSZ);
    }
    pushJsonbValue(&state, WJB_VALUE, &value);
    pushJsonbValue(&state, WJB_END_OBJECT, nullptr);
    JsonbValue* step = pushJsonbValue(&state, WJB_END_OBJECT, nullptr);
    const Datum added = JsonbPGetDatum(JsonbValueToJsonb(step));
    if (steps == 0) return added;
    // The names differ (the caller checked): the new member is added.
    return DirectFunctionCall2(jsonb_concat, steps, added);
}

}  // namespace idem::pg
