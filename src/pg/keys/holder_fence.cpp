#include "pg/keys/holder_fence.hpp"

#include "core/error.hpp"
#include "pg/stats/metrics.hpp"

namespace idem::pg {

namespace {

const char* call_name(HolderCall call) {
    switch (call) {
        case HolderCall::Complete: return "complete";
        case HolderCall::Fail: return "fail";
        case HolderCall::Heartbeat: return "heartbeat";
        case HolderCall::Release: return "release";
        case HolderCall::AssertOwner: return "assert_owner";
        case HolderCall::Step: return "step";
    }
    return "call";
}

[[noreturn]] void raise_no_such_key(const KeyId& id) {
    throw_error(sqlstate::no_such_key, "idempotency key \"%s\" does not exist in scope \"%s\"",
                text_to_cstring(id.key), text_to_cstring(id.scope));
}

[[noreturn]] void raise_refused(FenceVerdict verdict, HolderCall call, const KeyId& id,
                                std::int64_t token, Status status) {
    const char* key = text_to_cstring(id.key);
    const char* scope = text_to_cstring(id.scope);
    if (call == HolderCall::AssertOwner)
        throw_error(fence_sqlstate(verdict),
                    "token %lld does not own key \"%s\" in scope \"%s\" (the key is %s%s)",
                    static_cast<long long>(token), key, scope, status_label(status),
                    status == Status::Processing ? " under another token" : "");
    if (verdict == FenceVerdict::StaleToken)
        throw_error(fence_sqlstate(verdict),
                    "stale token %lld for key \"%s\" in scope \"%s\": the key was claimed "
                    "again, released, or never had this token",
                    static_cast<long long>(token), key, scope);
    throw_error(fence_sqlstate(verdict), "key \"%s\" in scope \"%s\" is %s: %s is not allowed",
                key, scope, status_label(status), call_name(call));
}

}  // namespace

// Checks the holder's token on the key read. Returns the verdict when it
// lets the call go on (Proceed, or AlreadyCompleted for complete). Any
// other answer is given on the key's newest version, locked, as a locking
// read of the key gives it (a concurrent change may be settling the key);
// a refusal closes `row` and raises.
FenceVerdict check_as_holder(HolderCall call, const KeyId& id, std::int64_t token,
                             StoredKey* stored, KeyRow* row) {
    FenceVerdict verdict = check_fence(call, stored->state, token);
    if (verdict == FenceVerdict::Proceed) return verdict;
    if (!row->table.found_locked) {
        if (!lock_found_key(row, stored)) {
            close_key(row);
            raise_no_such_key(id);
        }
        verdict = check_fence(call, stored->state, token);
    }
    if (verdict == FenceVerdict::StaleToken || verdict == FenceVerdict::WrongState) {
        close_key(row);
        if (verdict == FenceVerdict::StaleToken) count_answer(Counter::StaleTokens);
        raise_refused(verdict, call, id, token, stored->state.status);
    }
    return verdict;
}

// Finds the key for a holder's call (locked at once when `lock`, else as
// UPDATE finds it) and checks the token.
FenceVerdict find_as_holder(HolderCall call, const KeyId& id, std::int64_t token, bool lock,
                            StoredKey* stored, KeyRow* row) {
    const bool found =
        lock ? lock_key(id, RowLock::ForUpdate, stored, row) : find_key_to_change(id, stored, row);
    if (!found) {
        close_key(row);
        raise_no_such_key(id);
    }
    return check_as_holder(call, id, token, stored, row);
}

// After a change that did not happen: Again means the row changed
// concurrently (its newest version, locked, is decided on again); any
// other answer ends the call.
FenceVerdict after_change(Change change, HolderCall call, const KeyId& id, std::int64_t token,
                          StoredKey* stored, KeyRow* row) {
    if (change == Change::Gone) {
        close_key(row);
        raise_no_such_key(id);
    }
    if (change == Change::Skipped) {
        close_key(row);
        elog(ERROR, "idempotency: %s of key with token %lld found no row to change",
             call_name(call), static_cast<long long>(token));
    }
    reread_key(row, stored);
    return check_as_holder(call, id, token, stored, row);
}

}  // namespace idem::pg
