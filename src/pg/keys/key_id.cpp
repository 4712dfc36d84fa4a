#include "pg/keys/key_id.hpp"

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

}  // namespace idem::pg
