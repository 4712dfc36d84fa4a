#include "relay/loop/open_claim.hpp"

namespace idem::relay {

std::uint64_t OpenClaim::open(Clock::time_point now) {
    txn_ = next_txn_++;
    since_ = now;
    out_ = 0;
    return txn_;
}

bool OpenClaim::returned(const Event& event) {
    if (void_txns_.count(event.txn) != 0) {
        if (--void_out_ == 0) void_txns_.clear();
        return false;
    }
    if (holds(event)) --out_;
    return true;
}

void OpenClaim::committed() {
    txn_ = 0;
    out_ = 0;
}

void OpenClaim::rolled_back() {
    if (out_ > 0) {
        void_txns_.insert(txn_);
        void_out_ += out_;
    }
    txn_ = 0;
    out_ = 0;
}

}  // namespace idem::relay
