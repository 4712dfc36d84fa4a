// The table of gauges in shared memory (only pg/stats/gauges.cpp uses it):
// one entry per database and per name (a scope, a topic) of a database, and
// the room for names. Names share idempotency.max_gauges entries over all
// databases; databases have idempotency.max_databases entries of their own,
// so a database always finds its entry while names fill the table.
//
// When a name finds the table full, the database with the most names in it
// overflows: its names leave the table and its counts come from its tables
// at each read from then on, until the server restarts (a recount would
// overflow again). Counting the largest one that way makes the room for all
// the others, whichever database asked.
//
// Every function here is called under the gauges' lock (the exclusive one
// where it says so) and raises no error: commits call them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/validate.hpp"
#include "pg/boundary/postgres.hpp"

extern "C" {
#include "port/atomics.h"
#include "utils/hsearch.h"
}

namespace idem::pg {

inline constexpr int kEntryValues = 3;         // as kGaugeValues (pg/stats/gauges.hpp)
inline constexpr char kDatabaseFamily = 'd';  // an entry holding a database's state

struct GaugeKey {
    Oid database;
    char family;
    char name[kMaxNameBytes + 1];  // zero-padded: keys compare as bytes
};

// Stale: counting, but the rows changed behind the functions meanwhile
// (request_sweep()): the recount that ends leaves the counts unknown.
// Overflowed: counted from the tables at each read (no names in the table);
// no recount and no commit changes it until the server restarts.
enum class CountState : std::uint64_t { Unknown, Counting, Known, Stale, Overflowed };

// A name's counts, or (family 'd') a database's state: values[0] its
// CountState, values[1] and values[2] the keys and outbox tables it counts.
struct GaugeEntry {
    GaugeKey key;
    pg_atomic_uint64 values[kEntryValues];  // signed counts, stored as two's complement
    pg_atomic_uint64 latest;
    // A database's entry: its names in the table (under the exclusive
    // lock), and whether its overflow is still to be logged.
    std::uint32_t names;
    bool overflow_untold;
};

void make_key(GaugeKey* key, Oid database, char family, const char* name, std::size_t length);
// The entry of a name, or nullptr.
GaugeEntry* find_name(Oid database, char family, const char* name, std::size_t length);
// The entry of a name, made when missing (exclusive lock): nullptr when its
// database has no entry or is overflowed, now or by this very call.
GaugeEntry* enter_name(Oid database, char family, const char* name, std::size_t length);
// Overflows the database (exclusive lock) when its names and `more` would
// be more than the whole table holds: a recount that knows how many it
// will count leaves the other databases' names alone.
void overflow_unless_fits(GaugeEntry* database, long more);
// A database's entry, made when missing with `create` (exclusive lock;
// nullptr only when more databases than idempotency.max_databases have one).
GaugeEntry* database_entry(Oid database, bool create);
// Whether a database without an entry would find no room for one.
bool database_entries_full();

CountState state_of(GaugeEntry* database);
// Sets a database's state; an overflowed one stays so.
void set_state(GaugeEntry* database, CountState state);

// Every entry, for a scan under the lock.
HTAB* gauge_entries();

// Logs the overflows not logged yet, once each: after the lock is released,
// by the backend that made them (a no-op when it made none).
void log_overflows(LWLock* lock);

// Shared memory.
Size gauge_table_size();
void init_gauge_table();

}  // namespace idem::pg
