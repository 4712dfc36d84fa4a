#include "pg/boundary/settings.hpp"

#include "pg/boundary/postgres.hpp"

namespace idem::pg::settings {

int default_lease_ms = 30 * 1000;
int max_lease_ms = 24 * 3600 * 1000;
int retention_s = 24 * 3600;
int key_retention_s = 30 * 24 * 3600;
int max_attempts = 5;
int retry_base_delay_ms = 1000;
int retry_max_delay_ms = 3600 * 1000;
int stuck_after_ms = 5 * 60 * 1000;
int outbox_max_attempts = 10;
int outbox_run_length = 1;
int outbox_retention_s = 3600;
int inbox_retention_s = 7 * 24 * 3600;
int max_value_bytes = 1024 * 1024;
int max_steps = 32;
int max_step_bytes = 16 * 1024;
int naptime_ms = 1000;
int launcher_naptime_ms = 10 * 1000;
int purge_batch = 10000;
int purge_naptime_ms = 60 * 1000;
int max_notifiers = 4;
int purge_pause_ms = 10;
int max_databases = 4096;
int max_gauges = 4096;
bool worker_enabled = true;
bool expire_on_disconnect = false;
bool log_transitions = false;
bool force_drop = false;
bool outbox_notify = true;
bool direct_table_access = true;

namespace {

void define_int(const char* name, const char* description, int* variable, int min, int max,
                GucContext context, int flags) {
    DefineCustomIntVariable(name, description, nullptr, variable, *variable, min, max, context,
                            flags, nullptr, nullptr, nullptr);
}

void define_bool(const char* name, const char* description, bool* variable,
                 GucContext context, int flags = 0) {
    DefineCustomBoolVariable(name, description, nullptr, variable, *variable, context, flags,
                             nullptr, nullptr, nullptr);
}

}  // namespace

void define() {
    // Settings any session may change for its own calls.
    define_int("idempotency.default_lease", "Lease of a claim when none is given.",
               &default_lease_ms, 1, INT_MAX, PGC_USERSET, GUC_UNIT_MS);
    define_int("idempotency.retention", "How long a finished key is kept.", &retention_s, 0,
               INT_MAX, PGC_USERSET, GUC_UNIT_S);
    define_int("idempotency.max_attempts", "Claims a key may be granted before it fails for good.",
               &max_attempts, 1, INT_MAX, PGC_USERSET, 0);
    define_int("idempotency.retry_base_delay", "First backoff after a retryable failure.",
               &retry_base_delay_ms, 0, INT_MAX, PGC_USERSET, GUC_UNIT_MS);
    define_int("idempotency.retry_max_delay", "Longest backoff after a retryable failure.",
               &retry_max_delay_ms, 0, INT_MAX, PGC_USERSET, GUC_UNIT_MS);
    define_int("idempotency.stuck_after", "When a PROCESSING or RECEIVED key counts as stuck.",
               &stuck_after_ms, 1, INT_MAX, PGC_USERSET, GUC_UNIT_MS);
    define_int("idempotency.outbox_max_attempts", "Deliveries of an outbox event before it is dead.",
               &outbox_max_attempts, 1, INT_MAX, PGC_USERSET, 0);
    define_int("idempotency.outbox_run_length",
               "Consecutive events of one key an outbox claim may hand out together.",
               &outbox_run_length, 1, 10000, PGC_USERSET, 0);
    define_bool("idempotency.outbox_notify",
                "Notify channel idempotency_outbox when an enqueuing transaction commits.",
                &outbox_notify, PGC_USERSET);

    // Settings only a superuser may change.
    define_int("idempotency.max_lease", "Longest lease, extension, lock ttl or wait accepted.",
               &max_lease_ms, 1, INT_MAX, PGC_SUSET, GUC_UNIT_MS);
    define_int("idempotency.max_value_bytes", "Largest result, payload or error accepted.",
               &max_value_bytes, 1, MaxAllocSize, PGC_SUSET, GUC_UNIT_BYTE);
    // Every step rewrites the key's steps whole: both bound what that costs.
    define_int("idempotency.max_steps", "Finished steps a key of multi-step work may record.",
               &max_steps, 1, 10000, PGC_SUSET, 0);
    define_int("idempotency.max_step_bytes", "Largest result of one step accepted.",
               &max_step_bytes, 1, MaxAllocSize, PGC_SUSET, GUC_UNIT_BYTE);
    define_bool("idempotency.log_transitions", "Log each state transition.", &log_transitions,
                PGC_SUSET);
    define_bool("idempotency.force_drop",
                "Let DROP EXTENSION destroy undelivered outbox events and PROCESSING keys.",
                &force_drop, PGC_SUSET);
    // For the differential test only (test/differential/): off, the direct
    // row writes and locks run as the SQL statements they stand for
    // (access/sql_row_writes.hpp), so that the two can be compared.
    define_bool("idempotency.direct_table_access",
                "Write and lock the rows of the key and outbox calls directly (on) or through "
                "the SQL statements they stand for (off: for the differential test only).",
                &direct_table_access, PGC_SUSET, GUC_NOT_IN_SAMPLE);

    // Server-wide settings (reload with SIGHUP).
    define_int("idempotency.outbox_retention", "How long delivered outbox events are kept.",
               &outbox_retention_s, 0, INT_MAX, PGC_SIGHUP, GUC_UNIT_S);
    define_int("idempotency.key_retention",
               "How long after it finished a key is remembered (as a tombstone, without its "
               "result) once its result's retention has passed.",
               &key_retention_s, 0, INT_MAX, PGC_SIGHUP, GUC_UNIT_S);
    define_int("idempotency.inbox_retention", "How long inbox rows are kept.", &inbox_retention_s,
               0, INT_MAX, PGC_SIGHUP, GUC_UNIT_S);
    define_int("idempotency.naptime", "Pause between two sweeps of a database worker.",
               &naptime_ms, 10, INT_MAX, PGC_SIGHUP, GUC_UNIT_MS);
    define_int("idempotency.launcher_naptime", "Pause between two scans of the launcher.",
               &launcher_naptime_ms, 10, INT_MAX, PGC_SIGHUP, GUC_UNIT_MS);
    define_int("idempotency.purge_batch", "Rows changed per maintenance transaction.",
               &purge_batch, 1, 1000000, PGC_SIGHUP, 0);
    define_int("idempotency.purge_naptime",
               "Pause between two retention purges of a database, and longest wait before "
               "rows written other than through the extension's functions are looked at.",
               &purge_naptime_ms, 10, INT_MAX, PGC_SIGHUP, GUC_UNIT_MS);
    define_int("idempotency.purge_pause", "Pause after each batch of a retention purge.",
               &purge_pause_ms, 0, 60 * 1000, PGC_SIGHUP, GUC_UNIT_MS);
    define_bool("idempotency.worker_enabled", "Run the background workers.", &worker_enabled,
                PGC_SIGHUP);
    define_int("idempotency.max_notifiers",
               "Outbox notifiers running at once; the commits of other databases notify "
               "themselves.",
               &max_notifiers, 0, 32, PGC_SIGHUP, 0);
    define_bool("idempotency.expire_on_disconnect",
                "Expire a claim at once when the backend that made it has exited.",
                &expire_on_disconnect, PGC_SIGHUP);

    // Set at server start, and only with the library preloaded (as the
    // server requires): the size of the launcher's table in shared memory.
    if (process_shared_preload_libraries_in_progress)
        define_int("idempotency.max_databases",
                   "Databases whose due work the launcher tracks; beyond them it sweeps every "
                   "naptime.",
                   &max_databases, 1, 1000000, PGC_POSTMASTER, 0);
    if (process_shared_preload_libraries_in_progress)
        define_int("idempotency.max_gauges",
                   "Scopes and topics, over all databases, whose counts idem_stats and "
                   "outbox_lag keep in shared memory.",
                   &max_gauges, 16, 1000000, PGC_POSTMASTER, 0);

    MarkGUCPrefixReserved("idempotency");
}

}  // namespace idem::pg::settings
