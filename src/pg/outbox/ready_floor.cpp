#include "pg/outbox/ready_floor.hpp"

#include <algorithm>
#include <cstring>

#include "core/validate.hpp"
#include "pg/access/extension_objects.hpp"
#include "pg/access/spi.hpp"
#include "pg/boundary/guard.hpp"

extern "C" {
#include "storage/ipc.h"
#include "storage/procarray.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
}

namespace idem::pg {

namespace {

// A commit that makes ready events visible this long after it wrote their
// ready_at is published; a claim starts this far below its mark.
constexpr Micros kMargin = 100 * 1000;
constexpr int kLateEntries = 64;
constexpr int kPreparedEntries = 64;

struct LateEntry {
    std::uint64_t seq;
    Oid database;
    Micros from;
};

struct PreparedEntry {
    Oid database;  // InvalidOid: free
    TransactionId xid;
    Micros from;
};

struct Floor {
    slock_t mutex;
    std::uint64_t next_seq;  // of the next late entry; entries seq >= next_seq - kLateEntries stay
    LateEntry late[kLateEntries];
    PreparedEntry prepared[kPreparedEntries];
    bool prepared_overflow;   // a prepared transaction could not be recorded
    bool prepared_looked_up;  // prepared transactions that survived a restart are recorded
};

Floor* floor_state = nullptr;

void publish_late(Micros from) {
    SpinLockAcquire(&floor_state->mutex);
    const std::uint64_t seq = floor_state->next_seq++;
    floor_state->late[seq % kLateEntries] = LateEntry{seq, MyDatabaseId, from};
    SpinLockRelease(&floor_state->mutex);
}

// A prepared transaction's lowest ready_at, published once it ends. Mutex held.
void record_prepared(const PreparedEntry& prepared) {
    for (auto& entry : floor_state->prepared) {
        if (entry.database != InvalidOid) continue;
        entry = prepared;
        return;
    }
    floor_state->prepared_overflow = true;
}

// --- the transaction's own writes ---------------------------------------------

constexpr Micros kNone = DT_NOEND;
Micros earliest_written = kNone;

void on_transaction_event(XactEvent event, void*) {
    if (earliest_written == kNone) return;
    switch (event) {
    case XACT_EVENT_COMMIT:
        // Visible now: late if a claim may have passed its ready_at meanwhile.
        if (floor_state != nullptr && earliest_written < GetCurrentTimestamp() - kMargin)
            publish_late(earliest_written);
        earliest_written = kNone;
        break;
    case XACT_EVENT_PRE_PREPARE:
        if (floor_state != nullptr) {
            SpinLockAcquire(&floor_state->mutex);
            record_prepared(PreparedEntry{MyDatabaseId, GetTopTransactionIdIfAny(), earliest_written});
            SpinLockRelease(&floor_state->mutex);
        }
        break;
    case XACT_EVENT_ABORT:
    case XACT_EVENT_PREPARE:
        earliest_written = kNone;
        break;
    default:
        break;
    }
}

// --- prepared transactions ------------------------------------------------------

// Prepared transactions found at the first claim after a start: their
// events may have any ready_at, so each one, once it ends, sends claims back
// to the start.
Statement kPrepared = {"SELECT transaction, dbid FROM pg_catalog.pg_prepared_xact()", 0, {}, nullptr};

void record_surviving_prepared() {
    SpinLockAcquire(&floor_state->mutex);
    const bool done = floor_state->prepared_looked_up;
    floor_state->prepared_looked_up = true;
    SpinLockRelease(&floor_state->mutex);
    if (done) return;
    const std::uint64_t rows = execute(kPrepared, Params{});
    SpinLockAcquire(&floor_state->mutex);
    for (std::uint64_t row = 0; row < rows; ++row) {
        bool isnull = false;
        const TransactionId xid = DatumGetTransactionId(column(1, &isnull, row));
        const Oid database = DatumGetObjectId(column(2, &isnull, row));
        record_prepared(PreparedEntry{database, xid, DT_NOBEGIN});
    }
    SpinLockRelease(&floor_state->mutex);
}

// Prepared transactions of this database that ended are published as late.
void publish_ended_prepared() {
    TransactionId mine[kPreparedEntries];
    int count = 0;
    SpinLockAcquire(&floor_state->mutex);
    for (const auto& entry : floor_state->prepared)
        if (entry.database == MyDatabaseId) mine[count++] = entry.xid;
    SpinLockRelease(&floor_state->mutex);
    for (int i = 0; i < count; ++i) {
        if (TransactionIdIsInProgress(mine[i])) continue;
        Micros from = kNone;
        SpinLockAcquire(&floor_state->mutex);
        for (auto& entry : floor_state->prepared) {
            if (entry.database == MyDatabaseId && entry.xid == mine[i]) {
                from = entry.from;
                entry.database = InvalidOid;
            }
        }
        SpinLockRelease(&floor_state->mutex);
        if (from != kNone) publish_late(from);
    }
}

// --- this backend's marks ---------------------------------------------------------

struct Mark {
    char source[kMaxNameBytes + 1];  // the hash key: a topic, or "" for every topic
    std::uint64_t generation;        // of the extension's objects it was taken for
    Micros mark;
    std::uint64_t seen;              // late entries from this seq on are still to be read
};

constexpr long kMaxMarks = 4096;
HTAB* marks = nullptr;

Mark* mark_of(const text* topic, bool create) {
    if (marks == nullptr) {
        if (!create) return nullptr;
        HASHCTL control;
        std::memset(&control, 0, sizeof control);
        control.keysize = sizeof(Mark::source);
        control.entrysize = sizeof(Mark);
        control.hcxt = TopMemoryContext;
        marks = hash_create("idempotency claim marks", 64, &control,
                            HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
    }
    char source[sizeof(Mark::source)] = {};
    if (topic != nullptr) {
        const std::size_t bytes =
            std::min<std::size_t>(VARSIZE_ANY_EXHDR(topic), sizeof source - 1);
        std::memcpy(source, VARDATA_ANY(topic), bytes);
    }
    if (create && hash_get_num_entries(marks) >= kMaxMarks) {
        hash_destroy(marks);
        marks = nullptr;
        return mark_of(topic, true);
    }
    bool found = false;
    Mark* mark = static_cast<Mark*>(hash_search(marks, source, create ? HASH_ENTER : HASH_FIND, &found));
    if (mark != nullptr && !found) mark->generation = 0;
    return mark;
}

}  // namespace

void note_ready_written(Micros ready_at) {
    if (ready_at < earliest_written) earliest_written = ready_at;
}

ScanStart scan_start(const text* topic) {
    ScanStart start{DT_NOBEGIN, 0};
    if (floor_state == nullptr) return start;
    record_surviving_prepared();
    publish_ended_prepared();
    const Mark* mark = mark_of(topic, false);
    SpinLockAcquire(&floor_state->mutex);
    const std::uint64_t next = floor_state->next_seq;
    const bool overflow = floor_state->prepared_overflow;
    Micros from = DT_NOBEGIN;
    if (!overflow && mark != nullptr && mark->generation == extension_objects().generation &&
        next - mark->seen <= static_cast<std::uint64_t>(kLateEntries)) {
        from = mark->mark - kMargin;
        for (std::uint64_t seq = mark->seen; seq < next; ++seq) {
            const LateEntry& late = floor_state->late[seq % kLateEntries];
            if (late.seq == seq && late.database == MyDatabaseId && late.from < from)
                from = late.from;
        }
    }
    SpinLockRelease(&floor_state->mutex);
    start.from = from;
    start.token = next;
    return start;
}

void scan_found(const text* topic, const ScanStart& start, Micros first_ready) {
    if (floor_state == nullptr) return;
    Mark* mark = mark_of(topic, true);
    mark->generation = extension_objects().generation;
    mark->mark = first_ready;
    mark->seen = start.token;
}

void install_ready_floor_callbacks() { register_guarded_callback(on_transaction_event); }

Size ready_floor_size() { return MAXALIGN(sizeof(Floor)); }

void init_ready_floor() {
    bool found = false;
    floor_state = static_cast<Floor*>(ShmemInitStruct("idempotency ready floor", sizeof(Floor), &found));
    if (!found) {
        std::memset(floor_state, 0, sizeof *floor_state);
        SpinLockInit(&floor_state->mutex);
        floor_state->next_seq = 1;
    }
}

}  // namespace idem::pg
