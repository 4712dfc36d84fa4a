#include "pg/keys/outcome.hpp"

#include "pg/access/status_enum.hpp"
#include "pg/boundary/call_result.hpp"

namespace idem::pg {

namespace {

enum Column {
    kOutcome, kStatus, kToken, kAttempt, kResult, kError, kRetryAfter, kJobRef,
    kResultExpired, kSteps,  // from 0.7.0
    kColumns
};

Datum interval_datum(Micros value) {
    Interval* interval = static_cast<Interval*>(palloc(sizeof(Interval)));
    interval->time = value;
    interval->day = 0;
    interval->month = 0;
    return IntervalPGetDatum(interval);
}

}  // namespace

Datum outcome_datum(FunctionCallInfo fcinfo, const OutcomeFields& fields) {
    const TupleDesc desc = call_result_desc(fcinfo);
    if (desc->natts < kResultExpired || desc->natts > kColumns)
        elog(ERROR, "idempotency: function must return idem_outcome");

    Datum values[kColumns];
    bool nulls[kColumns] = {};
    values[kOutcome] = CStringGetTextDatum(outcome_label(fields.outcome));
    values[kStatus] = fields.has_status
                          ? status_datum(TupleDescAttr(desc, kStatus)->atttypid, fields.status)
                          : 0;
    nulls[kStatus] = !fields.has_status;
    values[kToken] = fields.token ? Int64GetDatum(*fields.token) : 0;
    nulls[kToken] = !fields.token;
    values[kAttempt] = Int32GetDatum(fields.attempt);
    nulls[kAttempt] = !fields.has_attempt;
    values[kResult] = fields.result;
    nulls[kResult] = !fields.has_result;
    values[kError] = fields.error;
    nulls[kError] = !fields.has_error;
    values[kRetryAfter] = fields.retry_after ? interval_datum(*fields.retry_after) : 0;
    nulls[kRetryAfter] = !fields.retry_after;
    values[kJobRef] = fields.job_ref;
    nulls[kJobRef] = !fields.has_job_ref;
    values[kResultExpired] = BoolGetDatum(fields.result_expired);
    values[kSteps] = fields.steps;
    nulls[kSteps] = !fields.has_steps;
    return HeapTupleGetDatum(heap_form_tuple(desc, values, nulls));
}

}  // namespace idem::pg
