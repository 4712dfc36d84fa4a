#include "core/status.hpp"
#include "core/cpp_only.hpp"

namespace idem {

namespace {
constexpr const char* kStatusLabels[kStatusCount] = {
    "RECEIVED", "PROCESSING", "COMPLETED", "FAILED_RETRYABLE", "FAILED_FINAL"};
}

const char* status_label(Status status) {
    return kStatusLabels[static_cast<int>(status)];
}

const char* outcome_label(Outcome outcome) {
    switch (outcome) {
        case Outcome::Registered: return "registered";
        case Outcome::Claimed: return "claimed";
        case Outcome::Completed: return "completed";
        case Outcome::InProgress: return "in_progress";
        case Outcome::RetryLater: return "retry_later";
        case Outcome::Failed: return "failed";
        case Outcome::Mismatch: return "mismatch";
    }
    return "unknown";
}

std::optional<Status> parse_status(std::string_view label) {
    for (int i = 0; i < kStatusCount; ++i)
        if (label == kStatusLabels[i]) return static_cast<Status>(i);
    return std::nullopt;
}

}  // namespace idem
