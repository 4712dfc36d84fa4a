// What is due in each database (library preloaded only): a table in shared
// memory, one entry per database, that tells the launcher when a database
// needs a worker, so that a database where nothing is due gets none.
//
// Two times per database, each the earliest of what it stands for:
// - lease: a claim's or an outbox event's lease ends, or a key finished
//   (urgent: expiry and the settling of ended leases and finished keys);
// - retention: a key, delivered event, inbox row or lock passes its
//   retention (the purges, which the launcher spreads out).
// A transaction that makes something due notes it; the note reaches the
// table when the transaction commits (or prepares), and wakes the launcher
// when it is earlier than the launcher meant to sleep. A worker takes the
// times when it starts and, once done, puts back the next ones it reads
// from the tables' indexes, so the times are lower bounds: a time noted too
// early costs one worker that finds nothing, never a missed expiry.
//
// Entries are made by the launcher (for every database it lists) and by
// committing backends; a table that is full (idempotency.max_databases) is
// reported by the launcher, which then sweeps the databases left out every
// naptime, as it did before the table existed.
#pragma once

#include "core/time.hpp"
#include "pg/boundary/postgres.hpp"
#include "pg/runtime/background_session.hpp"

namespace idem::pg {

// What a database's last worker found there.
enum class DatabaseState : int { Unknown, HasExtension, NoExtension };

// The kinds of times a transaction can note.
enum class DueKind {
    KeyLease,    // a claim's lease (and the backend holds claims: expire_on_disconnect)
    EventLease,  // an outbox event in flight
    Retention,   // a retention deadline
    Settle,      // a key left the live states (completed, failed): the sweep
                 // files it, as urgently as an ended lease. Without this note
                 // a sweep that happened to see no such key would leave the
                 // next ones to the launcher's row-change recheck.
    Count,
};

// Never: no time noted.
inline constexpr Micros kNever = INT64_MAX;

// The tables whose row changes the launcher watches in a database: the
// extension's tables (as its last worker found them) and pg_extension, whose
// rows change with CREATE, ALTER and DROP EXTENSION.
inline constexpr int kWatchedTables = 5;

// One entry as the launcher or a worker reads it.
struct DueView {
    Oid database;
    DatabaseState state;
    Oid watched[kWatchedTables];  // InvalidOid: none
    Micros lease;           // kNever: nothing noted
    Micros retention;
    bool sweep_wanted;      // a full sweep was asked for (first sight, reload, writes seen)
    bool sweep_finished;    // the last worker started finished its sweep
    std::uint64_t changed;  // rows the last worker changed
    std::uint64_t changes_at_start;  // the watched tables' row changes when it started
};

// Rows inserted, updated and deleted so far in the tables `watched` of
// `database` (any database, not only the one connected to), as the
// cumulative statistics count them. Needs a transaction: the statistics
// read are kept until its end.
std::uint64_t watched_row_changes(Oid database, const Oid watched[kWatchedTables]);

// Shared memory: called from the module's request and startup hooks.
Size due_table_size();
void request_due_table_lock();
void init_due_table();

// --- committing backends -----------------------------------------------------
// Notes that something of `kind` is due at `at` once the transaction commits.
void note_due_on_commit(DueKind kind, Micros at);

// --- the launcher ------------------------------------------------------------
void set_due_launcher_latch(Latch* latch);
// The launcher's next wake-up: a note earlier than it sets the launcher's
// latch. kNever while the launcher is reading the table (every note wakes it).
void publish_launcher_wake(Micros at);
// The entry of `database`, made if missing (state Unknown, sweep wanted);
// -1 when the table is full.
int due_slot_for(Oid database);
void free_due_slot(int slot, Oid database);
// Copies an entry; false when the slot no longer belongs to `database`.
bool read_due(int slot, Oid database, DueView* out);
// Before a worker starts: clears its finished flag.
void mark_worker_started(int slot, Oid database);
// A worker ended without finishing: its due times come back `retry_at` at
// the latest, with a full sweep.
void mark_worker_failed(int slot, Oid database, Micros retry_at);
// Asks for a full sweep of the database.
void want_sweep(int slot, Oid database);
// Records the fence a worker found the database behind; returns the one
// the last worker found, so that a change is said once.
Fence note_fence(int slot, Oid database, Fence fence);
// The same for a session (idempotency.request_sweep()), waking the
// launcher; false when there is no due table (not preloaded) or no room.
bool request_sweep(Oid database);

// --- a worker ------------------------------------------------------------------
// What a worker took at its start.
struct DueTaken {
    Micros lease;
    Micros retention;
    bool full;  // a full sweep was wanted (or the worker has no entry)
};
// Takes the due times that have come (the retention time also when a full
// sweep is wanted) and the full sweep flag;
// with no entry, a full sweep. Called before the worker looks at the
// catalogs: a claim that commits later notes its lease again.
DueTaken take_due(int slot, Oid database, Micros now);
// What the worker found: whether the extension is installed (and served),
// and its tables (InvalidOid for those the installed version lacks); also
// reads the row changes of the tables then watched (see DueView), in the
// transaction that found them, before the worker's sweep takes a snapshot.
void report_state(int slot, Oid database, bool installed, const Oid tables[kWatchedTables - 1]);
// Whether a lease has come due since the worker took the times.
bool lease_due_now(int slot, Oid database, Micros now);
// Takes the lease time again (the worker expires once more).
Micros take_lease_due(int slot, Oid database);
// At the end of a sweep: the next times read from the tables (kNever: none),
// the rows it changed, and that it finished.
void put_next_due(int slot, Oid database, Micros lease, Micros retention, std::uint64_t changed);

}  // namespace idem::pg
