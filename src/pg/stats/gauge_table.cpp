#include "pg/stats/gauge_table.hpp"

#include <algorithm>
#include <cstring>

#include "pg/boundary/settings.hpp"

extern "C" {
#include "storage/lwlock.h"
#include "storage/shmem.h"
}

namespace idem::pg {

namespace {

// The names in the table, over all databases (at most idempotency.max_gauges).
struct Room {
    long names;
};

HTAB* entries = nullptr;
Room* room = nullptr;
// This backend overflowed a database since it last logged.
bool overflowed_here = false;

long entry_capacity() { return settings::max_gauges + settings::max_databases; }

GaugeEntry* lookup(Oid database, char family, const char* name, std::size_t length,
                   HASHACTION action) {
    GaugeKey key;
    make_key(&key, database, family, name, length);
    bool found = false;
    auto* entry = static_cast<GaugeEntry*>(hash_search(entries, &key, action, &found));
    if (entry != nullptr && !found) {
        for (auto& value : entry->values) pg_atomic_init_u64(&value, 0);
        pg_atomic_init_u64(&entry->latest, 0);
        entry->names = 0;
        entry->overflow_untold = false;
    }
    return entry;
}

// The database with the most names in the table (one has some: it is full).
GaugeEntry* largest_database() {
    GaugeEntry* largest = nullptr;
    HASH_SEQ_STATUS scan;
    hash_seq_init(&scan, entries);
    while (auto* entry = static_cast<GaugeEntry*>(hash_seq_search(&scan)))
        if (entry->key.family == kDatabaseFamily &&
            (largest == nullptr || entry->names > largest->names))
            largest = entry;
    return largest;
}

// The database's names leave the table; its counts come from its tables.
void overflow(GaugeEntry* database) {
    long removed = 0;
    HASH_SEQ_STATUS scan;
    hash_seq_init(&scan, entries);
    while (auto* entry = static_cast<GaugeEntry*>(hash_seq_search(&scan)))
        if (entry->key.database == database->key.database && entry->key.family != kDatabaseFamily) {
            hash_search(entries, &entry->key, HASH_REMOVE, nullptr);  // allowed during a scan
            ++removed;
        }
    room->names -= removed;
    database->names = 0;
    set_state(database, CountState::Overflowed);
    database->overflow_untold = true;
    overflowed_here = true;
}

}  // namespace

void make_key(GaugeKey* key, Oid database, char family, const char* name, std::size_t length) {
    std::memset(key, 0, sizeof *key);
    key->database = database;
    key->family = family;
    std::memcpy(key->name, name, std::min(length, kMaxNameBytes));
}

GaugeEntry* find_name(Oid database, char family, const char* name, std::size_t length) {
    return lookup(database, family, name, length, HASH_FIND);
}

GaugeEntry* enter_name(Oid database, char family, const char* name, std::size_t length) {
    if (GaugeEntry* entry = find_name(database, family, name, length)) return entry;
    GaugeEntry* owner = database_entry(database, false);
    if (owner == nullptr || state_of(owner) == CountState::Overflowed) return nullptr;
    while (room->names >= settings::max_gauges) {
        GaugeEntry* largest = largest_database();
        overflow(largest);
        if (largest == owner) return nullptr;
    }
    // Room was made above: never nullptr, unless the table were smaller.
    GaugeEntry* entry = lookup(database, family, name, length, HASH_ENTER_NULL);
    if (entry == nullptr) {
        overflow(owner);
        return nullptr;
    }
    ++room->names;
    ++owner->names;
    return entry;
}

void overflow_unless_fits(GaugeEntry* database, long more) {
    if (state_of(database) != CountState::Overflowed &&
        static_cast<long>(database->names) + more > settings::max_gauges)
        overflow(database);
}

GaugeEntry* database_entry(Oid database, bool create) {
    return lookup(database, kDatabaseFamily, "", 0, create ? HASH_ENTER_NULL : HASH_FIND);
}

bool database_entries_full() {
    return hash_get_num_entries(entries) - room->names >= settings::max_databases;
}

CountState state_of(GaugeEntry* database) {
    return static_cast<CountState>(pg_atomic_read_u64(&database->values[0]));
}

void set_state(GaugeEntry* database, CountState state) {
    if (state_of(database) == CountState::Overflowed) return;
    pg_atomic_write_u64(&database->values[0], static_cast<std::uint64_t>(state));
}

HTAB* gauge_entries() { return entries; }

void log_overflows(LWLock* lock) {
    while (overflowed_here) {
        // Taken under the lock, logged after it: a few at a time.
        Oid told[16];
        int count = 0;
        LWLockAcquire(lock, LW_EXCLUSIVE);
        HASH_SEQ_STATUS scan;
        hash_seq_init(&scan, entries);
        while (auto* entry = static_cast<GaugeEntry*>(hash_seq_search(&scan))) {
            if (!entry->overflow_untold) continue;
            entry->overflow_untold = false;
            told[count++] = entry->key.database;
            if (count == 16) {
                hash_seq_term(&scan);
                break;
            }
        }
        LWLockRelease(lock);
        overflowed_here = count == 16;
        for (int i = 0; i < count; ++i)
            ereport(LOG,
                    (errmsg("idempotency: the counts of database %u do not fit in "
                            "idempotency.max_gauges = %d (scopes and topics over all databases); "
                            "its idem_stats and outbox_lag count them from its tables at each "
                            "read until the server restarts",
                            told[i], settings::max_gauges),
                     errhint("Raise idempotency.max_gauges (takes a server restart)."),
                     errhidestmt(true)));
    }
}

Size gauge_table_size() {
    return add_size(hash_estimate_size(entry_capacity(), sizeof(GaugeEntry)), MAXALIGN(sizeof(Room)));
}

// Under AddinShmemInitLock, from the startup hook.
void init_gauge_table() {
    HASHCTL control;
    std::memset(&control, 0, sizeof control);
    control.keysize = sizeof(GaugeKey);
    control.entrysize = sizeof(GaugeEntry);
    entries = ShmemInitHash("idempotency gauges", entry_capacity(), entry_capacity(), &control,
                            HASH_ELEM | HASH_BLOBS | HASH_FIXED_SIZE);
    bool found = false;
    room = static_cast<Room*>(ShmemInitStruct("idempotency gauge room", sizeof(Room), &found));
    if (!found) room->names = 0;
}

}  // namespace idem::pg
