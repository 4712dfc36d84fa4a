#include "pg/outbox/held.hpp"

#include <cstring>

#include "pg/access/row_access.hpp"
#include "pg/boundary/arrays.hpp"
#include "pg/boundary/guard.hpp"
#include "pg/boundary/owner_scope.hpp"
#include "pg/outbox/ready_floor.hpp"
#include "pg/outbox/store.hpp"
#include "pg/runtime/due_table.hpp"

extern "C" {
#include "access/xact.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
}

namespace idem::pg {

namespace {

struct HeldEvent {
    std::int64_t id;  // the hash key: first member
    int write;        // index into writes
    ItemPointerData version;  // the row version the claim locked (invalid: not known)
    bool follower;            // it follows a head in its run
    // The subtransaction whose lock holds the event, and the one whose ack
    // or nack settled it (none while held): a rolled-back subtransaction
    // takes back what it did, a committed one hands it to its parent.
    SubTransactionId locked_in;
    SubTransactionId settled_in;
};

// All in TopTransactionContext, gone with the transaction.
HTAB* held = nullptr;
ClaimWrite* writes = nullptr;
int write_count = 0;
int write_capacity = 0;
long unsettled = 0;
Oid writer = InvalidOid;  // the claiming function's owner writes the claims

void forget_all() {
    held = nullptr;
    writes = nullptr;
    write_count = write_capacity = 0;
    unsettled = 0;
    writer = InvalidOid;
}

int add_write(const ClaimWrite& write) {
    MemoryContext const old = MemoryContextSwitchTo(TopTransactionContext);
    if (write_count == write_capacity) {
        write_capacity = write_capacity == 0 ? 4 : write_capacity * 2;
        writes = static_cast<ClaimWrite*>(
            writes == nullptr ? palloc(sizeof(ClaimWrite) * write_capacity)
                              : repalloc(writes, sizeof(ClaimWrite) * write_capacity));
    }
    ClaimWrite& copy = writes[write_count];
    copy = write;
    copy.relay = reinterpret_cast<const text*>(
        DatumGetPointer(datumCopy(PointerGetDatum(write.relay), false, -1)));
    MemoryContextSwitchTo(old);
    return write_count++;
}

HeldEvent* find(std::int64_t id) {
    if (held == nullptr) return nullptr;
    return static_cast<HeldEvent*>(hash_search(held, &id, HASH_FIND, nullptr));
}

// Writes the claims of the held events no ack or nack settled.
void write_unsettled() {
    const int count = static_cast<int>(unsettled);
    Datum* ids = static_cast<Datum*>(palloc(sizeof(Datum) * count));
    Datum* leases = static_cast<Datum*>(palloc(sizeof(Datum) * count));
    Datum* relays = static_cast<Datum*>(palloc(sizeof(Datum) * count));
    Datum* times = static_cast<Datum*>(palloc(sizeof(Datum) * count));
    Datum* caps = static_cast<Datum*>(palloc(sizeof(Datum) * count));
    bool* followers = static_cast<bool*>(palloc(sizeof(bool) * count));
    int n = 0;
    HASH_SEQ_STATUS scan;
    hash_seq_init(&scan, held);
    while (HeldEvent* event = static_cast<HeldEvent*>(hash_seq_search(&scan))) {
        if (event->settled_in != InvalidSubTransactionId) continue;
        const ClaimWrite& write = writes[event->write];
        ids[n] = Int64GetDatum(event->id);
        leases[n] = TimestampTzGetDatum(write.lease_until);
        note_due_on_commit(DueKind::EventLease, write.lease_until);
        relays[n] = PointerGetDatum(write.relay);
        caps[n] = Int32GetDatum(write.max_attempts);
        followers[n] = event->follower;
        times[n++] = TimestampTzGetDatum(write.claimed_at);
    }
    const ClaimedEvents claimed{ids, leases, relays, times, caps, followers, n};
    const OwnerScope scope = enter_owner_scope_of(writer);
    write_claims(claimed);
    fire_triggers_deferred_to_commit();
    leave_owner_scope(scope);
}

void on_transaction_event(XactEvent event, void*) {
    if (held == nullptr) return;
    switch (event) {
    case XACT_EVENT_PRE_COMMIT:
    case XACT_EVENT_PRE_PREPARE:
        if (unsettled > 0) write_unsettled();
        unsettled = 0;
        break;
    case XACT_EVENT_COMMIT:
    case XACT_EVENT_ABORT:
    case XACT_EVENT_PREPARE:
        forget_all();
        break;
    default:
        break;
    }
}

void on_subtransaction_event(SubXactEvent event, SubTransactionId mine, SubTransactionId parent,
                             void*) {
    if (held == nullptr) return;
    if (event != SUBXACT_EVENT_COMMIT_SUB && event != SUBXACT_EVENT_ABORT_SUB) return;
    const bool committed = event == SUBXACT_EVENT_COMMIT_SUB;
    HASH_SEQ_STATUS scan;
    hash_seq_init(&scan, held);
    while (HeldEvent* entry = static_cast<HeldEvent*>(hash_seq_search(&scan))) {
        if (entry->locked_in == mine) {
            if (committed) {
                entry->locked_in = parent;
            } else {
                // Its lock is gone with the subtransaction, and so is any
                // settling write made inside it.
                if (entry->settled_in == InvalidSubTransactionId) --unsettled;
                hash_search(held, &entry->id, HASH_REMOVE, nullptr);
                continue;
            }
        }
        if (entry->settled_in == mine) {
            if (committed) {
                entry->settled_in = parent;
            } else {
                entry->settled_in = InvalidSubTransactionId;
                ++unsettled;
            }
        }
    }
}

}  // namespace

void hold_events(const ClaimWrite& write, const std::int64_t* ids, const ItemPointerData* versions,
                 const bool* followers, int count) {
    if (count == 0) return;
    if (held == nullptr) {
        HASHCTL control;
        std::memset(&control, 0, sizeof(control));
        control.keysize = sizeof(std::int64_t);
        control.entrysize = sizeof(HeldEvent);
        control.hcxt = TopTransactionContext;
        held = hash_create("idempotency held outbox events", 256, &control,
                           HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
    }
    writer = GetUserId();
    // Written before the commit: in flight, ready again when the lease ends.
    note_ready_written(write.lease_until);
    const int index = add_write(write);
    const SubTransactionId current = GetCurrentSubTransactionId();
    for (int i = 0; i < count; ++i) {
        bool found = false;
        HeldEvent* entry = static_cast<HeldEvent*>(hash_search(held, &ids[i], HASH_ENTER, &found));
        // A claim hands out only events this transaction does not hold, so
        // an entry found was settled (nacked with no delay) and is claimed
        // anew. Should this claim's subtransaction roll back, the event is
        // forgotten, and with it any claim before it that the rolled-back
        // nack had settled: the event then stays pending, as if never
        // handed out, which delivers it again, never loses it.
        if (!found || entry->settled_in != InvalidSubTransactionId) ++unsettled;
        entry->write = index;
        if (versions != nullptr)
            ItemPointerCopy(&versions[i], &entry->version);
        else
            ItemPointerSetInvalid(&entry->version);
        entry->follower = followers != nullptr && followers[i];
        entry->locked_in = current;
        entry->settled_in = InvalidSubTransactionId;
    }
}

bool holds_any() { return unsettled > 0; }

const text* held_relay(std::int64_t id) {
    const HeldEvent* entry = find(id);
    if (entry == nullptr || entry->settled_in != InvalidSubTransactionId) return nullptr;
    return writes[entry->write].relay;
}

bool holds(std::int64_t id) {
    const HeldEvent* entry = find(id);
    return entry != nullptr && entry->settled_in == InvalidSubTransactionId;
}

const ClaimWrite* settle_held(std::int64_t id, ItemPointerData* version) {
    HeldEvent* entry = find(id);
    if (entry == nullptr || entry->settled_in != InvalidSubTransactionId) return nullptr;
    if (version != nullptr) ItemPointerCopy(&entry->version, version);
    entry->settled_in = GetCurrentSubTransactionId();
    --unsettled;
    return &writes[entry->write];
}

Datum held_ids() {
    Datum* ids = static_cast<Datum*>(palloc(sizeof(Datum) * (unsettled + 1)));
    int n = 0;
    if (held != nullptr) {
        HASH_SEQ_STATUS scan;
        hash_seq_init(&scan, held);
        while (HeldEvent* entry = static_cast<HeldEvent*>(hash_seq_search(&scan)))
            if (entry->settled_in == InvalidSubTransactionId) ids[n++] = Int64GetDatum(entry->id);
    }
    return int8_array(ids, n);
}

void install_outbox_held_callbacks() {
    register_guarded_callback(on_transaction_event);
    register_guarded_callback(on_subtransaction_event);
}

}  // namespace idem::pg
