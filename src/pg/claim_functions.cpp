// SQL entry points that create or claim keys: idem_register, idem_claim,
// and idem_get. The decisions are the core's; the SQL is key_store's.
#include <algorithm>

#include "core/claim_decision.hpp"
#include "core/error.hpp"
#include "pg/args.hpp"
#include "pg/fingerprint.hpp"
#include "pg/guard.hpp"
#include "pg/key_store.hpp"
#include "pg/metrics.hpp"
#include "pg/outcome.hpp"
#include "pg/settings.hpp"
#include "pg/spi.hpp"
#include "pg/transition_log.hpp"
#include "pg/wakeup.hpp"

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
};

Request request_arg(FunctionCallInfo fcinfo, int n) {
    const Datum request = optional_jsonb_arg(fcinfo, n, "request");
    if (PG_ARGISNULL(n)) return Request{0, false};
    return Request{fingerprint_of(request), true};
}

bool fingerprint_conflict(const StoredKey& stored, const Request& request) {
    return stored.has_fingerprint && request.has_fingerprint &&
           fingerprints_differ(stored.fingerprint, request.fingerprint);
}

// The answer that reports a stored key as it is.
void describe(const StoredKey& stored, const ClaimDecision& decision, OutcomeFields* out) {
    out->outcome = decision.outcome;
    out->status = stored.state.status;
    out->token.reset();
    out->attempt = stored.state.attempts;
    out->retry_after = decision.retry_after;
    out->job_ref = stored.job_ref;
    out->has_job_ref = stored.has_job_ref;
    out->has_result = decision.outcome == Outcome::Completed && stored.has_result;
    out->result = stored.result;
    out->has_error = decision.outcome == Outcome::Failed && stored.has_last_error;
    out->error = stored.last_error;
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
};

// Whether this backend's last claim created its key. A claim first tries
// what the last one needed: the INSERT of a new key (one statement when the
// key is new, as it mostly is for a worker draining a queue), or the read of
// an existing one (one statement for a duplicate). A wrong guess costs one
// statement that changes nothing (a sequence value at most).
bool last_claim_created_key = true;

// A new key, PROCESSING under a new token; false when the key exists.
bool create_claimed(const ClaimArgs& args, OutcomeFields* out) {
    const Micros now = GetCurrentTimestamp();
    std::int64_t token = 0;
    if (!insert_claimed(args.id, now + args.lease, args.request.fingerprint,
                        args.request.has_fingerprint, now, &token))
        return false;  // it exists (a concurrent creator's transaction has ended)
    *out = OutcomeFields{};
    out->outcome = Outcome::Claimed;
    out->status = Status::Processing;
    out->token = token;
    out->attempt = 1;
    count_on_commit(Counter::Claims);
    log_transition(args.id.scope, args.id.key, std::nullopt, Status::Processing, token, 1);
    return true;
}

void claim_once(const ClaimArgs& args, OutcomeFields* out) {
    if (last_claim_created_key && create_claimed(args, out)) return;
    for (int round = 0; round < kMaxRaceRounds; ++round) {
        StoredKey stored;
        const bool found = read_key(args.id, RowLock::None, &stored);
        last_claim_created_key = !found;
        if (!found) {
            if (create_claimed(args, out)) return;
            continue;  // created concurrently; that transaction has ended: read again
        }
        // The clock is read after the row: a row changed just before the
        // read (a retry due now) must not look due in the future.
        Micros now = GetCurrentTimestamp();
        const int max_attempts = settings::max_attempts;
        ClaimDecision decision =
            decide_claim(stored.state, fingerprint_conflict(stored, args.request), now, max_attempts);
        if (claim_may_change(decision)) {
            // Lock the row and decide again on what is there now. A row that
            // another transaction has locked is waited for without taking
            // the lock, then read afresh: a claim that ends up only answering
            // (in_progress, completed) keeps no lock that would hold back the
            // key's holder until the caller's transaction ends.
            if (!read_key(args.id, RowLock::ForUpdateIfFree, &stored)) {
                wait_for_key_lockers(args.id);
                continue;
            }
            now = GetCurrentTimestamp();
            decision = decide_claim(stored.state, fingerprint_conflict(stored, args.request), now,
                                    max_attempts);
        }
        describe(stored, decision, out);
        switch (decision.action) {
            case ClaimAction::Answer:
                return;
            case ClaimAction::Grant:
                grant_claim(args.id, now + args.lease, args.request.fingerprint,
                            args.request.has_fingerprint, decision.takeover, now, &out->token.emplace(),
                            &out->attempt);
                out->status = Status::Processing;
                count_on_commit(Counter::Claims);
                if (decision.takeover) count_on_commit(Counter::LeaseExpirations);
                log_transition(args.id.scope, args.id.key, stored.state.status, Status::Processing,
                               out->token, out->attempt,
                               decision.takeover ? "lease expired" : nullptr);
                return;
            case ClaimAction::ExpireToFinal:
                expire_lease(args.id, Status::FailedFinal, now,
                             now + settings::seconds(settings::retention_s));
                out->status = Status::FailedFinal;
                out->has_error = true;
                out->error = CStringGetTextDatum("lease expired");
                count_on_commit(Counter::LeaseExpirations);
                log_transition(args.id.scope, args.id.key, Status::Processing, Status::FailedFinal,
                               stored.state.token, stored.state.attempts,
                               "lease expired, attempts exhausted");
                return;
        }
    }
    raise_race_lost();
}

Datum claim_body(FunctionCallInfo fcinfo) {
    ClaimArgs args;
    args.id.key = name_arg(fcinfo, 0, "key");
    args.id.scope = scope_arg(fcinfo, 3);
    args.request = request_arg(fcinfo, 1);
    args.lease = lease_arg(fcinfo, 2, "lease");
    const std::optional<Micros> wait = wait_arg(fcinfo, 4);
    const Micros deadline = GetCurrentTimestamp() + wait.value_or(0);

    // A waiting claim sleeps until the holder's transaction commits a change
    // of the key (or its lease runs out, or the wait ends), then asks again.
    const std::uint32_t channel = wake_channel(WaitTopic::Key, args.id.scope, args.id.key);
    OutcomeFields out;
    connect_spi();
    for (int round = 0;; ++round) {
        if (wait) prepare_to_wait(channel);
        claim_once(args, &out);
        const Micros now = GetCurrentTimestamp();
        if (out.outcome != Outcome::InProgress || now >= deadline) break;
        const Micros lease_end = now + out.retry_after.value_or(0) + kMillisecond;
        wait_for_wakeup(channel, std::min(deadline, lease_end), round);
        CHECK_FOR_INTERRUPTS();
    }
    if (wait) stop_waiting();
    finish_spi();
    count_answer_of(out.outcome);
    return outcome_datum(fcinfo, out);
}

Datum register_body(FunctionCallInfo fcinfo) {
    KeyId id;
    id.key = name_arg(fcinfo, 0, "key");
    id.scope = scope_arg(fcinfo, 3);
    const Request request = request_arg(fcinfo, 1);
    const text* job_ref = optional_name_arg(fcinfo, 2, "job_ref");

    OutcomeFields out;
    connect_spi();
    for (int round = 0;; ++round) {
        if (round == kMaxRaceRounds) raise_race_lost();
        const Micros now = GetCurrentTimestamp();
        StoredKey stored;
        if (read_key(id, RowLock::None, &stored)) {
            describe(stored,
                     decide_register(stored.state, fingerprint_conflict(stored, request), now),
                     &out);
            break;
        }
        if (insert_registered(id, request.fingerprint, request.has_fingerprint, job_ref, now)) {
            log_transition(id.scope, id.key, std::nullopt, Status::Received, std::nullopt, 0);
            out.outcome = Outcome::Registered;
            out.status = Status::Received;
            out.attempt = 0;
            out.has_job_ref = job_ref != nullptr;
            out.job_ref = PointerGetDatum(job_ref);
            break;
        }
    }
    finish_spi();
    count_answer_of(out.outcome);
    return outcome_datum(fcinfo, out);
}

Datum get_body(FunctionCallInfo fcinfo) {
    KeyId id;
    id.key = name_arg(fcinfo, 0, "key");
    id.scope = scope_arg(fcinfo, 1);
    Datum row = 0;
    connect_spi();
    const bool found = key_row(id, &row);
    finish_spi();
    if (!found) PG_RETURN_NULL();
    return row;
}

}  // namespace

}  // namespace idem::pg

IDEM_SQL_FUNCTION(idem_register, idem::pg::register_body)
IDEM_SQL_FUNCTION(idem_claim, idem::pg::claim_body)
IDEM_SQL_FUNCTION(idem_get, idem::pg::get_body)
