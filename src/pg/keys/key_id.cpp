#include "pg/keys/key_id.hpp"

#include "core/error.hpp"
#include "pg/boundary/args.hpp"
#include "pg/waiting/wakeup.hpp"

namespace idem::pg {

KeyIdValues key_id_values(const KeyId& id) {
    return KeyIdValues{{PointerGetDatum(id.scope), PointerGetDatum(id.key)}};
}

KeyId key_id_arg(FunctionCallInfo fcinfo, int key_at, int scope_at) {
    KeyId id;
    id.key = name_arg(fcinfo, key_at, "key");
    id.scope = scope_arg(fcinfo, scope_at);
    return id;
}

std::uint64_t key_wake_channel(const KeyId& id) {
    return wake_channel(WaitTopic::Key, {id.scope, id.key});
}

void throw_changed_since_snapshot(const KeyId& id, const char* how) {
    throw_error("40001",
                "could not serialize access to key \"%s\" in scope \"%s\": %s after this "
                "transaction's snapshot; retry the transaction, or claim under READ COMMITTED",
                text_to_cstring(id.key), text_to_cstring(id.scope), how);
}

}  // namespace idem::pg
