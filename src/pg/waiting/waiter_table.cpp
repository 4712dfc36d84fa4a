#include "pg/waiting/waiter_table.hpp"

extern "C" {
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/proc.h"
#include "storage/shmem.h"
#include "storage/spin.h"
}

namespace idem::pg {

namespace {

constexpr int kBuckets = 1024;
constexpr int kNone = -1;

struct Bucket {
    slock_t lock;
    int head;  // first and last waiter in the list, or kNone
    int tail;
    std::uint64_t wakes;  // wake-ups signalled from this bucket so far
};

// A backend's entry, by its PGPROC number. The list links, `since` and
// `in_list` change under the bucket's lock; `value` only by its owner.
struct Waiter {
    std::uint64_t value;     // what it waits for (0: nothing)
    std::uint64_t since;     // its bucket's wakes when it registered
    pg_atomic_uint64 woken;  // the wake-up that signalled it, not yet handed on (0: none)
    int next;
    int prev;
    bool in_list;
};

struct WaiterTable {
    Bucket buckets[kBuckets];
    int capacity;
    Waiter waiters[FLEXIBLE_ARRAY_MEMBER];
};

WaiterTable* table = nullptr;
bool exit_hook_registered = false;

Bucket& bucket_of(std::uint64_t value) {
    return table->buckets[static_cast<int>(value % kBuckets)];
}

// This backend's entry, or -1 when it has none (not preloaded, or a
// process without a regular PGPROC).
int my_entry() {
    if (table == nullptr || MyProc == nullptr) return kNone;
    const long entry = MyProc - ProcGlobal->allProcs;
    return entry >= 0 && entry < table->capacity ? static_cast<int>(entry) : kNone;
}

void unlink(Bucket& bucket, int entry) {
    Waiter& waiter = table->waiters[entry];
    if (waiter.prev != kNone)
        table->waiters[waiter.prev].next = waiter.next;
    else
        bucket.head = waiter.next;
    if (waiter.next != kNone)
        table->waiters[waiter.next].prev = waiter.prev;
    else
        bucket.tail = waiter.prev;
    waiter.next = waiter.prev = kNone;
    waiter.in_list = false;
}

void append(Bucket& bucket, int entry) {
    Waiter& waiter = table->waiters[entry];
    waiter.prev = bucket.tail;
    waiter.next = kNone;
    if (bucket.tail != kNone)
        table->waiters[bucket.tail].next = entry;
    else
        bucket.head = entry;
    bucket.tail = entry;
    waiter.in_list = true;
}

// Takes the first kFanOut waiters for `value` that registered before wake
// `wake` out of the bucket (locked), marking them signalled by it.
int take(Bucket& bucket, std::uint64_t value, std::uint64_t wake, int* taken) {
    int count = 0;
    for (int entry = bucket.head; entry != kNone && count < kFanOut;) {
        Waiter& waiter = table->waiters[entry];
        const int next = waiter.next;
        if (waiter.value == value && waiter.since < wake) {
            unlink(bucket, entry);
            pg_atomic_write_u64(&waiter.woken, wake);
            taken[count++] = entry;
        }
        entry = next;
    }
    return count;
}

void set_latches(const int* entries, int count) {
    for (int i = 0; i < count; ++i) SetLatch(&GetPGProcByNumber(entries[i])->procLatch);
}

void leave_on_exit(int, Datum) { unregister_waiter(); }

}  // namespace

Size waiter_table_size() {
    return add_size(offsetof(WaiterTable, waiters), mul_size(sizeof(Waiter), MaxBackends));
}

// Under AddinShmemInitLock, from the startup hook.
void init_waiter_table() {
    bool found = false;
    table = static_cast<WaiterTable*>(
        ShmemInitStruct("idempotency waiters", waiter_table_size(), &found));
    if (found) return;
    for (Bucket& bucket : table->buckets) {
        SpinLockInit(&bucket.lock);
        bucket.head = bucket.tail = kNone;
        bucket.wakes = 0;
    }
    table->capacity = MaxBackends;
    for (int i = 0; i < table->capacity; ++i) {
        Waiter& waiter = table->waiters[i];
        waiter.value = 0;
        waiter.since = 0;
        pg_atomic_init_u64(&waiter.woken, 0);
        waiter.next = waiter.prev = kNone;
        waiter.in_list = false;
    }
}

bool waiter_table_present() { return table != nullptr; }

void register_waiter(std::uint64_t value) {
    const int entry = my_entry();
    if (entry == kNone) return;
    if (!exit_hook_registered) {
        before_shmem_exit(leave_on_exit, 0);
        exit_hook_registered = true;
    }
    hand_on_wakeup();
    Waiter& waiter = table->waiters[entry];
    if (waiter.value != value) unregister_waiter();
    Bucket& bucket = bucket_of(value);
    SpinLockAcquire(&bucket.lock);
    if (!waiter.in_list) {
        waiter.value = value;
        waiter.since = bucket.wakes;
        append(bucket, entry);
    }
    SpinLockRelease(&bucket.lock);
}

bool waiter_signalled() {
    const int entry = my_entry();
    return entry != kNone && pg_atomic_read_u64(&table->waiters[entry].woken) != 0;
}

bool waiter_registered() {
    const int entry = my_entry();
    return entry != kNone && table->waiters[entry].value != 0;
}

void hand_on_wakeup() {
    const int entry = my_entry();
    if (entry == kNone) return;
    Waiter& waiter = table->waiters[entry];
    const std::uint64_t wake = pg_atomic_read_u64(&waiter.woken);
    if (wake == 0) return;
    Bucket& bucket = bucket_of(waiter.value);
    int taken[kFanOut];
    SpinLockAcquire(&bucket.lock);
    const int count = take(bucket, waiter.value, wake, taken);
    SpinLockRelease(&bucket.lock);
    pg_atomic_write_u64(&waiter.woken, 0);
    set_latches(taken, count);
}

void unregister_waiter() {
    const int entry = my_entry();
    if (entry == kNone) return;
    Waiter& waiter = table->waiters[entry];
    if (waiter.value == 0) return;
    Bucket& bucket = bucket_of(waiter.value);
    SpinLockAcquire(&bucket.lock);
    if (waiter.in_list) unlink(bucket, entry);
    SpinLockRelease(&bucket.lock);
    hand_on_wakeup();
    waiter.value = 0;
}

int signal_waiters(std::uint64_t value) {
    if (table == nullptr) return 0;
    Bucket& bucket = bucket_of(value);
    int taken[kFanOut];
    SpinLockAcquire(&bucket.lock);
    const std::uint64_t wake = ++bucket.wakes;
    const int count = take(bucket, value, wake, taken);
    SpinLockRelease(&bucket.lock);
    set_latches(taken, count);
    return count;
}

}  // namespace idem::pg
