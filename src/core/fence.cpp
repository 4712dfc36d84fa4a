#include "core/fence.hpp"

#include "core/error.hpp"
#include "core/cpp_only.hpp"

namespace idem {

FenceVerdict check_fence(HolderCall call, const KeyState& key, std::int64_t token) {
    const bool current = key.token && *key.token == token;
    const bool processing = key.status == Status::Processing;
    if (call == HolderCall::AssertOwner)
        return current && processing ? FenceVerdict::Proceed : FenceVerdict::StaleToken;
    if (!current) return FenceVerdict::StaleToken;
    if (processing) return FenceVerdict::Proceed;
    if (call != HolderCall::Complete && call != HolderCall::Step) return FenceVerdict::WrongState;

    // The one move from a key that is not PROCESSING: a holder whose lease
    // expired keeps its token until the key is claimed again, and its late
    // complete still records the work it did, and its steps the steps it
    // finished (the next holder then skips them).
    const bool expired_under_holder =
        key.lease_expired &&
        (key.status == Status::FailedRetryable || key.status == Status::FailedFinal);
    if (expired_under_holder) return FenceVerdict::Proceed;
    if (key.status == Status::Completed && call == HolderCall::Complete)
        return FenceVerdict::AlreadyCompleted;
    return FenceVerdict::WrongState;
}

const char* fence_sqlstate(FenceVerdict verdict) {
    return verdict == FenceVerdict::StaleToken ? sqlstate::stale_token : sqlstate::wrong_state;
}

}  // namespace idem
