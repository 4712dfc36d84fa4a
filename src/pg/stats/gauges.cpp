#include "pg/stats/gauges.hpp"

#include <algorithm>
#include <cstring>

#include "core/validate.hpp"
#include "pg/access/extension_objects.hpp"
#include "pg/boundary/guard.hpp"
#include "pg/stats/gauge_table.hpp"

extern "C" {
#include "access/transam.h"
#include "access/twophase.h"
#include "port/atomics.h"
#include "storage/lwlock.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
}

namespace idem::pg {

namespace {

constexpr char kTrancheName[] = "idempotency gauges";
static_assert(kEntryValues == kGaugeValues);

// The one recount that may run at a time, and the snapshot it counts with:
// a transaction that commits meanwhile adds its adjustments only when that
// snapshot does not see it.
struct Recount {
    Oid database;  // InvalidOid: none runs
    TransactionId xmin;
    TransactionId xmax;
    int xcnt;
    TransactionId xip[FLEXIBLE_ARRAY_MEMBER];
};

// A prepared transaction's adjustments wait here until it ends: applied if
// it committed, dropped if it rolled back. Each prepared transaction of a
// backend with the library has a marker (family 'p', no values) and one
// entry per name it adjusted; all in one pool under the lock.
constexpr char kPreparedFamily = 'p';
constexpr int kParkedPerPrepared = 16;  // the pool's room per prepared transaction

struct Parked {
    TransactionId xid;  // InvalidTransactionId: free
    Oid tables[2];      // the keys and outbox tables it changed
    GaugeKey key;       // the database, family and name (the marker: family 'p')
    std::int64_t values[kGaugeValues];
    Micros latest;
};

struct ParkedPool {
    pg_atomic_uint32 used;  // entries in use: read without the lock, a hint
    int capacity;
    Parked entries[FLEXIBLE_ARRAY_MEMBER];
};

// A committing transaction with adjustments, in its backend's slot from
// PRE_COMMIT until its commit callback has run. PostgreSQL runs that
// callback after the commit became visible: a recount whose snapshot sees
// the transaction in between counts its rows, and may even end before the
// callback. It marks the transaction counted, and the callback then adds
// nothing.
// The state is one word, so that a recount marks the transaction it read
// and never the next one of that backend: 0 (none), or the xid shifted left
// by one with the low bit set once a recount's snapshot saw it. A recount
// marks only its own database's: another database's commit is not in its
// counts.
struct CommittingSlot {
    pg_atomic_uint64 state;
    pg_atomic_uint32 database;  // written before the state
};

constexpr std::uint64_t announced_state(TransactionId xid) {
    return static_cast<std::uint64_t>(xid) << 1;
}
constexpr std::uint64_t kCounted = 1;

LWLock* lock = nullptr;
Recount* recount = nullptr;
ParkedPool* parked = nullptr;
CommittingSlot* committing = nullptr;  // one per backend (MaxBackends)

int parked_capacity() { return max_prepared_xacts * (1 + kParkedPerPrepared); }

Size parked_size() {
    return add_size(offsetof(ParkedPool, entries),
                    mul_size(sizeof(Parked), static_cast<Size>(parked_capacity())));
}

int max_in_progress() { return MaxBackends + max_prepared_xacts; }

Size recount_size() {
    return add_size(offsetof(Recount, xip),
                    mul_size(sizeof(TransactionId), static_cast<Size>(max_in_progress())));
}

Size committing_size() { return mul_size(sizeof(CommittingSlot), static_cast<Size>(MaxBackends)); }

// This backend's slot (none for an auxiliary process, or without shared memory).
CommittingSlot* my_committing_slot() {
    const int number = my_proc_number();
    return committing != nullptr && number >= 0 && number < MaxBackends ? &committing[number]
                                                                         : nullptr;
}

void add_signed(pg_atomic_uint64* value, std::int64_t delta) {
    pg_atomic_fetch_add_u64(value, static_cast<std::uint64_t>(delta));
}

void raise_latest(pg_atomic_uint64* value, Micros at) {
    std::uint64_t seen = pg_atomic_read_u64(value);
    const std::uint64_t wanted = static_cast<std::uint64_t>(std::max<Micros>(at, 1));
    while (wanted > seen && !pg_atomic_compare_exchange_u64(value, &seen, wanted)) {
    }
}

// Whether the running recount's snapshot sees transaction `xid` (committed).
bool recount_sees(TransactionId xid) {
    if (!TransactionIdIsValid(xid)) return false;
    if (TransactionIdPrecedes(xid, recount->xmin)) return true;
    if (!TransactionIdPrecedes(xid, recount->xmax)) return false;
    for (int i = 0; i < recount->xcnt; ++i)
        if (TransactionIdEquals(recount->xip[i], xid)) return false;
    return true;
}

// --- this transaction's adjustments ----------------------------------------------

// Keyed by name and subtransaction nesting level.
struct PendingKey {
    GaugeKey key;
    int level;
};

struct Pending {
    PendingKey id;
    std::int64_t values[kGaugeValues];
    Micros latest;
    bool applied;  // at commit: added in the shared pass
};

// Made once per backend and emptied at each transaction's end, so that a
// transaction pays no allocation for its few adjustments.
HTAB* pending = nullptr;
bool pending_any = false;
Oid pending_tables[2] = {InvalidOid, InvalidOid};
TransactionId committing_xid = InvalidTransactionId;
// committing_xid is in this backend's CommittingSlot.
bool announced = false;
// The transaction truncated a counted table: its commit makes the counts unknown.
bool truncated = false;
// The entry the last adjustment went to: a claim or an ack adjusts one
// topic's counts once per event, and comparing a key of 268 bytes costs
// less than hashing it for a lookup. Forgotten whenever entries are removed.
Pending* last_pending = nullptr;
// The entries of subtransactions (level 2 and deeper), in the order they
// were made: a subtransaction's are the last ones when it ends (its own
// subtransactions' were handed to it or dropped before), so its end takes
// them from the tail instead of scanning every entry of the transaction.
// Each points into `pending`, whose entries stay where they are until
// removed. In TopMemoryContext, reused.
Pending** nested = nullptr;
int nested_count = 0;
int nested_capacity = 0;

void push_nested(Pending* entry) {
    if (nested_count == nested_capacity) {
        nested_capacity = nested_capacity == 0 ? 16 : nested_capacity * 2;
        nested = static_cast<Pending**>(
            nested == nullptr
                ? MemoryContextAlloc(TopMemoryContext, sizeof(Pending*) * nested_capacity)
                : repalloc(nested, sizeof(Pending*) * nested_capacity));
    }
    nested[nested_count++] = entry;
}

Pending* enter_pending(const PendingKey& id) {
    bool found = false;
    auto* entry = static_cast<Pending*>(hash_search(pending, &id, HASH_ENTER, &found));
    if (!found) {
        std::memset(entry->values, 0, sizeof entry->values);
        entry->latest = 0;
        entry->applied = false;
        if (id.level > 1) push_nested(entry);
    }
    return entry;
}

Pending* pending_entry(GaugeFamily family, const text* name) {
    if (pending == nullptr) {
        HASHCTL control;
        std::memset(&control, 0, sizeof control);
        control.keysize = sizeof(PendingKey);
        control.entrysize = sizeof(Pending);
        control.hcxt = TopMemoryContext;
        pending = hash_create("idempotency pending gauges", 16, &control,
                              HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
    }
    if (!pending_any) {
        pending_any = true;
        const ExtensionObjects& objects = extension_objects();
        pending_tables[0] = objects.keys;
        pending_tables[1] = objects.outbox;
    }
    PendingKey id;
    std::memset(&id, 0, sizeof id);
    make_key(&id.key, MyDatabaseId, static_cast<char>(family), VARDATA_ANY(name),
             VARSIZE_ANY_EXHDR(name));
    id.level = GetCurrentTransactionNestLevel();
    // Keys are zeroed before they are filled: they compare as bytes.
    if (last_pending == nullptr || std::memcmp(&last_pending->id, &id, sizeof id) != 0)
        last_pending = enter_pending(id);
    return last_pending;
}

// At PRE_COMMIT, before the commit is visible: the slot holds the xid
// before any recount can see the transaction.
void announce_committing(TransactionId xid) {
    CommittingSlot* slot = my_committing_slot();
    if (slot == nullptr || !TransactionIdIsValid(xid)) return;
    pg_atomic_write_u32(&slot->database, MyDatabaseId);
    pg_write_barrier();
    pg_atomic_write_u64(&slot->state, announced_state(xid));
    announced = true;
}

void withdraw_committing() {
    if (!announced) return;
    pg_atomic_write_u64(&my_committing_slot()->state, 0);
    announced = false;
}

// Whether a recount saw this transaction committed (its rows are counted).
bool counted_by_a_recount() {
    return announced && (pg_atomic_read_u64(&my_committing_slot()->state) & kCounted) != 0;
}

// At a recount's start, under the exclusive lock: the announced
// transactions of its database that its snapshot sees committed are marked
// counted.
void mark_counted_commits() {
    for (int i = 0; i < MaxBackends; ++i) {
        std::uint64_t state = pg_atomic_read_u64(&committing[i].state);
        pg_read_barrier();
        const auto xid = static_cast<TransactionId>(state >> 1);
        if (state == 0 || (state & kCounted) != 0 ||
            pg_atomic_read_u32(&committing[i].database) != recount->database || !recount_sees(xid))
            continue;
        // Fails only when the backend has moved on from that transaction.
        (void)pg_atomic_compare_exchange_u64(&committing[i].state, &state, state | kCounted);
    }
}

void forget_pending() {
    last_pending = nullptr;
    if (pending_any) {
        HASH_SEQ_STATUS scan;
        hash_seq_init(&scan, pending);
        while (auto* entry = static_cast<Pending*>(hash_seq_search(&scan)))
            hash_search(pending, &entry->id, HASH_REMOVE, nullptr);  // allowed during a scan
    }
    pending_any = false;
    nested_count = 0;
    withdraw_committing();
    committing_xid = InvalidTransactionId;
    truncated = false;
}

void add_to(GaugeEntry* entry, const std::int64_t values[kGaugeValues], Micros latest) {
    for (int i = 0; i < kGaugeValues; ++i)
        if (values[i] != 0) add_signed(&entry->values[i], values[i]);
    if (latest != 0) raise_latest(&entry->latest, latest);
}

// Whether the changes of transaction `xid` to `tables` go into the counts
// of `database_id` now: known for the same tables, or being recounted by a
// snapshot that does not see that transaction. Under the lock.
bool counts_take(Oid database_id, const Oid tables[2], TransactionId xid) {
    GaugeEntry* database = database_entry(database_id, false);
    if (database == nullptr) return false;
    if (pg_atomic_read_u64(&database->values[1]) != tables[0] ||
        pg_atomic_read_u64(&database->values[2]) != tables[1])
        return false;
    switch (state_of(database)) {
        case CountState::Known: return true;
        case CountState::Counting:
        case CountState::Stale:
            return recount->database == database_id && !recount_sees(xid);
        case CountState::Unknown:
        case CountState::Overflowed: return false;
    }
    return false;
}

// The same for this transaction, committing: never when a recount has
// counted its rows already (even one that has ended since).
bool counts_take_changes() {
    return !counted_by_a_recount() && counts_take(MyDatabaseId, pending_tables, committing_xid);
}

// At commit (or prepare): nothing here may raise an error. Names already
// known are added to under the shared lock; new ones are made under the
// exclusive lock. When the table is full the database with the most names
// overflows (pg/stats/gauge_table.hpp); this one's changes stop there if it
// was this one, whose counts then come from its tables.
void apply_pending() {
    if (lock == nullptr || !pending_any) return;
    bool missing = false;
    HASH_SEQ_STATUS scan;
    LWLockAcquire(lock, LW_SHARED);
    if (counts_take_changes()) {
        hash_seq_init(&scan, pending);
        while (auto* change = static_cast<Pending*>(hash_seq_search(&scan))) {
            GaugeEntry* entry = find_name(change->id.key.database, change->id.key.family,
                                          change->id.key.name, std::strlen(change->id.key.name));
            if (entry == nullptr) {
                missing = true;
                continue;
            }
            add_to(entry, change->values, change->latest);
            change->applied = true;
        }
    }
    LWLockRelease(lock);
    if (!missing) return;
    LWLockAcquire(lock, LW_EXCLUSIVE);
    if (counts_take_changes()) {
        hash_seq_init(&scan, pending);
        while (auto* change = static_cast<Pending*>(hash_seq_search(&scan))) {
            if (change->applied) continue;
            GaugeEntry* entry = enter_name(change->id.key.database, change->id.key.family,
                                           change->id.key.name, std::strlen(change->id.key.name));
            if (entry == nullptr) {
                hash_seq_term(&scan);
                break;
            }
            add_to(entry, change->values, change->latest);
        }
    }
    LWLockRelease(lock);
    log_overflows(lock);
}

// --- prepared transactions ------------------------------------------------------

// The counts of `database_id` become unknown (a recount is due); one
// running now ends unknown. Under the exclusive lock.
void make_unknown(Oid database_id) {
    GaugeEntry* entry = database_entry(database_id, false);
    if (entry == nullptr) return;
    if (state_of(entry) == CountState::Known) set_state(entry, CountState::Unknown);
    if (state_of(entry) == CountState::Counting) set_state(entry, CountState::Stale);
}

void free_parked(Parked* entry) {
    entry->xid = InvalidTransactionId;
    pg_atomic_fetch_sub_u32(&parked->used, 1);
}

// At PREPARE TRANSACTION (nothing here may raise an error): the marker of
// transaction `xid` and its adjustments, parked until it ends. Without room
// for all of them, none is parked and the database's counts become unknown:
// the recount that follows finds the prepared transaction unparked and
// stays unknown until it has ended.
void park_pending(TransactionId xid) {
    if (lock == nullptr || parked == nullptr || !TransactionIdIsValid(xid)) return;
    const long changes = pending_any ? hash_get_num_entries(pending) : 0;
    LWLockAcquire(lock, LW_EXCLUSIVE);
    int free_count = 0;
    for (int i = 0; i < parked->capacity; ++i)
        if (!TransactionIdIsValid(parked->entries[i].xid)) ++free_count;
    // A TRUNCATE cannot be applied as adjustments: parked without it, the
    // transaction would seem accounted for.
    if (free_count < 1 + changes || truncated) {
        if (changes > 0 || truncated) make_unknown(MyDatabaseId);
        LWLockRelease(lock);
        return;
    }
    int next = 0;
    auto take = [&]() -> Parked* {
        while (TransactionIdIsValid(parked->entries[next].xid)) ++next;
        Parked* entry = &parked->entries[next];
        std::memset(entry, 0, sizeof *entry);
        entry->xid = xid;
        entry->tables[0] = pending_tables[0];
        entry->tables[1] = pending_tables[1];
        pg_atomic_fetch_add_u32(&parked->used, 1);
        return entry;
    };
    make_key(&take()->key, MyDatabaseId, kPreparedFamily, "", 0);
    if (changes > 0) {
        HASH_SEQ_STATUS scan;
        hash_seq_init(&scan, pending);
        while (auto* change = static_cast<Pending*>(hash_seq_search(&scan))) {
            Parked* entry = take();
            entry->key = change->id.key;
            std::memcpy(entry->values, change->values, sizeof entry->values);
            entry->latest = change->latest;
        }
    }
    LWLockRelease(lock);
}

// Prepared transactions that ended since they were parked: a committed
// one's adjustments are applied as its commit would have applied them, a
// rolled-back one's dropped. Any backend may settle any database's.
void settle_prepared() {
    if (parked == nullptr || pg_atomic_read_u32(&parked->used) == 0) return;
    TransactionId xids[64];
    int count = 0;
    LWLockAcquire(lock, LW_SHARED);
    for (int i = 0; i < parked->capacity && count < 64; ++i)
        if (TransactionIdIsValid(parked->entries[i].xid) &&
            parked->entries[i].key.family == kPreparedFamily)
            xids[count++] = parked->entries[i].xid;
    LWLockRelease(lock);
    for (int x = 0; x < count; ++x) {
        if (TransactionIdIsInProgress(xids[x])) continue;
        const bool committed = TransactionIdDidCommit(xids[x]);
        LWLockAcquire(lock, LW_EXCLUSIVE);
        for (int i = 0; i < parked->capacity; ++i) {
            Parked* entry = &parked->entries[i];
            if (entry->xid != xids[x]) continue;
            if (committed && entry->key.family != kPreparedFamily &&
                counts_take(entry->key.database, entry->tables, entry->xid))
                if (GaugeEntry* gauge = enter_name(entry->key.database, entry->key.family,
                                                   entry->key.name, std::strlen(entry->key.name)))
                    add_to(gauge, entry->values, entry->latest);
            free_parked(entry);
        }
        LWLockRelease(lock);
    }
    log_overflows(lock);
}

// At the start of a recount of this database, under the exclusive lock:
// what its snapshot sees ended is counted from the tables, so those parked
// adjustments go. True when every prepared transaction of `prepared` (this
// database's, listed before the snapshot) is parked: otherwise one prepared
// before the server started (or without room) may change the tables
// unseen, and the counts stay unknown until it has ended.
bool recount_settles_parked(const TransactionId* prepared, int prepared_count) {
    if (parked == nullptr) return prepared_count == 0;
    for (int i = 0; i < parked->capacity; ++i) {
        Parked* entry = &parked->entries[i];
        if (TransactionIdIsValid(entry->xid) && entry->key.database == MyDatabaseId &&
            recount_sees(entry->xid))
            free_parked(entry);
    }
    for (int p = 0; p < prepared_count; ++p) {
        bool found = false;
        for (int i = 0; i < parked->capacity && !found; ++i)
            found = parked->entries[i].xid == prepared[p] &&
                    parked->entries[i].key.family == kPreparedFamily;
        if (!found) return false;
    }
    return true;
}

// At a subtransaction's end its adjustments (the tail of `nested`) leave
// `pending`; a committed one's go to its parent. Each entry makes at most
// one parent entry, pushed at or before its own slot, which was read by
// then: the tail is walked in place, with no copy of it.
void on_subtransaction_end(SubXactEvent event, SubTransactionId, SubTransactionId, void*) {
    if (!pending_any) return;
    if (event != SUBXACT_EVENT_COMMIT_SUB && event != SUBXACT_EVENT_ABORT_SUB) return;
    const int level = GetCurrentTransactionNestLevel();
    if (nested_count == 0 || nested[nested_count - 1]->id.level < level) return;
    last_pending = nullptr;
    const int end = nested_count;
    while (nested_count > 0 && nested[nested_count - 1]->id.level >= level) --nested_count;
    for (int i = nested_count; i < end; ++i) {
        Pending* child = nested[i];
        if (event != SUBXACT_EVENT_COMMIT_SUB) {
            hash_search(pending, &child->id, HASH_REMOVE, nullptr);
            continue;
        }
        // What the parent needs, read before the child's entry is freed.
        PendingKey id = child->id;
        std::int64_t values[kGaugeValues];
        std::memcpy(values, child->values, sizeof values);
        const Micros latest = child->latest;
        hash_search(pending, &id, HASH_REMOVE, nullptr);
        id.level = level - 1;
        Pending* parent = enter_pending(id);
        for (int v = 0; v < kGaugeValues; ++v) parent->values[v] += values[v];
        parent->latest = std::max(parent->latest, latest);
    }
}

// This backend runs a recount: an abort before its end leaves the counts unknown.
bool recounting = false;

void abandon_recount() {
    if (!recounting) return;
    LWLockAcquire(lock, LW_EXCLUSIVE);
    if (GaugeEntry* database = database_entry(MyDatabaseId, false))
        set_state(database, CountState::Unknown);
    if (recount->database == MyDatabaseId) recount->database = InvalidOid;
    LWLockRelease(lock);
    recounting = false;
}

void on_transaction_end(XactEvent event, void*) {
    switch (event) {
        case XACT_EVENT_PRE_COMMIT:
            if (pending_any) {
                committing_xid = GetTopTransactionIdIfAny();
                announce_committing(committing_xid);
            }
            return;
        case XACT_EVENT_PRE_PREPARE:
            // Every prepared transaction is parked, with or without
            // adjustments (see recount_settles_parked); the room of those
            // that ended is taken back first.
            settle_prepared();
            committing_xid = GetTopTransactionIdIfAny();
            return;
        case XACT_EVENT_COMMIT:
        case XACT_EVENT_PARALLEL_COMMIT:
            apply_pending();
            // Its commit is visible and the table still locked: a recount
            // from now on counts what the TRUNCATE left.
            if (truncated) forget_gauges(MyDatabaseId);
            break;
        case XACT_EVENT_PREPARE:
            park_pending(committing_xid);
            break;
        case XACT_EVENT_ABORT:
        case XACT_EVENT_PARALLEL_ABORT:
            abandon_recount();
            break;
        default:
            return;
    }
    forget_pending();
}

}  // namespace

void gauge_add_on_commit(GaugeFamily family, const text* name, int index, std::int64_t delta) {
    if (lock == nullptr || name == nullptr || delta == 0) return;
    pending_entry(family, name)->values[index] += delta;
}

void gauges_truncated_on_commit() { truncated = true; }

void gauge_latest_on_commit(GaugeFamily family, const text* name, Micros at) {
    if (lock == nullptr || name == nullptr) return;
    Pending* entry = pending_entry(family, name);
    entry->latest = std::max(entry->latest, at);
}

namespace {

// This database's source, under the lock.
GaugeSource source_here(const ExtensionObjects& objects) {
    GaugeEntry* database = database_entry(MyDatabaseId, false);
    if (database == nullptr)
        return database_entries_full() ? GaugeSource::Tables : GaugeSource::Unknown;
    if (state_of(database) == CountState::Overflowed) return GaugeSource::Tables;
    const bool known = state_of(database) == CountState::Known &&
                       pg_atomic_read_u64(&database->values[1]) == objects.keys &&
                       pg_atomic_read_u64(&database->values[2]) == objects.outbox;
    return known ? GaugeSource::Kept : GaugeSource::Unknown;
}

}  // namespace

GaugeSource gauge_source() {
    if (lock == nullptr) return GaugeSource::Unknown;
    const ExtensionObjects& objects = extension_objects();
    settle_prepared();
    LWLockAcquire(lock, LW_SHARED);
    const GaugeSource source = source_here(objects);
    LWLockRelease(lock);
    return source;
}

void forget_gauges(Oid database) {
    if (lock == nullptr) return;
    LWLockAcquire(lock, LW_EXCLUSIVE);
    make_unknown(database);
    LWLockRelease(lock);
}

namespace {

// A name's counts as read: copied under the lock, handed out after it.
struct CopiedRow {
    char name[kMaxNameBytes + 1];
    std::int64_t values[kGaugeValues];
    Micros latest;
};

// Copies up to `capacity` rows of `family`; returns how many there were.
int copy_rows(GaugeFamily family, CopiedRow* rows, int capacity) {
    int count = 0;
    HASH_SEQ_STATUS scan;
    hash_seq_init(&scan, gauge_entries());
    while (auto* entry = static_cast<GaugeEntry*>(hash_seq_search(&scan))) {
        if (entry->key.database != MyDatabaseId || entry->key.family != static_cast<char>(family))
            continue;
        CopiedRow row;
        row.latest = static_cast<Micros>(pg_atomic_read_u64(&entry->latest));
        bool any = row.latest != 0;
        for (int i = 0; i < kGaugeValues; ++i) {
            // Below zero only when rows written behind the functions were
            // deleted or changed through them: none is the best guess.
            row.values[i] = std::max<std::int64_t>(
                0, static_cast<std::int64_t>(pg_atomic_read_u64(&entry->values[i])));
            any = any || row.values[i] != 0;
        }
        if (!any) continue;
        if (count < capacity) {
            std::memcpy(row.name, entry->key.name, sizeof row.name);
            rows[count] = row;
        }
        ++count;
    }
    return count;
}

}  // namespace

GaugeSource read_gauges(GaugeFamily family, GaugeRowSink sink, void* context) {
    if (lock == nullptr) return GaugeSource::Unknown;
    const ExtensionObjects& objects = extension_objects();
    settle_prepared();
    int capacity = 16;
    for (;;) {
        auto* rows = static_cast<CopiedRow*>(palloc(sizeof(CopiedRow) * capacity));
        // The source is checked with the copy, under one hold of the lock:
        // an overflow between them would leave no names to copy.
        LWLockAcquire(lock, LW_SHARED);
        const GaugeSource source = source_here(objects);
        const int count = source == GaugeSource::Kept ? copy_rows(family, rows, capacity) : 0;
        LWLockRelease(lock);
        if (source != GaugeSource::Kept) {
            pfree(rows);
            return source;
        }
        if (count <= capacity) {
            for (int i = 0; i < count; ++i)
                sink(GaugeRow{rows[i].name, {rows[i].values[0], rows[i].values[1], rows[i].values[2]},
                              rows[i].latest},
                     context);
            pfree(rows);
            return GaugeSource::Kept;
        }
        pfree(rows);
        capacity = count + 16;
    }
}

Snapshot begin_recount(const TransactionId* prepared, int prepared_count) {
    if (lock == nullptr) return nullptr;
    const ExtensionObjects& objects = extension_objects();
    settle_prepared();
    LWLockAcquire(lock, LW_EXCLUSIVE);
    if (recount->database != InvalidOid) {
        LWLockRelease(lock);
        return nullptr;
    }
    // None without room for the database, nor for one that overflowed:
    // its reads count from its tables.
    GaugeEntry* database = database_entry(MyDatabaseId, true);
    if (database == nullptr || state_of(database) == CountState::Overflowed) {
        LWLockRelease(lock);
        return nullptr;
    }
    // Taken under the lock: a transaction that commits after it applies its
    // changes after this, and checks them against this snapshot.
    Snapshot snapshot = RegisterSnapshot(GetLatestSnapshot());
    recount->database = MyDatabaseId;
    recount->xmin = snapshot->xmin;
    recount->xmax = snapshot->xmax;
    recount->xcnt = std::min<int>(static_cast<int>(snapshot->xcnt), max_in_progress());
    std::memcpy(recount->xip, snapshot->xip, sizeof(TransactionId) * recount->xcnt);
    // The transactions this snapshot sees committed whose commit callbacks
    // have not run yet: counted here, their callbacks add nothing.
    mark_counted_commits();
    set_state(database, recount_settles_parked(prepared, prepared_count) ? CountState::Counting
                                                                          : CountState::Stale);
    pg_atomic_write_u64(&database->values[1], objects.keys);
    pg_atomic_write_u64(&database->values[2], objects.outbox);
    HASH_SEQ_STATUS scan;
    hash_seq_init(&scan, gauge_entries());
    while (auto* entry = static_cast<GaugeEntry*>(hash_seq_search(&scan))) {
        if (entry->key.database != MyDatabaseId || entry->key.family == kDatabaseFamily) continue;
        for (auto& value : entry->values) pg_atomic_write_u64(&value, 0);
        pg_atomic_write_u64(&entry->latest, 0);
    }
    recounting = true;
    LWLockRelease(lock);
    return snapshot;
}

void recount_expect(long names) {
    if (!recounting) return;
    LWLockAcquire(lock, LW_EXCLUSIVE);
    if (GaugeEntry* database = database_entry(MyDatabaseId, false))
        overflow_unless_fits(database, names);
    LWLockRelease(lock);
    log_overflows(lock);
}

void recount_row(GaugeFamily family, const text* name, const std::int64_t values[kGaugeValues],
                 std::optional<Micros> latest) {
    if (!recounting || name == nullptr) return;
    LWLockAcquire(lock, LW_EXCLUSIVE);
    if (GaugeEntry* entry = enter_name(MyDatabaseId, static_cast<char>(family), VARDATA_ANY(name),
                                       VARSIZE_ANY_EXHDR(name)))
        add_to(entry, values, latest.value_or(0));
    LWLockRelease(lock);
    log_overflows(lock);
}

void end_recount() {
    if (!recounting) return;
    LWLockAcquire(lock, LW_EXCLUSIVE);
    if (GaugeEntry* database = database_entry(MyDatabaseId, false))
        set_state(database, state_of(database) == CountState::Stale ? CountState::Unknown
                                                                    : CountState::Known);
    recount->database = InvalidOid;
    LWLockRelease(lock);
    recounting = false;
}

Size gauges_size() {
    return add_size(add_size(add_size(gauge_table_size(), MAXALIGN(recount_size())),
                             MAXALIGN(parked_size())),
                    MAXALIGN(committing_size()));
}

void request_gauges_lock() { RequestNamedLWLockTranche(kTrancheName, 1); }

// Under AddinShmemInitLock, from the startup hook.
void init_gauges() {
    init_gauge_table();
    bool found = false;
    recount = static_cast<Recount*>(ShmemInitStruct("idempotency gauge recount", recount_size(), &found));
    if (!found) recount->database = InvalidOid;
    parked = static_cast<ParkedPool*>(
        ShmemInitStruct("idempotency gauges of prepared transactions", parked_size(), &found));
    if (!found) {
        std::memset(parked, 0, parked_size());
        pg_atomic_init_u32(&parked->used, 0);
        parked->capacity = parked_capacity();
    }
    committing = static_cast<CommittingSlot*>(
        ShmemInitStruct("idempotency committing transactions", committing_size(), &found));
    if (!found) {
        for (int i = 0; i < MaxBackends; ++i) {
            pg_atomic_init_u64(&committing[i].state, 0);
            pg_atomic_init_u32(&committing[i].database, InvalidOid);
        }
    }
    lock = &(GetNamedLWLockTranche(kTrancheName))->lock;
}

void install_gauge_callbacks() {
    register_guarded_callback(on_transaction_end);
    register_guarded_callback(on_subtransaction_end);
}

}  // namespace idem::pg
