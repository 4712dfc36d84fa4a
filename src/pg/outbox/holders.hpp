// Whether another transaction that is still running holds an outbox row: it
// locked or changed the version a claim read (xmax), and only conflicting
// locks are taken on live events (claims, nacks, acks, the sweep), so the
// claim's lock would skip it. Asking the procarray once per holder is far
// cheaper than trying the lock; the lock still decides for every other row.
// Consecutive rows usually share their holder (one relay's batch).
#pragma once

#include "pg/boundary/postgres.hpp"

extern "C" {
#include "storage/procarray.h"
}

namespace idem::pg {

struct Holders {
    TransactionId last = InvalidTransactionId;
    bool last_running = false;
};

inline bool held_by_other(Holders* holders, TransactionId xmax) {
    if (!TransactionIdIsNormal(xmax)) return false;
    if (xmax != holders->last) {
        holders->last = xmax;
        holders->last_running =
            !TransactionIdIsCurrentTransactionId(xmax) && TransactionIdIsInProgress(xmax);
    }
    return holders->last_running;
}

}  // namespace idem::pg
