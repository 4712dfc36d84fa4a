#include "relay/loop/relay.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <poll.h>

#include "relay/loop/exit_status.hpp"
#include "relay/loop/signals.hpp"
#include "relay/observe/log.hpp"

namespace idem::relay {

namespace {

// While deliveries run, look at their results at least this often.
constexpr auto kBusyWake = std::chrono::milliseconds(10);
// A claim's transaction stays open while its events are delivered, so that
// their acks and nacks commit with the claim and each event is written once;
// when deliveries take longer than this, the claim is committed as it is
// (the events in flight with their lease) and the rest settled later.
constexpr auto kOpenClaimLimit = std::chrono::milliseconds(500);
// After a transient database error (deadlock, statement cancelled, ...).
constexpr auto kTransientRetry = std::chrono::milliseconds(200);
// The lag gauge's refresh when there are no progress lines.
constexpr Millis kLagRefresh{10000};
// --once gives up when the database stays away this long.
constexpr auto kOnceReconnectLimit = std::chrono::seconds(30);
// After a stop, how long the outcomes of the last deliveries may wait for an
// unreachable database, beyond --http-timeout (the longest delivery).
constexpr auto kStopGrace = std::chrono::seconds(5);

// The claim statement's arguments: the count, and the budget it cuts alike.
ClaimArgs claim_args(int count, const ClaimBudget& budget) {
    ClaimArgs args;
    args.count = count;
    args.bytes_left = budget.bytes_left;
    args.first_anyway = budget.first_anyway;
    return args;
}

long long millis(Clock::duration d) {
    return static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
}

}  // namespace

Relay::Relay(const Options& options, Database& db, WorkerPool& pool, SinkTarget& target,
             Stats& stats, const WakePipe& wake, LaneGroup& lanes, ProgressLine* progress)
    : options_(options),
      db_(db),
      pool_(pool),
      target_(target),
      stats_(stats),
      wake_(wake),
      lanes_(lanes),
      progress_(progress),
      sizer_(options, target.max_delivery_time()) {}

int Relay::run() {
    const Clock::time_point start = Clock::now();
    next_poll_ = start;
    next_progress_ = start + tick_interval();
    for (;;) {
        Clock::time_point now = Clock::now();
        on_signals(now);
        const std::string sink_error = target_.fatal_error();
        if (!sink_error.empty() && exit_code_ == 0) fail(sink_error);
        take_results();

        if (!db_.connected() && now >= reconnect_at_) reconnect(now);
        if (!settle_.held.empty()) settle_held(now);
        if (db_.connected() && now >= retry_db_at_) {
            if (open_.is_open()) {
                if (open_.ready(now, open_claim_limit())) commit_open_claim(now);
            } else {
                flush_acks(now);
                if (db_.connected()) flush_nacks(now);
                if (db_.connected()) flush_releases(now);
                if (db_.connected() && !stopping_) claim(now);
            }
        }
        now = Clock::now();
        if (tick_interval().count() > 0 && now >= next_progress_) progress(now);

        if (stopping_ && in_flight_ == 0 && flushed() && !open_.is_open()) break;
        if (options_.once && once_done_ && in_flight_ == 0 && flushed()) break;
        const bool only_unwritten = in_flight_ == static_cast<std::int64_t>(unwritten());
        if (!db_.connected() && !flushed()) {
            // Outcomes we cannot write: give up only when told to hurry, or
            // when waiting longer is pointless.
            const bool hurry = abandoned_ || (stopping_ && now - stop_at_ > options_.http_timeout +
                                                                                 kStopGrace);
            if (hurry && only_unwritten) {
                log_error("%zu delivered event(s) could not be acked, %zu failure(s) not "
                          "recorded and %zu event(s) not released: the database is unreachable; "
                          "they will be delivered again when their lease runs out",
                          settle_.to_ack.size(), settle_.to_nack.size() + settle_.held.size(),
                          settle_.to_release.size());
                exit_code_ = kExitFailure;
                break;
            }
        }
        if (!db_.connected() && options_.once && now - lost_since_ > kOnceReconnectLimit &&
            only_unwritten) {
            log_error("the database stayed unreachable for %lld s; giving up (--once)",
                      static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(
                                                 kOnceReconnectLimit).count()));
            exit_code_ = kExitFailure;
            break;
        }
        if (!db_.connected() && exit_code_ != 0 && in_flight_ == 0 && flushed()) break;
        wait(now);
    }
    pool_.stop();
    return exit_code_;
}

void Relay::fail(const std::string& error) {
    log_error("%s", error.c_str());
    exit_code_ = kExitFailure;
    stats_.healthy = false;
    stop_delivering();
    lanes_.fail();
}

// No more claims, and the events not started yet go back to pending: what
// is left is bounded by the deliveries in progress (--http-timeout). Returns
// how many events had not started.
std::size_t Relay::stop_delivering() {
    if (!stopping_) {
        stopping_ = true;
        stop_at_ = Clock::now();
    }
    return pool_.abandon_queued();
}

void Relay::on_signals(Clock::time_point now) {
    const int requests = stop_requests();
    if (requests >= 1 && !stopping_) {
        const std::size_t not_started = stop_delivering();
        stop_at_ = now;
        log_info("stopping: no more claims; finishing the deliveries in progress (at most %lld "
                 "ms), releasing the %zu event(s) not started",
                 static_cast<long long>(options_.http_timeout.count()), not_started);
    }
    // Another lane failed (and said why): this one drains as on a stop.
    if (lanes_.failed() && !stopping_) stop_delivering();
    if (requests >= 2 && !abandoned_) {
        abandoned_ = true;
        target_.abort();
        log_info("stopping now: the deliveries in progress are cut short");
    }
}

void Relay::resolved(const Delivery& delivery) {
    in_flight_ -= 1;
    in_flight_bytes_ -= delivery.event.bytes();
    stats_.in_flight -= 1;
    stats_.in_flight_bytes -= delivery.event.bytes();
}

void Relay::count_notifications() {
    stats_.notifications += db_.notifications() - notifications_counted_;
    notifications_counted_ = db_.notifications();
}

void Relay::take_results() {
    for (Delivery& delivery : pool_.take_results()) judge(std::move(delivery));
}

// Where an outcome goes; final failures wait while the sink check cannot
// tell a misconfigured sink from undeliverable events.
void Relay::judge(Delivery&& delivery) {
    if (!open_.returned(delivery.event)) {
        // Its claim was rolled back: the event is pending again, not ours.
        resolved(delivery);
        return;
    }
    if (delivery.outcome.verdict == Verdict::Skip) {
        ++stats_.skipped;
        settle_.to_release.push_back(std::move(delivery));
        return;
    }
    sizer_.delivered(delivery.seconds);
    const SinkCheck::State before = check_.state();
    const SinkCheck::State after = check_.observe(delivery.event.id, delivery.outcome);
    switch (delivery.outcome.verdict) {
        case Verdict::Ack: settle_.to_ack.push_back(std::move(delivery)); break;
        case Verdict::Retry: settle_.to_nack.push_back(std::move(delivery)); break;
        case Verdict::Dead:
            if (after == SinkCheck::State::Undecided) {
                settle_.hold(std::move(delivery), options_.lease);
            } else if (after == SinkCheck::State::Misconfigured) {
                settle_.to_release.push_back(std::move(delivery));
            } else {
                settle_.to_nack.push_back(std::move(delivery));
            }
            break;
        case Verdict::Skip: break;
    }
    if (before != after) decided(after);
}

void Relay::decided(SinkCheck::State state) {
    if (state == SinkCheck::State::Working) {
        settle_.nack_held();
    } else if (state == SinkCheck::State::Misconfigured) {
        settle_.release_held();
        fail("the sink answered " + check_.reason() + " to each of the first " +
             std::to_string(check_.failed_events()) +
             " events delivered: it looks misconfigured (check --sink); stopping, the events "
             "stay pending");
    }
}

// Final failures the sink check holds back: released (pending again, no
// attempt counted) when their lease is half gone or the relay stops, so
// that another delivery may decide. When nothing else can be tried, they
// decide themselves: with --once, once a claim finds nothing; running on,
// once an event released so comes back refused the same way (without
// this, a few events refused alike were sent again and again, for ever).
void Relay::settle_held(Clock::time_point now) {
    const bool nothing_else = options_.once ? nothing_claimed_ : check_.refused_again();
    if (!stopping_ && nothing_else && in_flight_ == static_cast<std::int64_t>(settle_.held.size())) {
        decided(check_.conclude());
        return;
    }
    if (!stopping_ && now < settle_.held_until) return;
    settle_.release_held();
}

// A lost connection or a transient error: counted, and the call is tried
// again later (after reconnecting, or shortly). True when it was one of them.
bool Relay::database_unavailable(DbStatus status, const std::string& error,
                                 Clock::time_point now) {
    if (status != DbStatus::Lost && status != DbStatus::Transient) return false;
    ++stats_.db_errors;
    if (status == DbStatus::Lost) {
        connection_lost(error, now);
    } else {
        log_warning("%s; trying again", error.c_str());
        retry_db_at_ = now + kTransientRetry;
    }
    return true;
}

// The backoff goes on from the last loss until a claim succeeds: a server
// that takes connections but refuses every claim (read-only: a standby, or
// a primary fenced at a switchover) is not reconnected to ten times a
// second.
void Relay::connection_lost(const std::string& error, Clock::time_point now) {
    const Millis delay = backoff_.next();
    log_warning("database connection lost: %s; reconnecting in %lld ms", error.c_str(),
                static_cast<long long>(delay.count()));
    if (open_.is_open()) void_open_claim("the connection was lost");
    if (!counted_down_) ++stats_.lanes_down;
    counted_down_ = true;
    lost_since_ = now;
    reconnect_attempts_ = 0;
    reconnect_at_ = now + delay;
}

void Relay::reconnect(Clock::time_point now) {
    std::string error;
    ++reconnect_attempts_;
    const DbStatus status = db_.connect(&error);
    if (status == DbStatus::Ok) {
        log_info("reconnected to the database (after %d attempt(s), %lld ms)", reconnect_attempts_,
                 millis(now - lost_since_));
        ++stats_.reconnects;
        if (counted_down_) --stats_.lanes_down;
        counted_down_ = false;
        due_ = true;
        return;
    }
    ++stats_.db_errors;
    const Millis delay = backoff_.next();
    reconnect_at_ = now + delay;
    if (status == DbStatus::Fatal) {
        fail(error);
        return;
    }
    log_warning("cannot reconnect to the database (attempt %d): %s; next try in %lld ms",
                reconnect_attempts_, error.c_str(), static_cast<long long>(delay.count()));
}

// Not while deliveries of a rolled-back claim still run: their events are
// pending again, and another claim could hand out the next event of a key
// before the late delivery ends.
bool Relay::may_claim() const {
    return !stopping_ && !open_.voided_still_out() && claim_size() > 0;
}

// While the sink check is undecided, no more events are out than it needs.
int Relay::claim_size() const {
    int want = sizer_.want(in_flight_, in_flight_bytes_);
    if (check_.state() == SinkCheck::State::Undecided) {
        const std::int64_t judging = in_flight_ - static_cast<std::int64_t>(settle_.held.size());
        want = static_cast<int>(std::clamp<std::int64_t>(check_.still_to_try() - judging, 0, want));
    }
    return want;
}

void Relay::claim(Clock::time_point now) {
    if (db_.take_notified()) due_ = true;
    if (!may_claim()) return;
    const int want = claim_size();
    if (options_.once && in_flight_ == 0 && flushed()) due_ = true;
    if (!due_ && now < next_poll_) return;
    const bool all_resolved = in_flight_ == 0 && flushed();
    std::vector<Event> events;
    std::string error;
    ClaimBudget budget;
    budget.bytes_left = options_.max_in_flight_bytes - in_flight_bytes_;
    budget.first_anyway = in_flight_ == 0;
    const DbStatus status = db_.begin_claim(claim_args(want, budget), &events, &error);
    ++stats_.claims;
    count_notifications();
    if (database_unavailable(status, error, now)) return;
    if (status == DbStatus::Fatal) {
        ++stats_.db_errors;
        fail(error);
        return;
    }
    // The connection works: the next loss starts the backoff afresh.
    backoff_.reset();
    take_claimed(std::move(events), want, budget, all_resolved, now);
}

// The events a claim handed out: to the delivery threads, or (past
// --max-in-flight-bytes: fetched without their payload) back. They belong
// to the transaction now open.
void Relay::take_claimed(std::vector<Event>&& events, int want, const ClaimBudget& budget,
                         bool all_resolved, Clock::time_point now) {
    const int got = static_cast<int>(events.size());
    due_ = got == want;  // a full batch: there is probably more
    nothing_claimed_ = got == 0;
    next_poll_ = now + options_.poll_interval;
    if (options_.once && got == 0 && all_resolved) once_done_ = true;
    if (got == 0) return;
    const std::uint64_t txn = open_.open(now);
    stats_.claimed += events.size();
    std::vector<Event> deliver;
    deliver.reserve(events.size());
    std::int64_t claimed_bytes = 0;
    std::vector<std::int64_t> sizes;
    sizes.reserve(events.size());
    for (const Event& event : events) sizes.push_back(event.claimed_bytes);
    const std::size_t fitting = budget.fitting(sizes);
    for (std::size_t i = 0; i < events.size(); ++i) {
        Event& event = events[i];
        ++in_flight_;
        in_flight_bytes_ += event.bytes();
        claimed_bytes += event.bytes();
        event.txn = txn;
        // An event past the budget came without its payload (the claim cut it
        // alike); one that did not come is never delivered either way.
        if (i < fitting && event.sent) {
            deliver.push_back(std::move(event));
        } else {
            ++stats_.skipped;
            Delivery skipped;
            skipped.event = std::move(event);
            skipped.outcome = Outcome::skip("it does not fit in --max-in-flight-bytes now");
            settle_.to_release.push_back(std::move(skipped));
        }
    }
    for (const Event& event : deliver) sizer_.claimed(event.bytes());
    open_.delivering(static_cast<std::int64_t>(deliver.size()));
    stats_.in_flight += got;
    stats_.in_flight_bytes += claimed_bytes;
    if (!deliver.empty()) pool_.submit(std::move(deliver));
}

// Commit when every event of the claim has its outcome, or when waiting
// longer would hold its rows (and a lost connection would lose its
// deliveries' outcomes) for too long.
Clock::duration Relay::open_claim_limit() const {
    return std::min<Clock::duration>(kOpenClaimLimit, options_.lease / 4);
}

// One round trip: the open claim's acks, nacks and releases (and the acks
// and releases of earlier claims), COMMIT, and the next claim in a new
// transaction. Failures that the sink check holds back and events still
// being delivered are left out: the COMMIT writes them as claimed (in
// flight, under their lease), and they are settled later on their own.
void Relay::commit_open_claim(Clock::time_point now) {
    CommitBatch batch =
        settle_.take_for_commit(open_.txn(), now, db_.can_release() && release_works_);
    std::vector<std::optional<std::int64_t>> retry_ins;
    const Settlement settlement = settlement_of(batch, &retry_ins);

    // The next claim goes in the same round trip unless failures of earlier
    // claims wait to be written on their own (a nack may fail alone).
    const bool all_resolved = in_flight_ == static_cast<std::int64_t>(batch.size()) && flushed();
    if (db_.take_notified()) due_ = true;
    const bool claim_next = may_claim() && settle_.to_nack.empty() && settle_.to_release.empty() &&
                            (due_ || now >= next_poll_ || (options_.once && all_resolved));
    ClaimArgs args;
    ClaimBudget budget;
    if (claim_next) args = next_claim_args(batch, &budget);
    const bool with_claim = claim_next && args.count > 0;
    SettleResult result;
    std::vector<Event> events;
    std::string error;
    const DbStatus status =
        db_.commit_round(settlement, &result, with_claim ? &args : nullptr, &events, &error);
    if (with_claim) ++stats_.claims;
    count_notifications();
    if (status != DbStatus::Ok) {
        commit_failed(std::move(batch), status, error, now);
        return;
    }
    record_commit(batch, result, retry_ins);
    // Events still out or held now stand as committed claims.
    open_.committed();
    if (with_claim) take_claimed(std::move(events), args.count, budget, all_resolved, now);
}

// What the COMMIT writes for the batch; retry_ins: each nack's delay.
Settlement Relay::settlement_of(const CommitBatch& batch,
                                std::vector<std::optional<std::int64_t>>* retry_ins) const {
    Settlement settlement;
    for (const Delivery& d : batch.acks) settlement.acks.push_back(d.event.id);
    for (const Delivery& d : batch.nacks) {
        std::optional<std::int64_t> retry_in;
        settlement.nacks.push_back(nack_request(d, &retry_in));
        retry_ins->push_back(retry_in);
    }
    for (const Delivery& d : batch.releases) settlement.releases.push_back(d.event.id);
    return settlement;
}

// The claim that follows the COMMIT in its round trip, sized as if the batch
// were settled already.
ClaimArgs Relay::next_claim_args(const CommitBatch& batch, ClaimBudget* budget) const {
    std::int64_t settled_bytes = 0;
    for (const auto* group : {&batch.acks, &batch.nacks, &batch.releases})
        for (const Delivery& d : *group) settled_bytes += d.event.bytes();
    const std::int64_t left = in_flight_ - static_cast<std::int64_t>(batch.size());
    int count = sizer_.want(left, in_flight_bytes_ - settled_bytes);
    if (check_.state() == SinkCheck::State::Undecided)
        count = std::min<int>(count, std::max(0, check_.still_to_try() - static_cast<int>(left)));
    budget->bytes_left = options_.max_in_flight_bytes - (in_flight_bytes_ - settled_bytes);
    budget->first_anyway = left == 0;
    return claim_args(count, *budget);
}

// The round trip did not commit: earlier claims' outcomes are still to
// write; the open claim's events are pending again.
void Relay::commit_failed(CommitBatch&& batch, DbStatus status, const std::string& error,
                          Clock::time_point now) {
    const CommitBatch dropped = settle_.give_back(std::move(batch), open_.txn());
    for (const auto* group : {&dropped.acks, &dropped.nacks, &dropped.releases})
        for (const Delivery& d : *group) resolved(d);
    void_open_claim(error);
    if (database_unavailable(status, error, now)) return;
    ++stats_.db_errors;
    fail(error + "; " + std::to_string(dropped.acks.size()) +
         " delivered event(s) not acked: their claim did not commit, they are pending again "
         "and will be delivered again; stopping");
}

// The COMMIT wrote the batch: counted, logged, resolved.
void Relay::record_commit(const CommitBatch& batch, const SettleResult& result,
                          const std::vector<std::optional<std::int64_t>>& retry_ins) {
    acked(batch.acks);
    for (std::size_t i = 0; i < batch.nacks.size(); ++i)
        nacked(batch.nacks[i], i < result.nack_states.size() ? result.nack_states[i] : "",
               retry_ins[i]);
    for (const Delivery& d : batch.nacks) resolved(d);
    if (!batch.releases.empty()) {
        stats_.released += static_cast<std::uint64_t>(result.released);
        log_info("%zu event(s) not attempted released back to pending (%s)",
                 batch.releases.size(), batch.releases.front().outcome.error.c_str());
        for (const Delivery& d : batch.releases) resolved(d);
        due_ = true;
    }
}

// The open transaction did not commit: its events are pending again. What
// is known of them is dropped, and deliveries of them still running are
// dropped when they end.
void Relay::void_open_claim(const std::string& why) {
    std::size_t delivered = 0;
    for (const Delivery& d : settle_.drop(open_.txn(), &delivered)) resolved(d);
    open_.rolled_back();
    if (delivered > 0)
        log_warning("%zu delivered event(s) not acked: their claim's transaction did not commit "
                    "(%s); they are pending again and will be delivered again",
                    delivered, why.c_str());
}

Millis Relay::tick_interval() const {
    if (progress_ == nullptr) return Millis(0);  // another lane reports
    // Without progress lines the lag gauge of the metrics is still refreshed.
    if (options_.progress_interval.count() > 0) return options_.progress_interval;
    return options_.metrics ? kLagRefresh : Millis(0);
}

// The reporting lane's tick: the outbox lag read (for the metrics too), and
// the progress line when there are progress lines.
void Relay::progress(Clock::time_point now) {
    if (lag_enabled_ && db_.connected() && !open_.is_open()) {
        double seconds = 0;
        std::string error;
        const DbStatus status = db_.outbox_lag(&seconds, &error);
        if (status == DbStatus::Ok) {
            stats_.lag_seconds = seconds;
            stats_.lag_known = true;
        } else if (status == DbStatus::Lost) {
            connection_lost(error, now);
        } else if (status == DbStatus::Fatal) {
            lag_enabled_ = false;
            stats_.lag_known = false;
            log_info("outbox lag not shown: %s (grant pg_monitor to the relay's role to see it)",
                     error.c_str());
        }
    }
    if (options_.progress_interval.count() > 0) progress_->print(stats_, now, false);
    next_progress_ = now + tick_interval();
}

void Relay::wait(Clock::time_point now) {
    // A notification that came in with the answer to a query (claim, ack,
    // nack) is already read: the socket will not wake us for it.
    if (db_.take_notified()) due_ = true;
    Clock::time_point until = now + std::chrono::seconds(3600);
    auto before = [&until](Clock::time_point t) { until = std::min(until, t); };
    if (db_.connected() && open_.is_open()) {
        if (open_.all_returned()) before(retry_db_at_);
        before(open_.deadline(open_claim_limit()));
    } else if (db_.connected()) {
        if (!flushed()) before(retry_db_at_);
        if (may_claim()) {
            if (due_ || (options_.once && in_flight_ == 0 && flushed())) before(retry_db_at_);
            before(next_poll_);
        }
    } else {
        before(reconnect_at_);
    }
    // Deliveries running (held final failures wait for their own time).
    if (in_flight_ > static_cast<std::int64_t>(settle_.held.size())) before(now + kBusyWake);
    if (!settle_.held.empty()) before(settle_.held_until);
    if (tick_interval().count() > 0) before(next_progress_);
    if (stopping_) before(now + std::chrono::milliseconds(100));

    const long long timeout = std::max<long long>(0, millis(until - now));
    pollfd fds[2] = {{wake_.fd(), POLLIN, 0}, {db_.socket(), POLLIN, 0}};
    const nfds_t count = db_.connected() ? 2 : 1;
    const int ready = poll(fds, count, static_cast<int>(std::min<long long>(timeout, 3600000)));
    if (ready < 0 && errno != EINTR) log_warning("poll failed: %s", strerror(errno));
    if (ready <= 0) return;
    if (fds[0].revents != 0) wake_.drain();
    if (count == 2 && fds[1].revents != 0) {
        if (!db_.consume_input()) {
            ++stats_.db_errors;
            connection_lost("the server closed the connection", Clock::now());
        } else if (db_.take_notified()) {
            due_ = true;
        }
        count_notifications();
    }
}

}  // namespace idem::relay
