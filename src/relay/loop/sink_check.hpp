// Tells a misconfigured sink from events that are merely undeliverable: when
// the first kSinkCheckEvents distinct events delivered all fail the same
// final way (the same HTTP status, such as 404 for a mistyped path or 401 for
// a missing credential), the sink is wrong, not the events; the relay then
// stops and leaves the events pending instead of dead-lettering the outbox.
// Any other outcome (a success, a retryable failure, another status) shows
// that the sink works: from then on final failures are dead letters.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_set>

#include "relay/event.hpp"

namespace idem::relay {

constexpr int kSinkCheckEvents = 10;

class SinkCheck {
public:
    enum class State { Undecided, Working, Misconfigured };

    explicit SinkCheck(int events = kSinkCheckEvents) : events_(events) {}

    // The outcome of one attempted delivery of event id, in the order they
    // finished. A repeated delivery of an event counts once.
    State observe(std::int64_t id, const Outcome& outcome);
    // An event that failed was released and refused again the same way:
    // the relay was given no other event to try meanwhile (fewer events
    // than the check wants, or only their keys' heads).
    bool refused_again() const { return refused_again_; }
    // No other event can be tried (--once found nothing more to claim, or
    // an event was refused again): the final failures so far, all alike,
    // are taken as a misconfigured sink.
    State conclude();
    State state() const { return state_; }
    // What every delivery got, e.g. "HTTP 404: not found".
    const std::string& reason() const { return first_error_; }
    // Distinct events that failed that way.
    int failed_events() const { return static_cast<int>(failed_.size()); }
    // Events still to deliver before the check decides (0 once decided).
    int still_to_try() const {
        return state_ == State::Undecided ? events_ - failed_events() : 0;
    }

private:
    int events_;
    long first_status_ = 0;
    std::string first_error_;
    std::unordered_set<std::int64_t> failed_;
    bool refused_again_ = false;
    State state_ = State::Undecided;
};

}  // namespace idem::relay
