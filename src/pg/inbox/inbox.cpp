// inbox_receive: the consumer-side inbox. A unique (source, message_id) row
// inserted with ON CONFLICT DO NOTHING: a concurrent duplicate waits for the
// first transaction and then sees its row (or takes its place after a rollback).
#include "pg/inbox/inbox.hpp"

#include "pg/access/spi.hpp"
#include "pg/boundary/args.hpp"
#include "pg/boundary/guard.hpp"
#include "pg/boundary/settings.hpp"
#include "pg/runtime/due_table.hpp"
#include "pg/stats/metrics.hpp"

namespace idem::pg {

namespace {

Statement kReceive = {
    "INSERT INTO @inbox@ (source, message_id, payload, received_at) "
    "VALUES ($1, $2, $3, $4) ON CONFLICT (source, message_id) DO NOTHING RETURNING true",
    4, {TEXTOID, TEXTOID, JSONBOID, TIMESTAMPTZOID}, nullptr};

Datum receive_body(FunctionCallInfo fcinfo) {
    const text* message_id = name_arg(fcinfo, 0, "message_id");
    const text* source = name_arg(fcinfo, 1, "source");
    const Datum payload = optional_jsonb_arg(fcinfo, 2, "payload");

    Params params;
    params.add_text(source).add_text(message_id).add_datum(payload, !PG_ARGISNULL(2));
    params.add_timestamp(GetCurrentTimestamp());
    connect_spi();
    const bool first_time = execute(kReceive, params) > 0;
    finish_spi();
    if (!first_time) count_answer(Counter::InboxDuplicates);
    if (first_time)
        note_due_on_commit(DueKind::Retention,
                           GetCurrentTimestamp() + settings::seconds(settings::inbox_retention_s));
    PG_RETURN_BOOL(first_time);
}

// The retention purge of the sweeps: rows older than inbox_retention.
Statement kPurgeInbox = {
    "DELETE FROM @inbox@ WHERE ctid = ANY (ARRAY("
    "  SELECT ctid FROM @inbox@ WHERE received_at <= $1 ORDER BY received_at "
    "  LIMIT $2 FOR UPDATE SKIP LOCKED))",
    2, {TIMESTAMPTZOID, INT4OID}, nullptr};

}  // namespace

std::uint64_t purge_inbox(int batch) {
    return execute_due(kPurgeInbox,
                       GetCurrentTimestamp() - settings::seconds(settings::inbox_retention_s), batch);
}

}  // namespace idem::pg

IDEM_SQL_FUNCTION(inbox_receive, idem::pg::receive_body)
