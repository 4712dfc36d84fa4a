// SQL entry points for the holder of a claim: idem_complete, idem_fail,
// idem_heartbeat, idem_release and idem_assert_owner. Each checks the token
// with the core's fencing rules (pg/keys/holder_fence.hpp) and raises
// IK001/IK002/IK003 otherwise.
#include <algorithm>

#include "core/error.hpp"
#include "core/retry.hpp"
#include "pg/access/status_enum.hpp"
#include "pg/boundary/args.hpp"
#include "pg/boundary/guard.hpp"
#include "pg/boundary/settings.hpp"
#include "pg/keys/holder_fence.hpp"
#include "pg/keys/key_store.hpp"
#include "pg/keys/outcome.hpp"
#include "pg/keys/transition_log.hpp"
#include "pg/runtime/due_table.hpp"
#include "pg/stats/durations.hpp"
#include "pg/stats/metrics.hpp"
#include "pg/waiting/wakeup.hpp"

extern "C" {
#include "common/pg_prng.h"
}

namespace idem::pg {

namespace {

Datum complete_body(FunctionCallInfo fcinfo) {
    const KeyId id = key_id_arg(fcinfo, 0, 3);
    const std::int64_t token = token_arg(fcinfo, 1);
    const Datum result = optional_jsonb_arg(fcinfo, 2, "result");
    const bool has_result = !PG_ARGISNULL(2);
    const Micros retain =
        span_arg(fcinfo, 4, "retain").value_or(settings::seconds(settings::retention_s));
    const std::optional<Micros> retain_key = optional_span_arg(fcinfo, 5, "retain_key");

    StoredKey stored;
    KeyRow row;
    FenceVerdict verdict = find_as_holder(HolderCall::Complete, id, token, false, &stored, &row);
    Micros now = 0;
    while (verdict == FenceVerdict::Proceed) {
        now = GetCurrentTimestamp();
        const Change change = complete_key(&row, stored, result, has_result, now, now + retain, retain_key);
        if (change == Change::Done) break;
        verdict = after_change(change, HolderCall::Complete, id, token, &stored, &row);
    }
    close_key(&row);
    if (verdict == FenceVerdict::AlreadyCompleted) {
        // A replay of an earlier complete: its stored outcome.
        count_answer(Counter::Replays);
    } else {
        count_on_commit(Counter::Completions);
        note_due_on_commit(DueKind::Retention, now + retain);
        note_due_on_commit(DueKind::Settle, now);
        // No lease_until: the sweep expired the lease and settled it.
        if (!stored.state.lease_until || *stored.state.lease_until < now)
            count_on_commit(Counter::LateCompletions);
        if (stored.claimed_at) {
            observe_processing_on_commit(now - *stored.claimed_at);
            note_completion(id.scope, now - *stored.claimed_at);
        }
        wake_on_commit(key_wake_channel(id));
        log_transition(id, stored.state.status, Status::Completed, token,
                       stored.state.attempts);
        stored.result = result;
        stored.has_result = has_result;
    }

    OutcomeFields out;
    out.outcome = Outcome::Completed;
    out.status = Status::Completed;
    out.token = token;
    out.attempt = stored.state.attempts;
    out.result = stored.result;
    out.has_result = stored.has_result;
    out.job_ref = stored.job_ref;
    out.has_job_ref = stored.has_job_ref;
    return outcome_datum(fcinfo, out);
}

Datum fail_body(FunctionCallInfo fcinfo) {
    const KeyId id = key_id_arg(fcinfo, 0, 5);
    const std::int64_t token = token_arg(fcinfo, 1);
    const text* error = value_text_arg(fcinfo, 2, "error");
    if (PG_ARGISNULL(3)) throw_null_argument("retryable");
    const bool retryable = PG_GETARG_BOOL(3);
    const std::optional<Micros> retry_in = span_arg(fcinfo, 4, "retry_in");
    const std::optional<Micros> retain = optional_span_arg(fcinfo, 6, "retain");
    const std::optional<Micros> retain_key = optional_span_arg(fcinfo, 7, "retain_key");
    StoredKey stored;
    KeyRow row;
    FenceVerdict verdict = find_as_holder(HolderCall::Fail, id, token, false, &stored, &row);
    FailDecision decision;
    std::optional<Micros> expires_at;
    for (;;) {
        // The attempt cap and retention its claim decided, when it recorded them.
        const RetryPolicy policy{stored.state.max_attempts.value_or(settings::max_attempts),
                                 settings::ms(settings::retry_base_delay_ms),
                                 settings::ms(settings::retry_max_delay_ms)};
        const Micros retention =
            retain.value_or(stored.retention.value_or(settings::seconds(settings::retention_s)));
        const Micros now = GetCurrentTimestamp();
        decision = decide_fail(stored.state.attempts, retryable, retry_in, policy,
                               pg_prng_double(&pg_global_prng_state));
        std::optional<Micros> next_attempt_at;
        expires_at.reset();
        if (decision.delay) next_attempt_at = now + *decision.delay;
        if (decision.next == Status::FailedFinal) expires_at = now + retention;
        const Change change =
            record_failure(&row, decision.next, error, now, next_attempt_at, expires_at,
                           decision.next == Status::FailedFinal ? retain_key : std::nullopt);
        if (change == Change::Done) break;
        verdict = after_change(change, HolderCall::Fail, id, token, &stored, &row);
    }
    (void)verdict;
    close_key(&row);
    if (expires_at) note_due_on_commit(DueKind::Retention, *expires_at);
    note_due_on_commit(DueKind::Settle, GetCurrentTimestamp());
    const bool final = decision.next == Status::FailedFinal;
    count_on_commit(final ? Counter::FailuresFinal : Counter::FailuresRetryable);
    wake_on_commit(key_wake_channel(id));
    log_transition(id, stored.state.status, decision.next, token,
                   stored.state.attempts,
                   !retryable ? "not retryable" : final ? "attempts exhausted" : "retryable");

    return status_datum(get_fn_expr_rettype(fcinfo->flinfo), decision.next);
}

// A renewal that took a tenth of its extension, and at least this, waited
// for the row. Relative, so that a renewal slowed by a busy server (tens
// of milliseconds) is not made twice: a second row version, and its WAL,
// for a lease that lost a negligible part of its length.
constexpr Micros kShortestWaitForRow = 10 * 1000;

Micros waited_for_row(Micros extend) { return std::max(kShortestWaitForRow, extend / 10); }

Datum heartbeat_body(FunctionCallInfo fcinfo) {
    const KeyId id = key_id_arg(fcinfo, 0, 3);
    const std::int64_t token = token_arg(fcinfo, 1);
    const Micros extend = lease_arg(fcinfo, 2, "extend");

    StoredKey stored;
    KeyRow row;
    find_as_holder(HolderCall::Heartbeat, id, token, false, &stored, &row);
    Micros now = 0;
    bool waited = false;
    for (;;) {
        now = GetCurrentTimestamp();
        const Change change = renew_lease(&row, now + extend);
        if (change != Change::Done) {
            after_change(change, HolderCall::Heartbeat, id, token, &stored, &row);
            continue;
        }
        // A renewal that waited for the row (a transaction the holder
        // fenced held it) is made again from the time it got it: counted
        // from before the wait, the lease could end before the call
        // returned, and the key be taken over as soon as that transaction
        // committed. Now the row is this call's, so the second does not wait.
        if (waited || GetCurrentTimestamp() - now < waited_for_row(extend)) break;
        waited = true;
        close_key(&row);
        find_as_holder(HolderCall::Heartbeat, id, token, false, &stored, &row);
    }
    close_key(&row);
    note_due_on_commit(DueKind::KeyLease, now + extend);
    PG_RETURN_TIMESTAMPTZ(now + extend);
}

Datum release_body(FunctionCallInfo fcinfo) {
    const KeyId id = key_id_arg(fcinfo, 0, 2);
    const std::int64_t token = token_arg(fcinfo, 1);

    StoredKey stored;
    KeyRow row;
    find_as_holder(HolderCall::Release, id, token, true, &stored, &row);
    const Micros now = GetCurrentTimestamp();
    const ReleaseAction action = decide_release(stored.state);
    switch (action) {
        case ReleaseAction::BackToReceived: (void)release_to(&row, stored, Status::Received, now); break;
        case ReleaseAction::Delete: (void)delete_key(&row); break;
    }
    close_key(&row);
    wake_on_commit(key_wake_channel(id));
    log_transition(id, stored.state.status,
                   action == ReleaseAction::BackToReceived ? std::optional<Status>(Status::Received)
                                                           : std::nullopt,
                   token, stored.state.attempts - 1, "released");
    PG_RETURN_VOID();
}

Datum assert_owner_body(FunctionCallInfo fcinfo) {
    const KeyId id = key_id_arg(fcinfo, 0, 2);
    const std::int64_t token = token_arg(fcinfo, 1);

    StoredKey stored;
    KeyRow row;
    find_as_holder(HolderCall::AssertOwner, id, token, true, &stored, &row);
    close_key(&row);
    PG_RETURN_VOID();
}

}  // namespace

}  // namespace idem::pg

IDEM_SQL_FUNCTION(idem_complete, idem::pg::complete_body)
IDEM_SQL_FUNCTION(idem_fail, idem::pg::fail_body)
IDEM_SQL_FUNCTION(idem_heartbeat, idem::pg::heartbeat_body)
IDEM_SQL_FUNCTION(idem_release, idem::pg::release_body)
IDEM_SQL_FUNCTION(idem_assert_owner, idem::pg::assert_owner_body)
