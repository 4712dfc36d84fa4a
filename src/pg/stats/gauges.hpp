// Gauges (library preloaded only): counts per database and per name (a
// scope, a topic) in shared memory, that committing transactions adjust and
// the monitoring views read instead of scanning history: finished keys per
// scope (pg/keys/key_counts.hpp), undelivered and dead events per topic
// (pg/outbox/counts.hpp).
//
// A transaction's adjustments are kept per subtransaction (a rolled-back
// one's are dropped) and applied when it commits. A prepared transaction's
// wait in shared memory until it ends, in whichever session: applied if it
// committed, dropped if it rolled back (settled by the next read of the
// counts or the next PREPARE). The counts of
// a database are known only once recounted from its tables (after a server
// start, an update of the extension, DROP and CREATE EXTENSION, or
// idempotency.request_sweep()); until then they are unknown and committing
// transactions leave them alone. A recount reads the tables with one
// snapshot and keeps the adjustments of the transactions that snapshot does
// not see, so it misses and repeats none: a transaction is visible before
// its commit callback adds its adjustments, and one the snapshot saw in
// between is marked counted, so that its callback adds nothing even after
// the recount has ended. Rows written other than through
// the extension's functions are not counted until the next recount; a
// TRUNCATE of their tables has them recounted at its commit.
//
// The table holds idempotency.max_gauges scopes and topics over all
// databases. When it is full, the database with the most of them there
// leaves it and is counted from its tables at each read instead, until the
// server restarts (pg/stats/gauge_table.hpp): never a wrong count.
#pragma once

#include <cstdint>
#include <optional>

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

enum class GaugeFamily : char { Keys = 'k', Outbox = 'o' };

// Counts per name; what each one means is its family's.
inline constexpr int kGaugeValues = 3;

// --- committing transactions ----------------------------------------------------
// Adds `delta` to value `index` of `name` when the transaction commits.
void gauge_add_on_commit(GaugeFamily family, const text* name, int index, std::int64_t delta);
// Raises the name's latest time (the last delivery) to `at` when it commits.
void gauge_latest_on_commit(GaugeFamily family, const text* name, Micros at);
// The transaction truncated a counted table (pg/stats/truncate_trigger.cpp):
// at its commit the database's counts become unknown, so that they are
// recounted; a prepared one leaves them unknown until it has ended. A
// TRUNCATE in a savepoint rolled back since still has them recounted.
void gauges_truncated_on_commit();

// --- readers --------------------------------------------------------------------------
// Where this database's counts come from: not known (being recounted, or
// not yet), kept in the table by commits, or to be counted from its tables
// by each read (the table had no room for them).
enum class GaugeSource { Unknown, Kept, Tables };

struct GaugeRow {
    const char* name;
    std::int64_t values[kGaugeValues];
    Micros latest;  // 0: none
};
using GaugeRowSink = void (*)(const GaugeRow& row, void* context);
// Hands every name of `family` in this database whose counts are not all
// zero (or that has a latest time) to `sink` when they are kept; hands
// nothing otherwise. Returns the source it found (Unknown without shared
// memory).
GaugeSource read_gauges(GaugeFamily family, GaugeRowSink sink, void* context);
// This database's source for its current tables.
GaugeSource gauge_source();
// The counts of this database are unknown from now on (a recount is due).
void forget_gauges(Oid database);

// --- a recount (pg/stats/recount.hpp) ---------------------------------------------------
// Starts a recount of this database: its counts become unknown, and the
// snapshot returned (registered; nullptr when another recount runs now,
// when the database's counts come from its tables, or without shared
// memory) is the one to count with. `prepared` are this
// database's prepared transactions, listed before the call: one whose
// adjustments are not waiting in shared memory (prepared before the server
// started) leaves the counts unknown at the recount's end.
Snapshot begin_recount(const TransactionId* prepared, int prepared_count);
// The recount is about to count `names` more names: when they can never
// fit in the table, the database overflows at once (its reads count from
// its tables), rather than making other databases leave the table first.
void recount_expect(long names);
// A row counted with that snapshot.
void recount_row(GaugeFamily family, const text* name, const std::int64_t values[kGaugeValues],
                 std::optional<Micros> latest);
// The counts are known from now on (or come from the tables, when they
// overflowed meanwhile). An error before it leaves them unknown.
void end_recount();

// Shared memory: from the module's request and startup hooks.
Size gauges_size();
void request_gauges_lock();
void init_gauges();
// The transaction callbacks (from _PG_init).
void install_gauge_callbacks();

}  // namespace idem::pg
