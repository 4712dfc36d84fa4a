// The outcomes of deliveries written one call each, outside a claim's round
// trip (outbox_ack, outbox_nack, outbox_release): those of events whose
// claim committed before they were delivered, and those the round trip
// left out. A call that fails for the database's absence is tried again
// after reconnecting; an event whose lease ran out meanwhile is left to it.
// Also what follows a written ack or nack (acked, nacked) and what a nack
// asks for (nack_request), which the round trip (relay.cpp) shares.
#include <sys/time.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "relay/db/retry_delay.hpp"
#include "relay/loop/relay.hpp"
#include "relay/observe/log.hpp"

namespace idem::relay {

namespace {

double wall_seconds() {
    struct timeval now;
    gettimeofday(&now, nullptr);
    return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_usec) / 1e6;
}

// Why the events still leased at `now` are released, each reason once with
// how many it was for ("3: its lease would run out during the delivery; 1:
// an earlier event of its key was not delivered"), in the order they came.
std::string release_reasons(const std::vector<Delivery>& released, Clock::time_point now) {
    std::vector<std::pair<std::string, std::size_t>> reasons;
    for (const Delivery& d : released) {
        if (now >= d.event.lease_until) continue;
        auto same = std::find_if(reasons.begin(), reasons.end(),
                                 [&](const auto& r) { return r.first == d.outcome.error; });
        if (same == reasons.end())
            reasons.emplace_back(d.outcome.error, 1);
        else
            ++same->second;
    }
    std::string text;
    for (const auto& [reason, count] : reasons)
        text += (text.empty() ? "" : "; ") + std::to_string(count) + ": " + reason;
    return text;
}

}  // namespace

void Relay::flush_acks(Clock::time_point now) {
    if (settle_.to_ack.empty()) return;
    std::vector<std::int64_t> ids;
    ids.reserve(settle_.to_ack.size());
    for (const Delivery& d : settle_.to_ack) ids.push_back(d.event.id);
    std::int64_t changed = 0;
    std::string error;
    const DbStatus status = db_.ack(ids, &changed, &error);
    if (database_unavailable(status, error, now)) return;
    if (status == DbStatus::Fatal) {
        ++stats_.db_errors;
        fail(error + "; " + std::to_string(ids.size()) +
             " delivered event(s) not acked (they will be delivered again when their lease runs "
             "out); stopping");
        for (const Delivery& d : settle_.to_ack) resolved(d);
    } else {
        acked(settle_.to_ack);
    }
    settle_.to_ack.clear();
}

// Acked events: counted, their delays observed, resolved.
void Relay::acked(const std::vector<Delivery>& deliveries) {
    bool keyed = false;
    const double wall = wall_seconds();
    for (const Delivery& d : deliveries) {
        keyed = keyed || d.event.key.has_value();
        if (d.outcome.duplicate) ++stats_.duplicates;
        const double delay = wall - d.event.enqueued_at;
        stats_.delay_seconds.observe(delay);
        stats_.observe_delay_max(delay);
        resolved(d);
    }
    lanes_.delivered(deliveries);
    stats_.delivered += deliveries.size();
    // The next event of an acked key may be due now.
    if (keyed) due_ = true;
}

void Relay::flush_nacks(Clock::time_point now) {
    std::size_t done = 0;
    for (; done < settle_.to_nack.size(); ++done) {
        const Delivery& d = settle_.to_nack[done];
        const Event& event = d.event;
        if (now >= event.lease_until) {
            // Its lease ran out while the database was away: the event is
            // someone else's again (or will be); the lease's expiry counts the attempt.
            log_warning("event %lld (topic %s): failure not recorded, its lease ran out: %s",
                        static_cast<long long>(event.id), event.topic.c_str(),
                        d.outcome.error.c_str());
            continue;
        }
        std::string state, error;
        std::optional<std::int64_t> retry_in;
        const NackRequest request = nack_request(d, &retry_in);
        const DbStatus status = db_.nack(event.id, request.message, request.retryable, retry_in,
                                         &state, &error);
        if (database_unavailable(status, error, now)) break;
        if (status == DbStatus::Fatal) {
            ++stats_.db_errors;
            if (db_.last_sqlstate() == "IK002") {  // removed from the outbox meanwhile
                log_warning("event %lld: %s", static_cast<long long>(event.id), error.c_str());
                continue;
            }
            fail("event " + std::to_string(event.id) + ": " + error +
                 "; its failure is not recorded; stopping");
            done = settle_.to_nack.size();
            break;
        }
        nacked(d, state, retry_in);
    }
    for (std::size_t i = 0; i < done; ++i) resolved(settle_.to_nack[i]);
    settle_.to_nack.erase(settle_.to_nack.begin(), settle_.to_nack.begin() + static_cast<std::ptrdiff_t>(done));
}

NackRequest Relay::nack_request(const Delivery& d, std::optional<std::int64_t>* retry_in) const {
    NackRequest request;
    request.id = d.event.id;
    // Errors are stored: keep them short.
    request.message = d.outcome.error.substr(0, 1000);
    request.retryable = d.outcome.verdict == Verdict::Retry;
    *retry_in = retry_in_ms(d.outcome.retry_in, d.event.attempt, db_.retry_settings());
    request.retry_in_ms = *retry_in;
    return request;
}

// A nack written: the event's state after it, counted and logged.
void Relay::nacked(const Delivery& d, const std::string& state,
                   const std::optional<std::int64_t>& retry_in) {
    const Event& event = d.event;
    const std::string what = "event " + std::to_string(event.id) + " (topic " + event.topic +
                             (event.key ? ", key " + *event.key : std::string()) + ")";
    if (state == "dead") {
        ++stats_.dead;
        lanes_.retry_waits(event.id, false);
        log_warning("%s is dead after attempt %d: %s", what.c_str(), event.attempt,
                    d.outcome.error.c_str());
    } else if (state == "pending") {
        ++stats_.retried;
        lanes_.retry_waits(event.id, true);
        if (retry_in)
            log_info("%s attempt %d failed, retry in %lld ms: %s", what.c_str(), event.attempt,
                     static_cast<long long>(*retry_in), d.outcome.error.c_str());
        else
            log_info("%s attempt %d failed, will be retried: %s", what.c_str(), event.attempt,
                     d.outcome.error.c_str());
    }
}

void Relay::flush_releases(Clock::time_point now) {
    if (settle_.to_release.empty()) return;
    std::vector<std::int64_t> ids;
    ids.reserve(settle_.to_release.size());
    // An event whose lease ran out meanwhile may be claimed again already
    // (by this relay too): the lease's expiry has given it back.
    for (const Delivery& d : settle_.to_release)
        if (now < d.event.lease_until) ids.push_back(d.event.id);
    if (ids.empty()) {
        for (const Delivery& d : settle_.to_release) resolved(d);
        settle_.to_release.clear();
        return;
    }
    if (db_.can_release() && release_works_) {
        std::int64_t changed = 0;
        std::string error;
        const DbStatus status = db_.release(ids, &changed, &error);
        if (database_unavailable(status, error, now)) return;
        if (status == DbStatus::Ok) {
            stats_.released += static_cast<std::uint64_t>(changed);
            log_info("%zu event(s) not attempted released back to pending (%s)", ids.size(),
                     release_reasons(settle_.to_release, now).c_str());
            due_ = true;  // they are due again
        } else {
            ++stats_.db_errors;
            release_works_ = false;
            log_warning("%s; events not attempted are left to their lease from now on",
                        error.c_str());
        }
    }
    if (!db_.can_release() || !release_works_) {
        if (stats_.not_attempted.load() == 0 && !db_.can_release())
            log_warning("this extension has no outbox_release (older than 0.4.0): events not "
                        "attempted are left to their lease, which counts an attempt");
        stats_.not_attempted += ids.size();
    }
    for (const Delivery& d : settle_.to_release) resolved(d);
    settle_.to_release.clear();
}

}  // namespace idem::relay
