// Gauges (library preloaded only): counts per database and per name (a
// scope, a topic) in shared memory, that committing transactions adjust and
// the monitoring views read instead of scanning history: finished keys per
// scope (pg/keys/key_counts.hpp), undelivered and dead events per topic
// (pg/outbox/outbox_counts.hpp).
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
// not see, so it misses and repeats none. Rows written other than through
// the extension's functions are not counted until the next recount.
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

// --- readers --------------------------------------------------------------------------
struct GaugeRow {
    const char* name;
    std::int64_t values[kGaugeValues];
    Micros latest;  // 0: none
};
using GaugeRowSink = void (*)(const GaugeRow& row, void* context);
// Hands every name of `family` in this database whose counts are not all
// zero (or that has a latest time) to `sink`; false, handing nothing, when
// the counts are not known (or there is no shared memory).
bool read_gauges(GaugeFamily family, GaugeRowSink sink, void* context);
// Whether this database's counts are known for its current tables.
bool gauges_known();
// The counts of this database are unknown from now on (a recount is due).
void forget_gauges(Oid database);

// --- a recount (pg/background/gauge_recount.hpp) ---------------------------------------------------
// Starts a recount of this database: its counts become unknown, and the
// snapshot returned (registered; nullptr when another recount runs now, or
// without shared memory) is the one to count with. `prepared` are this
// database's prepared transactions, listed before the call: one whose
// adjustments are not waiting in shared memory (prepared before the server
// started) leaves the counts unknown at the recount's end.
Snapshot begin_recount(const TransactionId* prepared, int prepared_count);
// A row counted with that snapshot.
void recount_row(GaugeFamily family, const text* name, const std::int64_t values[kGaugeValues],
                 std::optional<Micros> latest);
// The counts are known from now on. An error before it leaves them unknown.
void end_recount();

// Shared memory: from the module's request and startup hooks.
Size gauges_size();
void request_gauges_lock();
void init_gauges();
// The transaction callbacks (from _PG_init).
void install_gauge_callbacks();

}  // namespace idem::pg
