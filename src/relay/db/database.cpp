#include "relay/db/database.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <libpq-fe.h>

#include "relay/db/pg_text.hpp"
#include "relay/db/statements.hpp"
#include "relay/observe/log.hpp"

namespace idem::relay {

namespace {

void on_notice(void*, const char* message) {
    log_info("database: %s", one_line(message).c_str());
}

}  // namespace

Database::Database(const Options& options) : options_(options) {
    if (!options.topics.empty()) topics_literal_ = array_literal(options.topics);
    lease_text_ = std::to_string(options.lease.count()) + " milliseconds";
}

Database::~Database() { disconnect(); }

void Database::disconnect() {
    if (conn_ != nullptr) PQfinish(conn_);
    conn_ = nullptr;
}

int Database::socket() const { return conn_ != nullptr ? PQsocket(conn_) : -1; }

DbStatus Database::connect(std::string* error) {
    disconnect();
    // Defaults first: the DSN (expanded from dbname) overrides them; the
    // client encoding comes last because the sinks write UTF-8.
    const char* keywords[] = {"connect_timeout", "fallback_application_name", "keepalives",
                              "keepalives_idle", "keepalives_interval", "keepalives_count",
                              "dbname", "client_encoding", nullptr};
    const char* values[] = {"10", "idem-relay", "1", "30", "10", "3",
                            options_.dsn.c_str(), "UTF8", nullptr};
    pg_conn* conn = PQconnectdbParams(keywords, values, 1);
    if (conn == nullptr) {
        *error = "out of memory";
        return DbStatus::Lost;
    }
    if (PQstatus(conn) != CONNECTION_OK) {
        *error = one_line(PQerrorMessage(conn));
        PQfinish(conn);
        return DbStatus::Lost;
    }
    conn_ = conn;
    notified_ = false;
    // Server notices (such as "terminating connection due to immediate
    // shutdown") go through our log, one line each.
    PQsetNoticeProcessor(conn_, on_notice, nullptr);
    // A connection that is not fully set up is not kept.
    auto setup_failed = [this](DbStatus failed) {
        disconnect();
        return failed == DbStatus::Fatal ? DbStatus::Fatal : DbStatus::Lost;
    };

    DbStatus status = DbStatus::Ok;
    PGresult* check = PQexec(conn_, kCheckSql);
    if (PQresultStatus(check) != PGRES_TUPLES_OK)
        return setup_failed(failure(check, "checking the extension", error));
    const bool installed = PQntuples(check) == 1 && strcmp(PQgetvalue(check, 0, 0), "t") == 0;
    const bool usage = installed && strcmp(PQgetvalue(check, 0, 1), "t") == 0;
    const std::string role = PQntuples(check) == 1 ? PQgetvalue(check, 0, 2) : "";
    can_release_ = PQntuples(check) == 1 && strcmp(PQgetvalue(check, 0, 3), "t") == 0;
    const bool can_run = PQntuples(check) == 1 && strcmp(PQgetvalue(check, 0, 4), "t") == 0;
    const std::string backend_pid = PQntuples(check) == 1 ? PQgetvalue(check, 0, 5) : "";
    PQclear(check);
    if (!installed || !usage) {
        *error = !installed ? "the idempotency extension is not installed in this database "
                              "(CREATE EXTENSION idempotency, or the SQL edition)"
                            : "role " + role + " may not use schema idempotency (GRANT USAGE ON "
                              "SCHEMA idempotency TO " + role + ")";
        disconnect();
        return DbStatus::Fatal;
    }
    // A pooler (PgBouncer, Odyssey and the like) gives the client its own
    // backend key, not the server backend's pid. Through it, each
    // transaction may run on another server backend, shared with other
    // clients: nothing is left in the session (no LISTEN, no SET, no
    // prepared statement), the settings are set in each claim's transaction,
    // and the relay polls instead of being woken.
    pooled_ = PQbackendPID(conn_) != atoi(backend_pid.c_str());
    if (pooled_)
        log_info("database: connected through a pooler (the server's backend is not this "
                 "connection's): no LISTEN, a poll every %lld ms; settings set in each "
                 "transaction",
                 static_cast<long long>(options_.poll_interval.count()));
    // A claim's transaction stays open while its events are delivered; one
    // left idle longer than a lease (a relay frozen) is ended by the server,
    // which gives its events back as a lease would.
    settings_.clear();
    settings_.push_back("idle_in_transaction_session_timeout = " +
                        std::to_string(options_.lease.count()));
    if (can_run && options_.run_length > 1)
        settings_.push_back("idempotency.outbox_run_length = " +
                            std::to_string(options_.run_length));
    if (!pooled_) {
        if (!exec_setup("LISTEN idempotency_outbox", error, &status)) return setup_failed(status);
        for (const std::string& setting : settings_)
            if (!exec_setup(("SET " + setting).c_str(), error, &status)) return setup_failed(status);
        for (const Statement* statement : {&kClaim, &kAck, &kNack, &kRelease}) {
            if (statement == &kRelease && !can_release_) continue;
            PGresult* result = PQprepare(conn_, statement->name, statement->sql, 0, nullptr);
            if (PQresultStatus(result) != PGRES_COMMAND_OK)
                return setup_failed(failure(result, "preparing", error));
            PQclear(result);
        }
    }
    // Events committed before the LISTEN took effect are found by the first claim.
    notified_ = true;
    settings_read_ = false;
    return DbStatus::Ok;
}

bool Database::exec_setup(const char* sql, std::string* error, DbStatus* status) {
    PGresult* result = PQexec(conn_, sql);
    if (PQresultStatus(result) == PGRES_COMMAND_OK) {
        PQclear(result);
        return true;
    }
    *status = failure(result, sql, error);
    return false;
}

DbStatus Database::failure(PGresult* result, const char* what, std::string* error) {
    // Copied: the result is freed below.
    const char* field = result != nullptr ? PQresultErrorField(result, PG_DIAG_SQLSTATE) : nullptr;
    const std::string state_text = field != nullptr ? field : "";
    const char* sqlstate = field != nullptr ? state_text.c_str() : nullptr;
    last_sqlstate_ = state_text;
    const char* primary =
        result != nullptr ? PQresultErrorField(result, PG_DIAG_MESSAGE_PRIMARY) : nullptr;
    std::string message = primary != nullptr ? one_line(primary)
                          : result != nullptr ? one_line(PQresultErrorMessage(result))
                                              : "";
    if (message.empty() && conn_ != nullptr) message = one_line(PQerrorMessage(conn_));
    *error = std::string(what) + ": " + message;
    if (sqlstate != nullptr) *error += std::string(" (SQLSTATE ") + sqlstate + ")";
    if (result != nullptr) PQclear(result);

    const bool connection_ok = conn_ != nullptr && PQstatus(conn_) == CONNECTION_OK;
    const DbStatus status = classify_failure(sqlstate, connection_ok);
    if (status == DbStatus::Lost) disconnect();
    return status;
}

void Database::collect_notifications() {
    if (conn_ == nullptr) return;
    while (PGnotify* notify = PQnotifies(conn_)) {
        if (strcmp(notify->relname, kChannel) == 0) {
            ++notifications_;
            const char* topic = notify->extra != nullptr ? notify->extra : "";
            // "*": events of topics the notifier could not name one by one.
            if (options_.topics.empty() || strcmp(topic, "*") == 0 ||
                std::find(options_.topics.begin(), options_.topics.end(), topic) !=
                    options_.topics.end())
                notified_ = true;
        }
        PQfreemem(notify);
    }
}

bool Database::consume_input() {
    if (conn_ == nullptr) return false;
    if (PQconsumeInput(conn_) == 0 || PQstatus(conn_) != CONNECTION_OK) {
        disconnect();
        return false;
    }
    collect_notifications();
    return true;
}

bool Database::take_notified() {
    const bool notified = notified_;
    notified_ = false;
    return notified;
}

void Database::read_events(PGresult* result, Clock::time_point lease_until,
                           std::vector<Event>* events) {
    const int rows = PQntuples(result);
    events->reserve(events->size() + static_cast<std::size_t>(rows));
    for (int row = 0; row < rows; ++row) {
        Event event;
        event.id = strtoll(PQgetvalue(result, row, 0), nullptr, 10);
        event.topic = PQgetvalue(result, row, 1);
        if (!PQgetisnull(result, row, 2)) event.key = std::string(PQgetvalue(result, row, 2));
        event.payload = PQgetvalue(result, row, 3);
        if (!PQgetisnull(result, row, 4)) event.headers = std::string(PQgetvalue(result, row, 4));
        if (!PQgetisnull(result, row, 5)) event.dedup_key = std::string(PQgetvalue(result, row, 5));
        event.attempt = atoi(PQgetvalue(result, row, 6));
        event.enqueued_at = parse_double(PQgetvalue(result, row, 7));
        event.claimed_bytes = strtoll(PQgetvalue(result, row, 8), nullptr, 10);
        event.sent = strcmp(PQgetvalue(result, row, 9), "t") == 0;
        event.lease_until = lease_until;
        events->push_back(std::move(event));
    }
}

bool Database::in_transaction() const {
    return conn_ != nullptr && PQtransactionStatus(conn_) != PQTRANS_IDLE;
}

void Database::queued(int sent) {
    if (sent == 0) send_failed_ = true;
}

void Database::send_claim(const ClaimArgs& args) {
    const std::string batch = std::to_string(args.count);
    const std::string budget = std::to_string(args.bytes_left);
    const char* params[6] = {options_.relay.c_str(), batch.c_str(), lease_text_.c_str(),
                             topics_literal_.empty() ? nullptr : topics_literal_.c_str(),
                             budget.c_str(), args.first_anyway ? "true" : "false"};
    // libpq copies the parameters into its buffer here.
    queued(send(kClaim, 6, params));
}

int Database::send(const Statement& statement, int count, const char* const* params) {
    return pooled_ ? PQsendQueryParams(conn_, statement.sql, count, nullptr, params, nullptr,
                                       nullptr, 0)
                   : PQsendQueryPrepared(conn_, statement.name, count, params, nullptr, nullptr, 0);
}

PGresult* Database::exec(const Statement& statement, int count, const char* const* params) {
    return pooled_ ? PQexecParams(conn_, statement.sql, count, nullptr, params, nullptr, nullptr, 0)
                   : PQexecPrepared(conn_, statement.name, count, params, nullptr, nullptr, 0);
}

DbStatus Database::rollback_now(std::string* error) {
    PGresult* result = PQexec(conn_, "ROLLBACK");
    if (PQresultStatus(result) != PGRES_COMMAND_OK) return failure(result, "ROLLBACK", error);
    PQclear(result);
    return DbStatus::Ok;
}

DbStatus Database::begin_claim(const ClaimArgs& args, std::vector<Event>* events,
                               std::string* error) {
    return commit_round(Settlement{}, nullptr, &args, events, error);
}

// One pipeline: [settlement, COMMIT] when a transaction is open, then
// [BEGIN, claim] when next is given; one sync, the results read in order.
// The first failure decides; statements after it until the sync are
// skipped by the server, and a transaction left failed is rolled back.
DbStatus Database::commit_round(const Settlement& settlement, SettleResult* result,
                                const ClaimArgs* next, std::vector<Event>* events,
                                std::string* error) {
    if (events != nullptr) events->clear();
    if (conn_ == nullptr) return DbStatus::Lost;
    const bool committing = in_transaction();
    if (PQenterPipelineMode(conn_) == 0) return failure(nullptr, "pipeline", error);
    send_failed_ = false;
    std::vector<RoundStep> steps;
    if (committing) send_settlement(settlement, &steps);
    Clock::time_point lease_until{};
    if (next != nullptr) lease_until = send_next_claim(*next, &steps);
    if (send_failed_ || PQpipelineSync(conn_) == 0) {
        disconnect();
        *error = "cannot send to the database";
        return DbStatus::Lost;
    }
    RoundFailure failed;
    if (!read_round(steps, result, lease_until, events, &failed)) {
        if (failed.result != nullptr) PQclear(failed.result);
        disconnect();
        *error = "the database connection broke during a round trip";
        return DbStatus::Lost;
    }
    collect_notifications();
    return end_round(failed, next != nullptr, events, error);
}

// The open transaction's acks, nacks and releases, and its COMMIT.
void Database::send_settlement(const Settlement& settlement, std::vector<RoundStep>* steps) {
    if (!settlement.acks.empty()) {
        const std::string literal = id_array(settlement.acks);
        const char* params[1] = {literal.c_str()};
        queued(send(kAck, 1, params));
        steps->push_back(RoundStep::Ack);
    }
    for (const NackRequest& nack : settlement.nacks) {
        const std::string id_text = std::to_string(nack.id);
        const std::string retry_text =
            nack.retry_in_ms ? std::to_string(*nack.retry_in_ms) + " milliseconds" : std::string();
        const char* params[4] = {id_text.c_str(), nack.message.c_str(),
                                 nack.retryable ? "true" : "false",
                                 nack.retry_in_ms ? retry_text.c_str() : nullptr};
        queued(send(kNack, 4, params));
        steps->push_back(RoundStep::Nack);
    }
    if (!settlement.releases.empty() && can_release_) {
        const std::string literal = id_array(settlement.releases);
        const char* params[2] = {literal.c_str(), options_.relay.c_str()};
        queued(send(kRelease, 2, params));
        steps->push_back(RoundStep::Release);
    }
    queued(PQsendQueryParams(conn_, "COMMIT", 0, nullptr, nullptr, nullptr, nullptr, 0));
    steps->push_back(RoundStep::Commit);
}

// BEGIN and the claim; the claimed events' lease runs from here.
Clock::time_point Database::send_next_claim(const ClaimArgs& args, std::vector<RoundStep>* steps) {
    queued(PQsendQueryParams(conn_, "BEGIN", 0, nullptr, nullptr, nullptr, nullptr, 0));
    steps->push_back(RoundStep::Begin);
    if (pooled_)
        for (const std::string& setting : settings_) {
            const std::string local = "SET LOCAL " + setting;
            queued(PQsendQueryParams(conn_, local.c_str(), 0, nullptr, nullptr, nullptr, nullptr, 0));
            steps->push_back(RoundStep::Setting);
        }
    const Clock::time_point lease_until = Clock::now() + options_.lease;
    send_claim(args);
    steps->push_back(RoundStep::Claim);
    return lease_until;
}

// The results of the round's statements and of its sync, in order; what
// they return is kept until the first failure (*failed). False when the
// connection broke before every result came.
bool Database::read_round(const std::vector<RoundStep>& steps, SettleResult* result,
                          Clock::time_point lease_until, std::vector<Event>* events,
                          RoundFailure* failed) {
    static const char* const kWhat[] = {"outbox_ack", "outbox_nack", "outbox_release",
                                        "COMMIT", "BEGIN", "SET LOCAL", "outbox_claim"};
    for (const RoundStep step : steps) {
        PGresult* r = PQgetResult(conn_);
        if (r == nullptr) return false;
        // The end of this statement's results.
        while (PGresult* extra = PQgetResult(conn_)) PQclear(extra);
        const ExecStatusType status = PQresultStatus(r);
        const bool ok = status == PGRES_TUPLES_OK || status == PGRES_COMMAND_OK;
        if (!ok) {
            if (failed->result == nullptr && status != PGRES_PIPELINE_ABORTED) {
                failed->result = r;
                failed->what = kWhat[static_cast<int>(step)];
            } else {
                PQclear(r);
            }
            continue;
        }
        if (failed->result == nullptr) {
            switch (step) {
                case RoundStep::Ack: result->acked = strtoll(PQgetvalue(r, 0, 0), nullptr, 10); break;
                case RoundStep::Nack: result->nack_states.emplace_back(PQgetvalue(r, 0, 0)); break;
                case RoundStep::Release:
                    result->released = strtoll(PQgetvalue(r, 0, 0), nullptr, 10);
                    break;
                case RoundStep::Claim: read_events(r, lease_until, events); break;
                case RoundStep::Commit:
                case RoundStep::Begin:
                case RoundStep::Setting: break;
            }
        }
        PQclear(r);
    }
    // The sync's own result.
    PGresult* sync = PQgetResult(conn_);
    const bool synced = sync != nullptr && PQresultStatus(sync) == PGRES_PIPELINE_SYNC;
    if (sync != nullptr) PQclear(sync);
    return synced && PQexitPipelineMode(conn_) != 0;
}

// After a whole round: a failure rolls back what is left of the transaction;
// a claim that found nothing keeps no transaction open.
DbStatus Database::end_round(const RoundFailure& failed, bool claimed,
                             std::vector<Event>* events, std::string* error) {
    if (failed.result != nullptr) {
        if (events != nullptr) events->clear();
        const DbStatus status = failure(failed.result, failed.what, error);
        std::string ignored;
        if (conn_ != nullptr && in_transaction()) (void)rollback_now(&ignored);
        return status;
    }
    if (claimed && events->empty()) {
        // Nothing claimed: no transaction is kept open for nothing (it would
        // also hold back our notifications).
        const DbStatus status = rollback_now(error);
        if (status != DbStatus::Ok) return status;
    }
    if (claimed && !settings_read_) read_retry_settings();
    return DbStatus::Ok;
}

void Database::read_retry_settings() {
    PGresult* result = PQexec(conn_, kRetrySettingsSql);
    if (PQresultStatus(result) == PGRES_TUPLES_OK) {
        for (int row = 0; row < PQntuples(result); ++row) {
            const Millis value(strtoll(PQgetvalue(result, row, 1), nullptr, 10));
            if (strcmp(PQgetvalue(result, row, 0), "idempotency.retry_base_delay") == 0)
                retry_settings_.base = value;
            else
                retry_settings_.max = value;
        }
        settings_read_ = PQntuples(result) == 2;
    }
    PQclear(result);
}

DbStatus Database::release(const std::vector<std::int64_t>& ids, std::int64_t* changed,
                           std::string* error) {
    if (conn_ == nullptr) return DbStatus::Lost;
    const std::string literal = id_array(ids);
    const char* params[2] = {literal.c_str(), options_.relay.c_str()};
    PGresult* result = exec(kRelease, 2, params);
    collect_notifications();
    if (PQresultStatus(result) != PGRES_TUPLES_OK) return failure(result, "outbox_release", error);
    *changed = strtoll(PQgetvalue(result, 0, 0), nullptr, 10);
    PQclear(result);
    return DbStatus::Ok;
}

DbStatus Database::ack(const std::vector<std::int64_t>& ids, std::int64_t* changed,
                       std::string* error) {
    if (conn_ == nullptr) return DbStatus::Lost;
    const std::string literal = id_array(ids);
    const char* params[1] = {literal.c_str()};
    PGresult* result = exec(kAck, 1, params);
    collect_notifications();
    if (PQresultStatus(result) != PGRES_TUPLES_OK) return failure(result, "outbox_ack", error);
    *changed = strtoll(PQgetvalue(result, 0, 0), nullptr, 10);
    PQclear(result);
    return DbStatus::Ok;
}

DbStatus Database::nack(std::int64_t id, const std::string& message, bool retryable,
                        const std::optional<std::int64_t>& retry_in_ms, std::string* state,
                        std::string* error) {
    if (conn_ == nullptr) return DbStatus::Lost;
    const std::string id_text = std::to_string(id);
    const std::string retry_text =
        retry_in_ms ? std::to_string(*retry_in_ms) + " milliseconds" : std::string();
    const char* params[4] = {id_text.c_str(), message.c_str(), retryable ? "true" : "false",
                             retry_in_ms ? retry_text.c_str() : nullptr};
    PGresult* result = exec(kNack, 4, params);
    collect_notifications();
    if (PQresultStatus(result) != PGRES_TUPLES_OK) return failure(result, "outbox_nack", error);
    *state = PQgetvalue(result, 0, 0);
    PQclear(result);
    return DbStatus::Ok;
}

DbStatus Database::outbox_lag(double* seconds, std::string* error) {
    if (conn_ == nullptr) return DbStatus::Lost;
    const char* params[1] = {topics_literal_.empty() ? nullptr : topics_literal_.c_str()};
    PGresult* result = PQexecParams(conn_, kLagSql, 1, nullptr, params, nullptr, nullptr, 0);
    collect_notifications();
    if (PQresultStatus(result) != PGRES_TUPLES_OK) return failure(result, "outbox_lag", error);
    *seconds = strtod(PQgetvalue(result, 0, 0), nullptr);
    PQclear(result);
    return DbStatus::Ok;
}

}  // namespace idem::relay
