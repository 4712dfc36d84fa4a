// Which of a claim's events fit in the bytes that --max-in-flight-bytes
// leaves: in the claim's order, those whose running total of payload and
// header bytes stays within the budget, and the first anyway when nothing
// is in flight (an event larger than the whole budget still goes out, alone).
// The running total only grows, so the events that fit are a prefix: a
// key's run is cut, never reordered. The others are released at once, not
// attempted. The claim statement applies the same cut with the same figures
// (db/statements.hpp) so that their payloads are never sent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace idem::relay {

struct ClaimBudget {
    std::int64_t bytes_left = 0;  // --max-in-flight-bytes minus the bytes in flight
    bool first_anyway = false;    // nothing is in flight

    // How many of the events, of these sizes in the claim's order, fit.
    std::size_t fitting(const std::vector<std::int64_t>& sizes) const;
};

}  // namespace idem::relay
