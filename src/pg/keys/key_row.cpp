#include "pg/keys/key_row.hpp"

#include <cstring>

#include "pg/access/extension_objects.hpp"
#include "pg/access/row_access.hpp"
#include "pg/access/status_enum.hpp"

extern "C" {
#include "utils/rel.h"
}

namespace idem::pg {

namespace {

AttrNumber column_named(TupleDesc desc, const char* name) {
    for (int i = 0; i < desc->natts; ++i) {
        const Form_pg_attribute attribute = TupleDescAttr(desc, i);
        if (!attribute->attisdropped && std::strcmp(NameStr(attribute->attname), name) == 0)
            return attribute->attnum;
    }
    return 0;
}

KeyColumns known;
Oid known_table = InvalidOid;
std::uint64_t known_layout = 0;  // of the extension's objects they were found for

// A by-reference value copied out of the row (which lives in a buffer).
Datum copied(TupleTableSlot* row, AttrNumber column, bool* present) {
    *present = false;
    if (column == 0) return 0;
    bool isnull = false;
    const Datum value = slot_getattr(row, column, &isnull);
    if (isnull) return 0;
    *present = true;
    const Form_pg_attribute attribute = TupleDescAttr(row->tts_tupleDescriptor, column - 1);
    return datumCopy(value, attribute->attbyval, attribute->attlen);
}

template <typename T>
std::optional<T> optional_value(TupleTableSlot* row, AttrNumber column, T (*convert)(Datum)) {
    if (column == 0) return std::nullopt;
    bool isnull = false;
    const Datum value = slot_getattr(row, column, &isnull);
    if (isnull) return std::nullopt;
    return convert(value);
}

std::int64_t as_int8(Datum value) { return DatumGetInt64(value); }
std::int32_t as_int4(Datum value) { return DatumGetInt32(value); }
Micros as_timestamp(Datum value) { return DatumGetTimestampTz(value); }
bool as_bool(Datum value) { return DatumGetBool(value); }

void note(KeyWrite* write, AttrNumber column) {
    if (column != 0 && write->count < static_cast<int>(sizeof write->set / sizeof write->set[0]))
        write->set[write->count++] = column;
}

void put(KeyWrite* write, AttrNumber column, Datum value) {
    set_column(write->row, column, value);
    note(write, column);
}

// A column the statement names with the value it has (SET c = COALESCE(c,
// ...) on a row where c is set): column triggers see it named.
void keep(KeyWrite* write, AttrNumber column) { note(write, column); }

// The value when `change`, else the column kept as it is (named either way).
void put_or_keep(KeyWrite* write, AttrNumber column, bool change, Datum value) {
    if (change)
        put(write, column, value);
    else
        keep(write, column);
}

void clear(KeyWrite* write, AttrNumber column) {
    set_null(write->row, column);
    note(write, column);
}

void put_time(KeyWrite* write, AttrNumber column, std::optional<Micros> value) {
    if (value)
        put(write, column, TimestampTzGetDatum(*value));
    else
        clear(write, column);
}

// The tombstone's retention a finishing call asked for; a key that had one
// from an earlier failure and is not given one now has it cleared. Left
// alone (unnamed) when neither: the common complete writes no more.
void put_key_retention(KeyWrite* write, std::optional<Micros> key_retention) {
    const AttrNumber column = write->at->key_retention;
    if (column == 0) return;
    if (key_retention)
        put(write, column, interval_datum(*key_retention));
    else if (!write->row->tts_isnull[column - 1])
        clear(write, column);
}

void put_status(KeyWrite* write, Status status) {
    put(write, write->at->status, status_datum(write->status_type, status));
}

// Settles the key as the sweep would: out of the live keys' index, its
// lease cleared. Before 0.6.0's layout the sweep settles by the lease's
// end, and is left to do so.
void settle(KeyWrite* write) {
    const KeyColumns& at = *write->at;
    if (at.active_since == 0) return;
    clear(write, at.active_since);
    clear(write, at.lease_until);
}

// Filing a finished key for retention sets purge_at, an indexed column, so
// that write is not a HOT update whatever else it changes: it also settles
// the key, which saves the sweep's second row version.
void file_for_retention(KeyWrite* write, Micros purge_at) {
    put(write, write->at->purge_at, TimestampTzGetDatum(purge_at));
    settle(write);
}

// purge_at as put_time writes a time, the key filed (and so settled) when set.
void put_purge_time(KeyWrite* write, std::optional<Micros> purge_at) {
    if (purge_at)
        file_for_retention(write, *purge_at);
    else
        clear(write, write->at->purge_at);
}

}  // namespace

const KeyColumns& key_columns(Relation keys) {
    // Any change of the table's columns invalidates it, and so the layout.
    const TupleDesc desc = RelationGetDescr(keys);
    const std::uint64_t layout = extension_objects().layout;
    if (known_table == RelationGetRelid(keys) && known_layout == layout) return known;
    known = KeyColumns{column_named(desc, "scope"),           column_named(desc, "key"),
                       column_named(desc, "status"),          column_named(desc, "token"),
                       column_named(desc, "attempts"),        column_named(desc, "lease_until"),
                       column_named(desc, "next_attempt_at"), column_named(desc, "fingerprint"),
                       column_named(desc, "result"),          column_named(desc, "last_error"),
                       column_named(desc, "job_ref"),         column_named(desc, "created_at"),
                       column_named(desc, "updated_at"),      column_named(desc, "completed_at"),
                       column_named(desc, "expires_at"),      column_named(desc, "claimed_at"),
                       column_named(desc, "registered"),      column_named(desc, "lease_expired"),
                       column_named(desc, "holder_pid"),      column_named(desc, "purge_at"),
                       column_named(desc, "max_attempts"),    column_named(desc, "retention"),
                       column_named(desc, "active_since"),    column_named(desc, "key_retention"),
                       column_named(desc, "steps")};
    known_table = RelationGetRelid(keys);
    known_layout = layout;
    return known;
}

void read_stored_key(TupleTableSlot* row, const KeyColumns& at, Oid status_type, StoredKey* out) {
    slot_getallattrs(row);
    KeyState& state = out->state;
    bool isnull = false;
    state.status = status_from_datum(status_type, slot_getattr(row, at.status, &isnull));
    state.token = optional_value(row, at.token, as_int8);
    state.attempts = optional_value(row, at.attempts, as_int4).value_or(0);
    state.lease_until = optional_value(row, at.lease_until, as_timestamp);
    state.next_attempt_at = optional_value(row, at.next_attempt_at, as_timestamp);
    state.lease_expired = optional_value(row, at.lease_expired, as_bool).value_or(false);
    state.registered = optional_value(row, at.registered, as_bool).value_or(false);
    state.max_attempts = optional_value(row, at.max_attempts, as_int4);
    out->fingerprint = copied(row, at.fingerprint, &out->has_fingerprint);
    out->result = copied(row, at.result, &out->has_result);
    out->last_error = copied(row, at.last_error, &out->has_last_error);
    out->job_ref = copied(row, at.job_ref, &out->has_job_ref);
    out->claimed_at = optional_value(row, at.claimed_at, as_timestamp);
    // As stored (a TOAST pointer is copied, not its value): a claim reads
    // it only when it grants a key that has steps.
    out->steps = copied(row, at.steps, &state.has_steps);
    out->retention.reset();
    if (at.retention != 0) {
        const Datum kept = slot_getattr(row, at.retention, &isnull);
        Micros retention = 0;
        if (!isnull && interval_to_micros(DatumGetIntervalP(kept), &retention))
            out->retention = retention;
    }
}

void write_new_key(KeyWrite* write, const NewKey& key, std::int64_t token) {
    const KeyColumns& at = *write->at;
    const bool claim = key.status == Status::Processing;
    put(write, at.scope, PointerGetDatum(key.id.scope));
    put(write, at.key, PointerGetDatum(key.id.key));
    put_status(write, key.status);
    if (key.has_fingerprint) put(write, at.fingerprint, key.fingerprint);
    put(write, at.created_at, TimestampTzGetDatum(key.now));
    put(write, at.updated_at, TimestampTzGetDatum(key.now));
    put(write, at.attempts, Int32GetDatum(claim ? 1 : 0));
    put(write, at.registered, BoolGetDatum(!claim));
    put(write, at.lease_expired, BoolGetDatum(false));
    // A new key is live, registered or claimed: the sweeps find it (0.6.0 on).
    put(write, at.active_since, TimestampTzGetDatum(key.now));
    if (claim) {
        put(write, at.token, Int64GetDatum(token));
        put(write, at.lease_until, TimestampTzGetDatum(key.lease_until));
        put(write, at.claimed_at, TimestampTzGetDatum(key.now));
        put(write, at.holder_pid, Int32GetDatum(MyProcPid));
        put(write, at.max_attempts, Int32GetDatum(key.max_attempts));
        put(write, at.retention, interval_datum(key.retention));
    } else if (key.job_ref != nullptr) {
        put(write, at.job_ref, PointerGetDatum(key.job_ref));
    }
}

void write_grant(KeyWrite* write, const StoredKey& stored, const Grant& grant, Micros now,
                 std::int64_t token, std::int32_t attempts) {
    const KeyColumns& at = *write->at;
    put_status(write, Status::Processing);
    put(write, at.token, Int64GetDatum(token));
    put(write, at.attempts, Int32GetDatum(attempts));
    put(write, at.lease_until, TimestampTzGetDatum(grant.lease_until));
    // The first request fingerprint a key gets stays.
    put_or_keep(write, at.fingerprint, !stored.has_fingerprint && grant.has_fingerprint,
                grant.fingerprint);
    put(write, at.claimed_at, TimestampTzGetDatum(now));
    put(write, at.updated_at, TimestampTzGetDatum(now));
    clear(write, at.next_attempt_at);
    clear(write, at.expires_at);
    put(write, at.lease_expired, BoolGetDatum(false));
    put(write, at.holder_pid, Int32GetDatum(MyProcPid));
    if (grant.takeover)
        put(write, at.last_error, CStringGetTextDatum("lease expired"));
    else
        keep(write, at.last_error);
    clear(write, at.purge_at);
    // A key the sweep settled is live again; one still live keeps its time,
    // and with it its entry in the live keys' index.
    put_or_keep(write, at.active_since,
                at.active_since != 0 && write->row->tts_isnull[at.active_since - 1],
                TimestampTzGetDatum(now));
    put(write, at.max_attempts, Int32GetDatum(grant.max_attempts));
    put(write, at.retention, interval_datum(grant.retention));
}

void write_completion(KeyWrite* write, const StoredKey& stored, Datum result, bool has_result,
                      Micros now, Micros expires_at, std::optional<Micros> key_retention) {
    const KeyColumns& at = *write->at;
    put_status(write, Status::Completed);
    if (has_result)
        put(write, at.result, result);
    else
        clear(write, at.result);
    put(write, at.completed_at, TimestampTzGetDatum(now));
    put(write, at.updated_at, TimestampTzGetDatum(now));
    put(write, at.expires_at, TimestampTzGetDatum(expires_at));
    clear(write, at.next_attempt_at);
    put(write, at.lease_expired, BoolGetDatum(false));
    clear(write, at.holder_pid);
    put_key_retention(write, key_retention);
    // Settling is left to the sweep, so that the complete stays a HOT
    // update, unless the retention ends before the lease would: the key
    // would outlive it.
    const std::optional<Micros>& lease_until = stored.state.lease_until;
    if (!lease_until || expires_at < *lease_until)
        file_for_retention(write, expires_at);
    else
        keep(write, at.purge_at);
}

void write_expiry(KeyWrite* write, Status next, Micros now, std::optional<Micros> expires_at) {
    const KeyColumns& at = *write->at;
    put_status(write, next);
    put(write, at.last_error, CStringGetTextDatum("lease expired"));
    put(write, at.lease_expired, BoolGetDatum(true));
    put(write, at.next_attempt_at, TimestampTzGetDatum(now));
    put(write, at.updated_at, TimestampTzGetDatum(now));
    put_time(write, at.expires_at, expires_at);
    clear(write, at.holder_pid);
    put_purge_time(write, expires_at);
}

void write_failure(KeyWrite* write, Status next, const text* error, Micros now,
                   std::optional<Micros> next_attempt_at, std::optional<Micros> expires_at,
                   std::optional<Micros> key_retention) {
    const KeyColumns& at = *write->at;
    put_status(write, next);
    put(write, at.last_error, PointerGetDatum(error));
    put(write, at.updated_at, TimestampTzGetDatum(now));
    put_time(write, at.next_attempt_at, next_attempt_at);
    put_time(write, at.expires_at, expires_at);
    put(write, at.lease_expired, BoolGetDatum(false));
    clear(write, at.holder_pid);
    put_purge_time(write, expires_at);
    // A retryable failure settles its key too. Left to the sweep, its write
    // would follow at once (a finished key's settling is due when it
    // finishes) and hold the row while a retry's claim comes, which then
    // answers in_progress instead of taking the key.
    if (!expires_at) settle(write);
    put_key_retention(write, key_retention);
}

void write_renewal(KeyWrite* write, Micros lease_until) {
    put(write, write->at->lease_until, TimestampTzGetDatum(lease_until));
}

void write_release(KeyWrite* write, const StoredKey& stored, Status next, Micros now) {
    const KeyColumns& at = *write->at;
    put_status(write, next);
    clear(write, at.token);
    put(write, at.attempts, Int32GetDatum(stored.state.attempts - 1));
    clear(write, at.lease_until);
    put(write, at.next_attempt_at, TimestampTzGetDatum(now));
    put(write, at.updated_at, TimestampTzGetDatum(now));
    clear(write, at.claimed_at);
    clear(write, at.expires_at);
    put(write, at.lease_expired, BoolGetDatum(false));
    clear(write, at.holder_pid);
    clear(write, at.purge_at);
}

// Recording a step changes no other column: no index follows steps, so it
// is a HOT update, like a heartbeat.
void write_steps(KeyWrite* write, Datum steps) {
    if (write->at->steps == 0)
        elog(ERROR, "idempotency: the keys table has no steps column: update the extension");
    put(write, write->at->steps, steps);
}

Datum interval_datum(Micros micros) {
    Interval* interval = static_cast<Interval*>(palloc0(sizeof(Interval)));
    interval->time = micros;
    return IntervalPGetDatum(interval);
}

}  // namespace idem::pg
