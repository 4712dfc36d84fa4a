// The SQL the relay runs: every name schema-qualified, every value a
// parameter. The claim, ack, nack and release statements are prepared once
// per connection (Database::connect), or sent whole each time through a
// pooler (Statement).
#pragma once

namespace idem::relay {

// The channel the extension notifies when events are enqueued.
inline constexpr const char* kChannel = "idempotency_outbox";

// At connect: the extension installed, usable by this role, and which of
// the later functions it has. Installed means schema idempotency has
// outbox_claim: the C++ extension, or the SQL edition, which may be a plain
// script with no extension at all (docs/managed-postgres.md).
inline constexpr const char* kCheckSql =
    "SELECT i.installed, "
    "       CASE WHEN i.installed THEN pg_catalog.has_schema_privilege('idempotency', 'USAGE') "
    "            ELSE false END, "
    "       CURRENT_USER::pg_catalog.text, "
    "       EXISTS (SELECT 1 FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n "
    "                 ON n.oid OPERATOR(pg_catalog.=) p.pronamespace "
    "                WHERE n.nspname OPERATOR(pg_catalog.=) 'idempotency' "
    "                  AND p.proname OPERATOR(pg_catalog.=) 'outbox_release'), "
    // Runs of a key per claim (idempotency.outbox_run_length) came with
    // 0.7.0, as outbox_counts did.
    "       EXISTS (SELECT 1 FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n "
    "                 ON n.oid OPERATOR(pg_catalog.=) p.pronamespace "
    "                WHERE n.nspname OPERATOR(pg_catalog.=) 'idempotency' "
    "                  AND p.proname OPERATOR(pg_catalog.=) 'outbox_counts'), "
    // The server backend's pid: another than the connection's backend key
    // means a pooler in between (Database::connect).
    "       pg_catalog.pg_backend_pid() "
    "  FROM (SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n "
    "                         ON n.oid OPERATOR(pg_catalog.=) p.pronamespace "
    "                        WHERE n.nspname OPERATOR(pg_catalog.=) 'idempotency' "
    "                          AND p.proname OPERATOR(pg_catalog.=) 'outbox_claim') AS installed) i";
// The claimed events in the order the claim handed them out (a key's run
// in its key's order), each with its size (payload and headers, in bytes).
// The relay decides which of them fit in its byte budget (ClaimBudget,
// loop/claim_budget.hpp); this statement applies the same cut with that
// budget's figures ($5 bytes left, $6 the first anyway) only so that the
// payload and headers of the others are never sent: they come without them
// (sent = false), and the relay releases them at once.
inline constexpr const char* kClaimSql =
    "SELECT s.id, s.topic, s.key, CASE WHEN s.fits THEN s.p END, CASE WHEN s.fits THEN s.h END, "
    "       s.dedup_key, s.attempt, s.enqueued, s.bytes, s.fits "
    "FROM (SELECT c.*, "
    "             pg_catalog.sum(c.bytes) OVER (ORDER BY c.n) OPERATOR(pg_catalog.<=) $5::pg_catalog.int8 "
    "             OR (c.n OPERATOR(pg_catalog.=) 1 AND $6::pg_catalog.bool) AS fits "
    "      FROM (SELECT d.n, d.id, d.topic, d.key, d.p, d.h, d.dedup_key, d.attempt, d.enqueued, "
    "                   pg_catalog.octet_length(d.p) OPERATOR(pg_catalog.+) "
    "                   COALESCE(pg_catalog.octet_length(d.h), 0) AS bytes "
    "            FROM (SELECT o.ordinality AS n, o.id, o.topic, o.key, "
    "                         o.payload::pg_catalog.text AS p, "
    "                         o.headers::pg_catalog.text AS h, o.dedup_key, o.attempt, "
    "                         pg_catalog.extract('epoch', o.enqueued_at) AS enqueued "
    "                  FROM idempotency.outbox_claim($1::pg_catalog.text, $2::pg_catalog.int4, "
    "                       $3::pg_catalog.interval, $4::pg_catalog.text[]) WITH ORDINALITY o "
    "                  OFFSET 0) d) c) s "
    "ORDER BY s.n";
inline constexpr const char* kAckSql = "SELECT idempotency.outbox_ack($1::pg_catalog.int8[])";
inline constexpr const char* kNackSql =
    "SELECT idempotency.outbox_nack($1::pg_catalog.int8, $2::pg_catalog.text, "
    "$3::pg_catalog.bool, $4::pg_catalog.interval)::pg_catalog.text";
inline constexpr const char* kReleaseSql =
    "SELECT idempotency.outbox_release($1::pg_catalog.int8[], $2::pg_catalog.text)";
// A statement the relay runs at every batch: prepared once per connection
// under `name`, or, through a pooler, where the next transaction may run on
// another server backend that never saw it, sent whole each time.
struct Statement {
    const char* name;
    const char* sql;
};
inline constexpr Statement kClaim{"idem_relay_claim", kClaimSql};
inline constexpr Statement kAck{"idem_relay_ack", kAckSql};
inline constexpr Statement kNack{"idem_relay_nack", kNackSql};
inline constexpr Statement kRelease{"idem_relay_release", kReleaseSql};

// In milliseconds; absent until the extension's library is loaded in the session.
inline constexpr const char* kRetrySettingsSql =
    "SELECT s.name, s.setting FROM pg_catalog.pg_settings s WHERE s.name OPERATOR(pg_catalog.=) "
    "ANY ('{idempotency.retry_base_delay,idempotency.retry_max_delay}'::pg_catalog.text[])";
inline constexpr const char* kLagSql =
    "SELECT COALESCE(pg_catalog.max(pg_catalog.extract('epoch', l.lag)), 0) "
    "FROM idempotency.outbox_lag l "
    "WHERE $1::pg_catalog.text[] IS NULL OR l.topic OPERATOR(pg_catalog.=) ANY ($1::pg_catalog.text[])";

// One pass of the sweeps (--maintenance-interval): each task and the rows
// it changed.
inline constexpr const char* kMaintenanceSql =
    "SELECT task, rows FROM idempotency.idem_maintenance()";

}  // namespace idem::relay
