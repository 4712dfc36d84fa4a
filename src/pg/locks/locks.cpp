// Resource locks: pooler-safe leases with fencing tokens (the durable form
// of SET NX PX). A live lock is read without locking; only a free or expired
// one is taken, by an upsert that waits for a concurrent taker to finish.
#include "pg/locks/locks.hpp"

#include <algorithm>

#include "core/error.hpp"
#include "pg/access/extension_objects.hpp"
#include "pg/access/row_access.hpp"
#include "pg/access/spi.hpp"
#include "pg/boundary/args.hpp"
#include "pg/boundary/guard.hpp"
#include "pg/boundary/settings.hpp"
#include "pg/runtime/due_table.hpp"
#include "pg/stats/metrics.hpp"
#include "pg/waiting/wakeup.hpp"

namespace idem::pg {

namespace {

Statement kHolder = {
    "SELECT expires_at FROM @locks@ WHERE resource = $1", 1, {TEXTOID}, nullptr};

Statement kTake = {
    "INSERT INTO @locks@ AS l (resource, token, owner, acquired_at, expires_at) "
    "VALUES ($1, pg_catalog.nextval(@token_seq@), $2, $3, $4) "
    "ON CONFLICT (resource) DO UPDATE SET token = excluded.token, owner = excluded.owner, "
    "acquired_at = excluded.acquired_at, expires_at = excluded.expires_at "
    "WHERE l.expires_at <= $3 RETURNING l.token",
    4, {TEXTOID, TEXTOID, TIMESTAMPTZOID, TIMESTAMPTZOID}, nullptr};

Statement kRenew = {
    "UPDATE @locks@ SET expires_at = $3 "
    "WHERE resource = $1 AND token = $2 AND expires_at > $4",
    4, {TEXTOID, INT8OID, TIMESTAMPTZOID, TIMESTAMPTZOID}, nullptr};

Statement kUnlock = {"DELETE FROM @locks@ WHERE resource = $1 AND token = $2", 2,
                     {TEXTOID, INT8OID}, nullptr};

Statement kAssert = {
    "SELECT expires_at FROM @locks@ WHERE resource = $1 AND token = $2 FOR SHARE", 2,
    {TEXTOID, INT8OID}, nullptr};

// Whether another transaction is taking or changing the lock now.
bool taker_in_progress(const text* resource) {
    OpenTable locks = open_to_read(extension_objects().locks);
    const Datum key[] = {PointerGetDatum(resource)};
    const bool busy = row_being_written(&locks, key);
    close_table(&locks);
    return busy;
}

// A new token when the lock is free or expired; nothing while a holder
// lives (then *holder_until tells until when, as far as is known). Waits
// for a transaction that is taking or changing the lock until `deadline`
// at the most (a millisecond when that has passed: never longer).
std::optional<std::int64_t> try_take(const text* resource, const text* owner, Micros ttl,
                                     Micros deadline, Micros* holder_until) {
    const Micros now = GetCurrentTimestamp();
    *holder_until = now + 10 * kMillisecond;  // a concurrent taker: look again soon
    Params probe;
    probe.add_text(resource);
    // The newest committed holder, whatever the isolation level: under a
    // transaction snapshot, a waiter would otherwise see an unlocked holder
    // alive until its wait's end. The take below follows SQL's rules.
    if (execute_latest(kHolder, probe) > 0 && *column_timestamp(1) > now) {
        *holder_until = *column_timestamp(1);
        return std::nullopt;
    }

    // A caller without time left to wait answers at once while a taker's
    // transaction is open (the upsert would wait for it; a taker starting
    // after this look still makes it wait a millisecond).
    if (deadline <= now && taker_in_progress(resource)) return std::nullopt;

    Params params;
    params.add_text(resource).add_text(owner).add_timestamp(now).add_timestamp(now + ttl);
    // ON CONFLICT DO UPDATE locks the row even when its WHERE refuses: a
    // caller that waited for a concurrent taker and got nothing must not
    // keep that lock (it would block the holder's renew and unlock).
    bool timed_out = false;
    const Micros patience = std::max<Micros>(deadline - now, kMillisecond);
    if (execute_in_subtransaction(kTake, params, true, 0, patience, &timed_out) == 0)
        return std::nullopt;
    return column_int8(1);
}

Datum lock_body(FunctionCallInfo fcinfo) {
    const text* resource = name_arg(fcinfo, 0, "resource");
    const Micros ttl = lease_arg(fcinfo, 1, "ttl");
    const text* owner = optional_name_arg(fcinfo, 2, "owner");
    const std::optional<Micros> wait = wait_arg(fcinfo, 3);
    const Micros deadline = GetCurrentTimestamp() + wait.value_or(0);

    // A waiting caller sleeps until the holder's unlock commits, its lock
    // expires, or the wait ends.
    const std::uint64_t channel = wake_channel(WaitTopic::Lock, {resource});
    connect_spi();
    std::optional<std::int64_t> token;
    for (int round = 0;; ++round) {
        if (wait) prepare_to_wait(channel);
        Micros holder_until = 0;
        token = try_take(resource, owner, ttl, deadline, &holder_until);
        if (token || GetCurrentTimestamp() >= deadline) break;
        wait_for_wakeup(std::min(deadline, holder_until + kMillisecond), round);
        CHECK_FOR_INTERRUPTS();
    }
    if (wait) stop_waiting();
    finish_spi();
    if (!token) {
        count_answer(Counter::LocksContended);
        PG_RETURN_NULL();
    }
    count_on_commit(Counter::LocksAcquired);
    note_due_on_commit(DueKind::Retention, GetCurrentTimestamp() + ttl);
    PG_RETURN_INT64(*token);
}

Datum renew_body(FunctionCallInfo fcinfo) {
    const text* resource = name_arg(fcinfo, 0, "resource");
    const std::int64_t token = token_arg(fcinfo, 1);
    const Micros ttl = lease_arg(fcinfo, 2, "ttl");
    const Micros now = GetCurrentTimestamp();

    Params params;
    params.add_text(resource).add_int8(token).add_timestamp(now + ttl).add_timestamp(now);
    connect_spi();
    const bool renewed = execute(kRenew, params) > 0;
    finish_spi();
    PG_RETURN_BOOL(renewed);
}

Datum unlock_body(FunctionCallInfo fcinfo) {
    const text* resource = name_arg(fcinfo, 0, "resource");
    const std::int64_t token = token_arg(fcinfo, 1);

    Params params;
    params.add_text(resource).add_int8(token);
    connect_spi();
    const bool released = execute(kUnlock, params) > 0;
    finish_spi();
    if (released) wake_on_commit(wake_channel(WaitTopic::Lock, {resource}));
    PG_RETURN_BOOL(released);
}

Datum assert_body(FunctionCallInfo fcinfo) {
    const text* resource = name_arg(fcinfo, 0, "resource");
    const std::int64_t token = token_arg(fcinfo, 1);

    Params params;
    params.add_text(resource).add_int8(token);
    connect_spi();
    const bool held = execute(kAssert, params, 1) > 0 && *column_timestamp(1) > GetCurrentTimestamp();
    finish_spi();
    if (!held) {
        count_answer(Counter::StaleTokens);
        throw_error(sqlstate::stale_token, "token %lld does not hold the lock on resource \"%s\"",
                    static_cast<long long>(token), text_to_cstring(resource));
    }
    PG_RETURN_VOID();
}

// The retention purge of the sweeps: expired locks.
Statement kPurgeLocks = {
    "DELETE FROM @locks@ WHERE ctid = ANY (ARRAY("
    "  SELECT ctid FROM @locks@ WHERE expires_at <= $1 ORDER BY expires_at "
    "  LIMIT $2 FOR UPDATE SKIP LOCKED))",
    2, {TIMESTAMPTZOID, INT4OID}, nullptr};

}  // namespace

std::uint64_t purge_locks(int batch) { return execute_due(kPurgeLocks, GetCurrentTimestamp(), batch); }

}  // namespace idem::pg

IDEM_SQL_FUNCTION(idem_lock, idem::pg::lock_body)
IDEM_SQL_FUNCTION(idem_lock_renew, idem::pg::renew_body)
IDEM_SQL_FUNCTION(idem_unlock, idem::pg::unlock_body)
IDEM_SQL_FUNCTION(idem_lock_assert, idem::pg::assert_body)
