#include "relay/loop/claim_budget.hpp"

namespace idem::relay {

std::size_t ClaimBudget::fitting(const std::vector<std::int64_t>& sizes) const {
    std::int64_t total = 0;
    std::size_t count = 0;
    for (const std::int64_t size : sizes) {
        total += size;
        if (total > bytes_left && !(count == 0 && first_anyway)) break;
        ++count;
    }
    return count;
}

}  // namespace idem::relay
