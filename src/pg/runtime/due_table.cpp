#include "pg/runtime/due_table.hpp"

#include <algorithm>
#include <iterator>

#include "pg/boundary/guard.hpp"
#include "pg/boundary/settings.hpp"

extern "C" {
#include "catalog/pg_extension.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/pgstat_internal.h"
}

namespace idem::pg {

namespace {

constexpr char kTrancheName[] = "idempotency due table";

struct DueEntry {
    Oid database;  // InvalidOid: free. Changed only under the table's lock, exclusive.
    slock_t mutex; // guards the fields up to `changed`
    DatabaseState state;
    bool sweep_wanted;
    bool sweep_finished;
    Fence fence;  // what its last worker found it behind (said once, until it changes)
    std::uint64_t changed;
    std::uint64_t changes_at_start;
    Oid watched[kWatchedTables];
    // Lock-free: a committing backend lowers them with compare-and-swap.
    pg_atomic_uint64 lease;
    pg_atomic_uint64 retention;
};

struct DueTable {
    LWLock* lock;                    // exclusive to make or free entries, shared to scan them
    Latch* launcher_latch;
    pg_atomic_uint64 launcher_wake;  // when the launcher means to wake up next
    int capacity;
    DueEntry entries[FLEXIBLE_ARRAY_MEMBER];
};

DueTable* table = nullptr;

// This backend's entry (its database cannot be dropped while it is
// connected, so the entry stays its own), and what its transaction noted.
int my_slot = -1;
Micros noted[static_cast<int>(DueKind::Count)] = {kNever, kNever, kNever, kNever};
bool callback_registered = false;
bool holds_claims = false;
bool exit_hook_registered = false;

std::uint64_t as_stored(Micros at) { return static_cast<std::uint64_t>(std::max<Micros>(at, 0)); }
Micros as_micros(std::uint64_t stored) { return static_cast<Micros>(stored); }

// Lowers *value to `at`; true when it did.
bool lower(pg_atomic_uint64* value, Micros at) {
    std::uint64_t seen = pg_atomic_read_u64(value);
    const std::uint64_t wanted = as_stored(at);
    while (wanted < seen)
        if (pg_atomic_compare_exchange_u64(value, &seen, wanted)) return true;
    return false;
}

DueEntry* entry_of(int slot, Oid database) {
    if (table == nullptr || slot < 0 || slot >= table->capacity) return nullptr;
    DueEntry* entry = &table->entries[slot];
    return entry->database == database ? entry : nullptr;
}

void init_entry(DueEntry* entry, Oid database) {
    SpinLockAcquire(&entry->mutex);
    entry->state = DatabaseState::Unknown;
    entry->sweep_wanted = true;
    entry->sweep_finished = true;
    entry->fence = Fence::None;
    entry->changed = 0;
    entry->changes_at_start = 0;
    std::fill(std::begin(entry->watched), std::end(entry->watched), InvalidOid);
    entry->watched[0] = ExtensionRelationId;
    SpinLockRelease(&entry->mutex);
    pg_atomic_write_u64(&entry->lease, as_stored(kNever));
    pg_atomic_write_u64(&entry->retention, as_stored(kNever));
    pg_write_barrier();
    entry->database = database;
}

int find_slot(Oid database) {
    for (int i = 0; i < table->capacity; ++i)
        if (table->entries[i].database == database) return i;
    return -1;
}

void wake_launcher_for(Micros at) {
    if (at >= as_micros(pg_atomic_read_u64(&table->launcher_wake))) return;
    if (Latch* latch = table->launcher_latch) SetLatch(latch);
}

void note_now(int slot, DueKind kind, Micros at) {
    DueEntry* entry = entry_of(slot, MyDatabaseId);
    if (entry == nullptr) return;
    pg_atomic_uint64* value = kind == DueKind::Retention ? &entry->retention : &entry->lease;
    if (lower(value, at)) wake_launcher_for(at);
}

// A backend that claimed keys and exits: with expire_on_disconnect, its
// keys are due for expiry. The worker checks that the backend has gone, and
// it has not quite yet (this runs early in the exit): a short delay.
void on_backend_exit(int, Datum) {
    if (!holds_claims || !settings::expire_on_disconnect || my_slot < 0) return;
    const Micros settle = std::min<Micros>(100 * kMillisecond, settings::ms(settings::naptime_ms));
    note_now(my_slot, DueKind::KeyLease, GetCurrentTimestamp() + settle);
}

void apply_notes() {
    if (my_slot < 0 || entry_of(my_slot, MyDatabaseId) == nullptr) my_slot = due_slot_for(MyDatabaseId);
    if (noted[static_cast<int>(DueKind::KeyLease)] != kNever) holds_claims = true;
    for (int kind = 0; kind < static_cast<int>(DueKind::Count); ++kind)
        if (noted[kind] != kNever) note_now(my_slot, static_cast<DueKind>(kind), noted[kind]);
    if (holds_claims && !exit_hook_registered) {
        before_shmem_exit(on_backend_exit, 0);
        exit_hook_registered = true;
    }
}

void on_transaction_end(XactEvent event, void*) {
    if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT ||
        event == XACT_EVENT_PREPARE) {
        // A prepared transaction may commit in another session: noted now,
        // a time too early at worst.
        apply_notes();
    } else if (event != XACT_EVENT_ABORT && event != XACT_EVENT_PARALLEL_ABORT) {
        return;
    }
    std::fill(std::begin(noted), std::end(noted), kNever);
}

}  // namespace

Size due_table_size() {
    return add_size(offsetof(DueTable, entries),
                    mul_size(sizeof(DueEntry), static_cast<Size>(settings::max_databases)));
}

void request_due_table_lock() { RequestNamedLWLockTranche(kTrancheName, 1); }

// Under AddinShmemInitLock, from the startup hook.
void init_due_table() {
    bool found = false;
    table = static_cast<DueTable*>(ShmemInitStruct("idempotency due table", due_table_size(), &found));
    if (found) return;
    table->lock = &(GetNamedLWLockTranche(kTrancheName))->lock;
    table->launcher_latch = nullptr;
    pg_atomic_init_u64(&table->launcher_wake, as_stored(kNever));
    table->capacity = settings::max_databases;
    for (int i = 0; i < table->capacity; ++i) {
        DueEntry* entry = &table->entries[i];
        entry->database = InvalidOid;
        SpinLockInit(&entry->mutex);
        pg_atomic_init_u64(&entry->lease, as_stored(kNever));
        pg_atomic_init_u64(&entry->retention, as_stored(kNever));
    }
}

void note_due_on_commit(DueKind kind, Micros at) {
    if (table == nullptr) return;
    if (!callback_registered) {
        register_guarded_callback(on_transaction_end);
        callback_registered = true;
    }
    Micros& earliest = noted[static_cast<int>(kind)];
    earliest = std::min(earliest, at);
}

void set_due_launcher_latch(Latch* latch) {
    if (table != nullptr) table->launcher_latch = latch;
}

void publish_launcher_wake(Micros at) {
    if (table == nullptr) return;
    pg_atomic_write_u64(&table->launcher_wake, as_stored(at));
    pg_memory_barrier();
}

int due_slot_for(Oid database) {
    if (table == nullptr) return -1;
    LWLockAcquire(table->lock, LW_SHARED);
    int slot = find_slot(database);
    LWLockRelease(table->lock);
    if (slot >= 0) return slot;
    LWLockAcquire(table->lock, LW_EXCLUSIVE);
    slot = find_slot(database);
    if (slot < 0) {
        slot = find_slot(InvalidOid);
        if (slot >= 0) init_entry(&table->entries[slot], database);
    }
    LWLockRelease(table->lock);
    return slot;
}

void free_due_slot(int slot, Oid database) {
    if (table == nullptr) return;
    LWLockAcquire(table->lock, LW_EXCLUSIVE);
    if (DueEntry* entry = entry_of(slot, database)) entry->database = InvalidOid;
    LWLockRelease(table->lock);
}

bool read_due(int slot, Oid database, DueView* out) {
    DueEntry* entry = entry_of(slot, database);
    if (entry == nullptr) return false;
    out->database = database;
    SpinLockAcquire(&entry->mutex);
    out->state = entry->state;
    out->sweep_wanted = entry->sweep_wanted;
    out->sweep_finished = entry->sweep_finished;
    out->changed = entry->changed;
    out->changes_at_start = entry->changes_at_start;
    std::copy(std::begin(entry->watched), std::end(entry->watched), out->watched);
    SpinLockRelease(&entry->mutex);
    out->lease = as_micros(pg_atomic_read_u64(&entry->lease));
    out->retention = as_micros(pg_atomic_read_u64(&entry->retention));
    return true;
}

void mark_worker_started(int slot, Oid database) {
    DueEntry* entry = entry_of(slot, database);
    if (entry == nullptr) return;
    SpinLockAcquire(&entry->mutex);
    entry->sweep_finished = false;
    entry->changed = 0;
    SpinLockRelease(&entry->mutex);
}

void mark_worker_failed(int slot, Oid database, Micros retry_at) {
    DueEntry* entry = entry_of(slot, database);
    if (entry == nullptr) return;
    SpinLockAcquire(&entry->mutex);
    entry->sweep_wanted = true;
    entry->sweep_finished = true;
    SpinLockRelease(&entry->mutex);
    (void)lower(&entry->lease, retry_at);
}

Fence note_fence(int slot, Oid database, Fence fence) {
    DueEntry* entry = entry_of(slot, database);
    if (entry == nullptr) return fence;
    SpinLockAcquire(&entry->mutex);
    const Fence before = entry->fence;
    entry->fence = fence;
    SpinLockRelease(&entry->mutex);
    return before;
}

void want_sweep(int slot, Oid database) {
    DueEntry* entry = entry_of(slot, database);
    if (entry == nullptr) return;
    SpinLockAcquire(&entry->mutex);
    entry->sweep_wanted = true;
    SpinLockRelease(&entry->mutex);
}

bool request_sweep(Oid database) {
    const int slot = due_slot_for(database);
    if (slot < 0) return false;
    want_sweep(slot, database);
    if (Latch* latch = table->launcher_latch) SetLatch(latch);
    return true;
}

DueTaken take_due(int slot, Oid database, Micros now) {
    DueEntry* entry = entry_of(slot, database);
    if (entry == nullptr) return DueTaken{now, now, true};
    DueTaken taken{kNever, kNever, false};
    SpinLockAcquire(&entry->mutex);
    taken.full = entry->sweep_wanted;
    entry->sweep_wanted = false;
    SpinLockRelease(&entry->mutex);
    // Taken before the worker's snapshot: what commits after it is noted
    // again and stays in the entry. A time still to come stays too: the
    // worker looks for it between two purge batches, the launcher after.
    if (as_micros(pg_atomic_read_u64(&entry->lease)) <= now)
        taken.lease = as_micros(pg_atomic_exchange_u64(&entry->lease, as_stored(kNever)));
    if (as_micros(pg_atomic_read_u64(&entry->retention)) <= now || taken.full)
        taken.retention = as_micros(pg_atomic_exchange_u64(&entry->retention, as_stored(kNever)));
    pg_memory_barrier();
    return taken;
}

std::uint64_t watched_row_changes(Oid database, const Oid watched[kWatchedTables]) {
    std::uint64_t changes = 0;
    for (int i = 0; i < kWatchedTables; ++i) {
        if (!OidIsValid(watched[i])) continue;
        const auto* entry = static_cast<const PgStat_StatTabEntry*>(
            pgstat_fetch_entry(PGSTAT_KIND_RELATION, database, watched[i]));
        if (entry != nullptr)
            changes += static_cast<std::uint64_t>(entry->tuples_inserted + entry->tuples_updated +
                                                  entry->tuples_deleted);
    }
    return changes;
}

void report_state(int slot, Oid database, bool installed, const Oid tables[kWatchedTables - 1]) {
    DueEntry* entry = entry_of(slot, database);
    if (entry == nullptr) return;
    Oid watched[kWatchedTables] = {ExtensionRelationId};
    for (int i = 1; i < kWatchedTables; ++i) watched[i] = installed ? tables[i - 1] : InvalidOid;
    const std::uint64_t changes = watched_row_changes(database, watched);
    SpinLockAcquire(&entry->mutex);
    entry->state = installed ? DatabaseState::HasExtension : DatabaseState::NoExtension;
    std::copy(std::begin(watched), std::end(watched), entry->watched);
    entry->changes_at_start = changes;
    SpinLockRelease(&entry->mutex);
}

bool lease_due_now(int slot, Oid database, Micros now) {
    DueEntry* entry = entry_of(slot, database);
    return entry != nullptr && as_micros(pg_atomic_read_u64(&entry->lease)) <= now;
}

Micros take_lease_due(int slot, Oid database) {
    DueEntry* entry = entry_of(slot, database);
    if (entry == nullptr) return kNever;
    const Micros taken = as_micros(pg_atomic_exchange_u64(&entry->lease, as_stored(kNever)));
    pg_memory_barrier();
    return taken;
}

void put_next_due(int slot, Oid database, Micros lease, Micros retention, std::uint64_t changed) {
    DueEntry* entry = entry_of(slot, database);
    if (entry == nullptr) return;
    (void)lower(&entry->lease, lease);
    (void)lower(&entry->retention, retention);
    SpinLockAcquire(&entry->mutex);
    entry->changed = changed;
    entry->sweep_finished = true;
    SpinLockRelease(&entry->mutex);
}

}  // namespace idem::pg
