// SQL entry points that create or claim keys: idem_register, idem_claim,
// and idem_get. The decisions are the core's; the table access is
// key_store's, key_insert's and, for a key gone but for its tombstone,
// tombstone_store's.
#include <algorithm>
#include <cstring>

#include "core/claim_decision.hpp"
#include "core/error.hpp"
#include "pg/access/status_enum.hpp"
#include "pg/boundary/args.hpp"
#include "pg/boundary/call_result.hpp"
#include "pg/boundary/guard.hpp"
#include "pg/boundary/settings.hpp"
#include "pg/keys/fingerprint.hpp"
#include "pg/keys/key_insert.hpp"
#include "pg/keys/key_store.hpp"
#include "pg/keys/outcome.hpp"
#include "pg/keys/steps_value.hpp"
#include "pg/keys/tombstone_store.hpp"
#include "pg/keys/transition_log.hpp"
#include "pg/runtime/due_table.hpp"
#include "pg/stats/durations.hpp"
#include "pg/stats/metrics.hpp"
#include "pg/waiting/wakeup.hpp"

namespace idem::pg {

namespace {

// A claim or register re-reads after losing a race to a concurrent insert,
// delete or row lock. Under READ COMMITTED each round sees the winner's
// commit, so a few rounds suffice; the bound only stops a pathological
// livelock.
constexpr int kMaxRaceRounds = 100;

struct Request {
    Datum fingerprint;
    bool has_fingerprint;
    Datum body;  // the jsonb request
};

Request request_arg(FunctionCallInfo fcinfo, int n) {
    const Datum request = optional_jsonb_arg(fcinfo, n, "request");
    if (PG_ARGISNULL(n)) return Request{0, false, 0};
    return Request{fingerprint_of(request), true, request};
}

bool fingerprint_conflict(const StoredKey& stored, const Request& request) {
    return stored.has_fingerprint && request.has_fingerprint &&
           fingerprint_differs(stored.fingerprint, request.fingerprint, request.body);
}

// The answer that reports a stored key as it is.
void describe(const StoredKey& stored, const ClaimDecision& decision, OutcomeFields* out) {
    out->outcome = decision.outcome;
    out->status = stored.state.status;
    out->has_status = true;
    out->token.reset();
    out->attempt = stored.state.attempts;
    out->retry_after = decision.retry_after;
    out->holder_since = stored.state.status == Status::Processing ? stored.claimed_at : std::nullopt;
    out->job_ref = stored.job_ref;
    out->has_job_ref = stored.has_job_ref;
    out->has_result = decision.outcome == Outcome::Completed && stored.has_result;
    out->result = stored.result;
    out->has_error = decision.outcome == Outcome::Failed && stored.has_last_error;
    out->error = stored.last_error;
    out->has_steps = false;  // only a claim granted on a key with steps returns them
}

// Why a claim of an existing key granted it, for the transition log: a
// takeover of an expired lease, and multi-step work resumed after its
// finished steps.
const char* resumed_reason(const StoredKey& stored, bool takeover) {
    if (!stored.state.has_steps) return takeover ? "lease expired" : nullptr;
    return psprintf("%sresumed after %d finished steps", takeover ? "lease expired, " : "",
                    steps_count(stored.steps));
}

// An in_progress answer about a holder at work reports, instead of its
// whole lease left, when it is expected to be done: from how long the
// scope's recent completions took, never past the lease
// (core/expected_done.hpp). Without an estimate, the lease left.
void estimate_retry_after(const text* scope, OutcomeFields* out) {
    if (out->outcome != Outcome::InProgress || !out->retry_after || !out->holder_since) return;
    const std::optional<DurationEstimate> estimate = completion_estimate(scope);
    if (!estimate) return;
    const Micros elapsed = GetCurrentTimestamp() - *out->holder_since;
    out->retry_after = expected_remaining(*estimate, elapsed, *out->retry_after);
}

// Answers are counted once per call, whatever the caller then does.
void count_answer_of(Outcome outcome) {
    switch (outcome) {
        case Outcome::Completed: count_answer(Counter::Replays); break;
        case Outcome::InProgress:
        case Outcome::RetryLater: count_answer(Counter::InProgress); break;
        case Outcome::Mismatch: count_answer(Counter::Mismatches); break;
        default: break;
    }
}

[[noreturn]] void raise_race_lost() {
    throw Error("40001", "could not settle the key against concurrent changes; retry the call");
}

struct ClaimArgs {
    KeyId id;
    Request request;
    Micros lease;
    Micros deadline;  // how long the call may wait for other transactions (now: not at all)
};

[[noreturn]] void raise_read_only(const char* call) {
    ereport(ERROR,
            (errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
             errmsg("idempotency: %s would change the key, which a read-only transaction cannot",
                    call),
             errhint("A duplicate of finished work is answered anywhere, also on a hot standby; "
                     "a call that creates or claims a key needs a read-write transaction on the "
                     "primary.")));
    pg_unreachable();
}

bool read_only_transaction() { return XactReadOnly || RecoveryInProgress(); }

// Another transaction that has not ended is creating, changing or deleting
// the key: nothing committed tells what it will be. `known` is the key's
// committed state when there is one.
void answer_busy(const StoredKey* known, OutcomeFields* out) {
    *out = OutcomeFields{};
    out->outcome = Outcome::InProgress;
    out->has_status = known != nullptr;
    if (known != nullptr) {
        out->status = known->state.status;
        out->attempt = known->state.attempts;
        out->job_ref = known->job_ref;
        out->has_job_ref = known->has_job_ref;
    }
}

// A key that is gone but for its tombstone (its result's retention has
// passed) is never created again: the answer comes from the tombstone,
// with result NULL and result_expired. False when the key has none.
bool answer_from_tombstone(const KeyId& id, const Request& request, OutcomeFields* out) {
    Tombstone tombstone;
    if (!read_tombstone(id, &tombstone)) return false;
    const bool conflict = tombstone.has_fingerprint && request.has_fingerprint &&
                          fingerprint_prefix_differs(tombstone.fingerprint_prefix,
                                                     request.fingerprint, request.body);
    *out = OutcomeFields{};
    out->outcome = decide_expired(tombstone.status, conflict).outcome;
    out->status = tombstone.status;
    out->has_attempt = false;
    out->result_expired = true;
    return true;
}

// A key this call has just inserted whose tombstone it then found: the
// purge moved the key there after this call last looked and before its
// insert. The insert is taken back (its triggers have fired, as for an
// INSERT and a DELETE) and the tombstone answers.
bool inserted_over_tombstone(const KeyId& id, const Request& request, OutcomeFields* out) {
    if (!answer_from_tombstone(id, request, out)) {
        refuse_if_tombstone_made_since_snapshot(id);
        return false;
    }
    KeyRow row;
    StoredKey ours;
    if (!lock_key(id, RowLock::ForUpdate, &ours, &row) || !delete_key(&row))
        elog(ERROR, "idempotency: could not take back a key inserted over its tombstone");
    close_key(&row);
    return true;
}

// Whether this backend's last claim created its key. A claim first tries
// what the last one needed: the insert of a new key (one step when the key
// is new, as it mostly is for a worker draining a queue), or the read of an
// existing one (one index read for a duplicate). A wrong guess costs a
// probe of the primary key that changes nothing.
bool last_claim_created_key = true;

// A new key, PROCESSING under a new token. Returns what the insert found.
KeyInsertResult create_claimed(const ClaimArgs& args, OutcomeFields* out) {
    const Micros now = GetCurrentTimestamp();
    NewKey key{};
    key.id = args.id;
    key.status = Status::Processing;
    key.fingerprint = args.request.fingerprint;
    key.has_fingerprint = args.request.has_fingerprint;
    key.now = now;
    key.lease_until = now + args.lease;
    key.max_attempts = settings::max_attempts;
    key.retention = settings::seconds(settings::retention_s);
    KeyInsertResult inserted = insert_key(key);
    if (inserted.outcome != KeyInsert::Inserted) return inserted;
    // One probe of the tombstones, after the insert: a purge that committed
    // before it is seen (see inserted_over_tombstone).
    if (inserted_over_tombstone(args.id, args.request, out)) {
        inserted.outcome = KeyInsert::Exists;
        inserted.answered = true;
        return inserted;
    }
    *out = OutcomeFields{};
    out->outcome = Outcome::Claimed;
    out->status = Status::Processing;
    out->token = inserted.token;
    out->attempt = 1;
    count_on_commit(Counter::Claims);
    note_due_on_commit(DueKind::KeyLease, key.lease_until);
    log_transition(args.id, std::nullopt, Status::Processing, inserted.token, 1);
    return inserted;
}

// What a round of a claim found: an answer, or another transaction to wait for.
enum class Round { Answered, Retry };

// Another transaction is busy with the key: answer at once when the call
// may not wait (any more), or wait for that transaction within the bound.
Round when_busy(const ClaimArgs& args, TransactionId other, const StoredKey* known,
                OutcomeFields* out) {
    hand_on_received_wakeup();
    if (GetCurrentTimestamp() >= args.deadline || !wait_for_end(other, args.deadline)) {
        answer_busy(known, out);
        return Round::Answered;
    }
    return Round::Retry;
}

// The row of an existing key is locked by another transaction changing it.
Round when_locked(const ClaimArgs& args, const StoredKey& known, OutcomeFields* out) {
    hand_on_received_wakeup();
    const Micros left = args.deadline - GetCurrentTimestamp();
    if (left <= 0 || !wait_for_key_lockers(args.id, left)) {
        answer_busy(&known, out);
        return Round::Answered;
    }
    return Round::Retry;
}

// One claim, never waiting past args.deadline. A claim that only answers
// (in_progress, completed) keeps no lock that would hold back the key's
// holder until the caller's transaction ends.
void claim_once(const ClaimArgs& args, OutcomeFields* out) {
    const bool read_only = read_only_transaction();
    // An insert that finds the key busy reads it below: a committed key that
    // another transaction is changing answers with its committed state, and
    // only a key no transaction has committed yet answers without one.
    // Under a transaction snapshot the key is read first, as the SQL edition
    // does: a finished key that a purge removed after the snapshot then
    // answers from the snapshot instead of being inserted again.
    if (last_claim_created_key && !read_only && !IsolationUsesXactSnapshot()) {
        const KeyInsertResult inserted = create_claimed(args, out);
        if (inserted.outcome == KeyInsert::Inserted) return;
        if (inserted.answered) {
            last_claim_created_key = false;
            return;
        }
    }
    for (int round = 0; round < kMaxRaceRounds; ++round) {
        // A round after a race: under a transaction snapshot, a key another
        // transaction committed since cannot be read again, only retried.
        if (round > 0) refuse_if_key_changed_since_snapshot(args.id);
        StoredKey stored;
        const bool found = read_key(args.id, &stored);
        last_claim_created_key = !found;
        if (!found) {
            // Answered anywhere, also on a standby, as a finished key is.
            if (answer_from_tombstone(args.id, args.request, out)) return;
            if (read_only) raise_read_only("idem_claim");
            const KeyInsertResult inserted = create_claimed(args, out);
            if (inserted.outcome == KeyInsert::Inserted || inserted.answered) return;
            if (inserted.outcome == KeyInsert::Busy &&
                when_busy(args, inserted.busy_with, nullptr, out) == Round::Answered)
                return;
            continue;  // created or deleted meanwhile: read again
        }
        // The clock is read after the row: a row changed just before the
        // read (a retry due now) must not look due in the future.
        Micros now = GetCurrentTimestamp();
        const int max_attempts = settings::max_attempts;
        ClaimDecision decision =
            decide_claim(stored.state, fingerprint_conflict(stored, args.request), now, max_attempts);
        if (!claim_may_change(decision)) {
            describe(stored, decision, out);
            return;
        }
        if (read_only) raise_read_only("idem_claim");
        // Lock the row and decide again on what is there now. A row that
        // another transaction has locked, or waits to lock (a heartbeat that
        // waited for a fenced transaction that has just ended), is waited
        // for (within the bound) without taking the lock, waiters first,
        // then read afresh; a claim that may not wait answers in_progress.
        KeyRow locked;
        StoredKey current;
        if (!lock_key(args.id, RowLock::ForUpdateIfNoneWaits, &current, &locked)) {
            close_key(&locked);
            if (when_locked(args, stored, out) == Round::Answered) return;
            continue;
        }
        stored = current;
        now = GetCurrentTimestamp();
        decision = decide_claim(stored.state, fingerprint_conflict(stored, args.request), now,
                                max_attempts);
        describe(stored, decision, out);
        switch (decision.action) {
            case ClaimAction::Answer:
                break;
            case ClaimAction::Grant: {
                const Grant grant{now + args.lease, args.request.fingerprint,
                                  args.request.has_fingerprint, decision.takeover,
                                  settings::max_attempts, settings::seconds(settings::retention_s)};
                if (grant_claim(&locked, stored, grant, now, &out->token.emplace(),
                                &out->attempt) != Change::Done)
                    elog(ERROR, "idempotency: a trigger on the keys table refused a claim");
                out->status = Status::Processing;
                count_on_commit(Counter::Claims);
                note_due_on_commit(DueKind::KeyLease, grant.lease_until);
                if (decision.takeover) count_on_commit(Counter::LeaseExpirations);
                log_transition(args.id, stored.state.status, Status::Processing,
                               out->token, out->attempt,
                               resumed_reason(stored, decision.takeover));
                // Multi-step work resumes after the steps an earlier attempt
                // finished: the new holder gets them and skips them.
                if (stored.state.has_steps) {
                    out->steps = stored.steps;
                    out->has_steps = true;
                    count_on_commit(Counter::ResumedTakeovers);
                }
                break;
            }
            case ClaimAction::ExpireToFinal:
                // The retention the expired claim decided, when it recorded one.
                (void)expire_lease(
                    &locked, Status::FailedFinal, now,
                    now + stored.retention.value_or(settings::seconds(settings::retention_s)));
                out->status = Status::FailedFinal;
                out->has_error = true;
                out->error = CStringGetTextDatum("lease expired");
                count_on_commit(Counter::LeaseExpirations);
                log_transition(args.id, Status::Processing, Status::FailedFinal,
                               stored.state.token, stored.state.attempts,
                               "lease expired, attempts exhausted");
                break;
        }
        close_key(&locked);
        return;
    }
    raise_race_lost();
}

Datum claim_body(FunctionCallInfo fcinfo) {
    ClaimArgs args;
    args.id = key_id_arg(fcinfo, 0, 3);
    args.request = request_arg(fcinfo, 1);
    args.lease = lease_arg(fcinfo, 2, "lease");
    const std::optional<Micros> wait = wait_arg(fcinfo, 4);
    args.deadline = GetCurrentTimestamp() + wait.value_or(0);

    // A waiting claim sleeps until the holder's transaction commits a change
    // of the key (or its lease runs out, or the wait ends), then asks again.
    const std::uint64_t channel = key_wake_channel(args.id);
    OutcomeFields out;
    for (int round = 0;; ++round) {
        if (wait) prepare_to_wait(channel);
        claim_once(args, &out);
        const Micros now = GetCurrentTimestamp();
        if (out.outcome != Outcome::InProgress || now >= args.deadline) break;
        // A busy answer has no lease to wait for: the transaction it waited
        // for is still running, or the bound is reached.
        const Micros lease_end = now + out.retry_after.value_or(0) + kMillisecond;
        wait_for_wakeup(std::min(args.deadline, lease_end), round);
        CHECK_FOR_INTERRUPTS();
        // Under a transaction snapshot the holder's answer is never seen:
        // the change that woke the claim fails it at once, as it would an
        // UPDATE of the key, instead of leaving it asleep to its bound.
        refuse_if_key_changed_since_snapshot(args.id);
    }
    if (wait) stop_waiting();
    estimate_retry_after(args.id.scope, &out);
    count_answer_of(out.outcome);
    return outcome_datum(fcinfo, out);
}

Datum register_body(FunctionCallInfo fcinfo) {
    const KeyId id = key_id_arg(fcinfo, 0, 3);
    const Request request = request_arg(fcinfo, 1);
    const text* job_ref = optional_name_arg(fcinfo, 2, "job_ref");

    OutcomeFields out;
    for (int round = 0;; ++round) {
        if (round == kMaxRaceRounds) raise_race_lost();
        if (round > 0) refuse_if_key_changed_since_snapshot(id);
        const Micros now = GetCurrentTimestamp();
        StoredKey stored;
        if (read_key(id, &stored)) {
            describe(stored,
                     decide_register(stored.state, fingerprint_conflict(stored, request), now),
                     &out);
            estimate_retry_after(id.scope, &out);
            break;
        }
        if (answer_from_tombstone(id, request, &out)) break;
        if (read_only_transaction()) raise_read_only("idem_register");
        NewKey key{};
        key.id = id;
        key.status = Status::Received;
        key.fingerprint = request.fingerprint;
        key.has_fingerprint = request.has_fingerprint;
        key.now = now;
        key.job_ref = job_ref;
        const KeyInsertResult inserted = insert_key(key);
        if (inserted.outcome == KeyInsert::Inserted && inserted_over_tombstone(id, request, &out))
            break;
        if (inserted.outcome == KeyInsert::Inserted) {
            log_transition(id, std::nullopt, Status::Received, std::nullopt, 0);
            out.outcome = Outcome::Registered;
            out.status = Status::Received;
            out.attempt = 0;
            out.has_job_ref = job_ref != nullptr;
            out.job_ref = PointerGetDatum(job_ref);
            break;
        }
        // Another request with the key has not committed yet: in progress,
        // answered at once (register never waits).
        if (inserted.outcome == KeyInsert::Busy) {
            answer_busy(nullptr, &out);
            break;
        }
    }
    count_answer_of(out.outcome);
    return outcome_datum(fcinfo, out);
}

// idem_get's row for a key of which only the tombstone is left: its scope,
// key and final status, expires_at when the tombstone is forgotten, and
// result_expired true; every other column NULL (the tombstone keeps none
// of them). NULL when the installed table has no result_expired column.
Datum tombstone_row(FunctionCallInfo fcinfo, const KeyId& id, const Tombstone& tombstone) {
    const TupleDesc desc = call_result_desc(fcinfo);
    Datum* values = static_cast<Datum*>(palloc0(desc->natts * sizeof(Datum)));
    bool* nulls = static_cast<bool*>(palloc(desc->natts * sizeof(bool)));
    bool flagged = false;
    for (int i = 0; i < desc->natts; ++i) {
        nulls[i] = false;
        const Form_pg_attribute attribute = TupleDescAttr(desc, i);
        const char* name = NameStr(attribute->attname);
        if (attribute->attisdropped)
            nulls[i] = true;
        else if (std::strcmp(name, "scope") == 0)
            values[i] = PointerGetDatum(id.scope);
        else if (std::strcmp(name, "key") == 0)
            values[i] = PointerGetDatum(id.key);
        else if (std::strcmp(name, "status") == 0)
            values[i] = status_datum(attribute->atttypid, tombstone.status);
        else if (std::strcmp(name, "expires_at") == 0)
            values[i] = TimestampTzGetDatum(tombstone.forget_at);
        else if (std::strcmp(name, "result_expired") == 0)
            values[i] = BoolGetDatum(flagged = true);
        else
            nulls[i] = true;
    }
    if (!flagged) PG_RETURN_NULL();
    return HeapTupleGetDatum(heap_form_tuple(desc, values, nulls));
}

Datum get_body(FunctionCallInfo fcinfo) {
    const KeyId id = key_id_arg(fcinfo, 0, 1);
    Datum row = 0;
    if (key_row(id, &row)) return row_as_planned(row, call_result_desc(fcinfo));
    Tombstone tombstone;
    if (read_tombstone(id, &tombstone)) return tombstone_row(fcinfo, id, tombstone);
    PG_RETURN_NULL();
}

}  // namespace

}  // namespace idem::pg

IDEM_SQL_FUNCTION(idem_register, idem::pg::register_body)
IDEM_SQL_FUNCTION(idem_claim, idem::pg::claim_body)
IDEM_SQL_FUNCTION(idem_get, idem::pg::get_body)
