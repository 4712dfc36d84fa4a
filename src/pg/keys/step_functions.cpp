// SQL entry points of multi-step work: idem_step, the record of a finished
// step by the key's holder, fenced by its token as idem_complete is and
// written in the caller's transaction (so the step's own writes and its
// record commit together or not at all); idem_step_key, the key derived
// for a step's external call. Where the steps live: pg/keys/steps_value.hpp.
#include "core/error.hpp"
#include "core/steps.hpp"
#include "pg/boundary/args.hpp"
#include "pg/boundary/guard.hpp"
#include "pg/boundary/settings.hpp"
#include "pg/keys/holder_fence.hpp"
#include "pg/keys/key_store.hpp"
#include "pg/keys/step_key.hpp"
#include "pg/keys/steps_value.hpp"
#include "pg/keys/transition_log.hpp"

namespace idem::pg {

namespace {

text* step_arg(FunctionCallInfo fcinfo, int n) {
    if (PG_ARGISNULL(n)) throw_null_argument("step");
    text* step = PG_GETARG_TEXT_PP(n);
    check_step_name(VARDATA_ANY(step), VARSIZE_ANY_EXHDR(step));
    return step;
}

[[noreturn]] void raise_step_refused(StepVerdict verdict, const KeyId& id, const text* step,
                                     int recorded) {
    const char* key = text_to_cstring(id.key);
    const char* scope = text_to_cstring(id.scope);
    if (verdict == StepVerdict::Duplicate)
        throw_error(step_sqlstate(verdict),
                    "step \"%s\" of key \"%s\" in scope \"%s\" is already recorded",
                    text_to_cstring(step), key, scope);
    throw_error(step_sqlstate(verdict),
                "key \"%s\" in scope \"%s\" already holds %d steps, as many as "
                "idempotency.max_steps allows",
                key, scope, recorded);
}

Datum step_body(FunctionCallInfo fcinfo) {
    const KeyId id = key_id_arg(fcinfo, 0, 4);
    const std::int64_t token = token_arg(fcinfo, 1);
    const text* step = step_arg(fcinfo, 2);
    // A NULL result is a result: recorded as JSON null.
    const Datum result = PG_ARGISNULL(3) ? 0 : JsonbPGetDatum(PG_GETARG_JSONB_P(3));
    if (result != 0)
        check_step_result_size(text_to_cstring(step), VARSIZE(DatumGetJsonbP(result)) - VARHDRSZ,
                               static_cast<std::size_t>(settings::max_step_bytes));

    StoredKey stored;
    KeyRow row;
    find_as_holder(HolderCall::Step, id, token, false, &stored, &row);
    std::int32_t n = 0;
    for (;;) {
        // Decided again on the newest version after a concurrent change: a
        // step of the same name, or the last one allowed, may have come first.
        const bool has_steps = stored.state.has_steps;
        const int recorded = has_steps ? steps_count(stored.steps) : 0;
        const bool duplicate = has_steps && step_recorded(stored.steps, step);
        const StepVerdict verdict = decide_step(recorded, duplicate, settings::max_steps);
        if (verdict != StepVerdict::Record) {
            close_key(&row);
            raise_step_refused(verdict, id, step, recorded);
        }
        n = recorded + 1;
        const Datum steps =
            steps_with(has_steps ? stored.steps : 0, step, n, stored.state.attempts, result);
        const Change change = record_steps(&row, steps);
        if (change == Change::Done) break;
        after_change(change, HolderCall::Step, id, token, &stored, &row);
    }
    close_key(&row);
    log_step(id, stored.state.status, step, n, token, stored.state.attempts);
    PG_RETURN_INT32(n);
}

Datum step_key_body(FunctionCallInfo fcinfo) {
    const KeyId id = key_id_arg(fcinfo, 0, 2);
    const text* step = step_arg(fcinfo, 1);
    PG_RETURN_TEXT_P(step_key(id, step));
}

}  // namespace

}  // namespace idem::pg

IDEM_SQL_FUNCTION(idem_step, idem::pg::step_body)
IDEM_SQL_FUNCTION_AS_CALLER(idem_step_key, idem::pg::step_key_body)
