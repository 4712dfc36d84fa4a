#include "pg/runtime/background_session.hpp"

#include "pg/access/subscription_target.hpp"
#include "pg/boundary/postgres.hpp"

extern "C" {
#include "access/xact.h"
#include "utils/guc.h"
}

namespace idem::pg {

void use_background_session_settings() {
    SetConfigOption("default_transaction_isolation", "read committed", PGC_SUSET,
                    PGC_S_OVERRIDE);
    SetConfigOption("lock_timeout", "0", PGC_SUSET, PGC_S_OVERRIDE);
}

Fence database_fence() {
    if (DefaultXactReadOnly) return Fence::ReadOnly;
    return feeding_subscription() != nullptr ? Fence::Subscribed : Fence::None;
}

}  // namespace idem::pg
