#include "relay/loop/sink_check.hpp"

namespace idem::relay {

SinkCheck::State SinkCheck::observe(std::int64_t id, const Outcome& outcome) {
    if (state_ != State::Undecided) return state_;
    if (outcome.verdict != Verdict::Dead || outcome.status == 0 ||
        (!failed_.empty() && outcome.status != first_status_)) {
        state_ = State::Working;
        failed_.clear();
        return state_;
    }
    if (failed_.empty()) {
        first_status_ = outcome.status;
        first_error_ = outcome.error;
    }
    if (!failed_.insert(id).second) refused_again_ = true;
    if (static_cast<int>(failed_.size()) >= events_) state_ = State::Misconfigured;
    return state_;
}

SinkCheck::State SinkCheck::conclude() {
    if (state_ == State::Undecided && !failed_.empty()) state_ = State::Misconfigured;
    return state_;
}

}  // namespace idem::relay
