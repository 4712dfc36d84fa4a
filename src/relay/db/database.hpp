// The database side of the relay (libpq, used by one thread only): the
// connection, LISTEN idempotency_outbox, and the outbox_claim / outbox_ack /
// outbox_nack calls, each classified so that the caller knows whether to
// carry on, try again, reconnect or give up. Through a pooler in
// transaction mode it keeps nothing in the session (see connect).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "relay/db/db_status.hpp"
#include "relay/db/retry_delay.hpp"
#include "relay/db/statements.hpp"
#include "relay/event.hpp"
#include "relay/options.hpp"

struct pg_conn;
struct pg_result;

namespace idem::relay {

// What one claim asks for (outbox_claim with --relay, --lease, --topics).
struct ClaimArgs {
    int count = 0;
    // The byte budget (loop/claim_budget.hpp): events past it come without
    // their payload and headers (Event::sent = false).
    std::int64_t bytes_left = 0;
    bool first_anyway = false;
};

struct NackRequest {
    std::int64_t id = 0;
    std::string message;
    bool retryable = true;
    std::optional<std::int64_t> retry_in_ms;
};

// The outcomes written in the open transaction, before its COMMIT.
struct Settlement {
    std::vector<std::int64_t> acks;
    std::vector<NackRequest> nacks;
    std::vector<std::int64_t> releases;  // only when can_release()
    bool empty() const { return acks.empty() && nacks.empty() && releases.empty(); }
};

struct SettleResult {
    std::int64_t acked = 0;
    std::vector<std::string> nack_states;  // one per nack, in order
    std::int64_t released = 0;
};

class Database {
public:
    explicit Database(const Options& options);
    ~Database();
    Database(const Database&) = delete;
    Database& operator=(const Database&) = delete;

    // Connects, checks that the extension is there, LISTENs, sets the
    // session's settings and prepares the statements; through a pooler, none
    // of these (the settings go in each claim's transaction). Lost means "try
    // again later".
    DbStatus connect(std::string* error);
    void disconnect();
    bool connected() const { return conn_ != nullptr; }
    int socket() const;

    // BEGIN and a claim in that transaction, in one round trip: what the
    // claim writes waits for the COMMIT, which writes each event once with
    // the ack or nack of the same transaction. With no event claimed the
    // transaction is rolled back at once.
    DbStatus begin_claim(const ClaimArgs& args, std::vector<Event>* events, std::string* error);
    // The settlement in the open transaction and its COMMIT, then (when next
    // is given) BEGIN and the next claim: one round trip (libpq pipeline).
    // On a failure the open transaction is rolled back: none of it counts.
    DbStatus commit_round(const Settlement& settlement, SettleResult* result,
                          const ClaimArgs* next, std::vector<Event>* events, std::string* error);
    bool in_transaction() const;

    // outbox_release: claimed events back to pending, the attempt not
    // counted. Only when can_release() (the extension has it).
    DbStatus release(const std::vector<std::int64_t>& ids, std::int64_t* changed,
                     std::string* error);
    bool can_release() const { return can_release_; }
    // The extension's backoff settings in this session (read after a claim).
    const RetrySettings& retry_settings() const { return retry_settings_; }
    // The SQLSTATE of the last failed call ("" when it had none).
    const std::string& last_sqlstate() const { return last_sqlstate_; }
    // outbox_ack; *changed is its result.
    DbStatus ack(const std::vector<std::int64_t>& ids, std::int64_t* changed, std::string* error);
    // outbox_nack; *state is the event's state after it.
    DbStatus nack(std::int64_t id, const std::string& message, bool retryable,
                  const std::optional<std::int64_t>& retry_in_ms, std::string* state,
                  std::string* error);
    // max(lag) of idempotency.outbox_lag over our topics (Fatal when the role
    // may not read the view).
    DbStatus outbox_lag(double* seconds, std::string* error);

    // Reads what the server sent while we were idle (call when the socket is
    // readable). False when the connection turned out to be gone.
    bool consume_input();
    // True (once) when a notification for one of our topics has arrived.
    bool take_notified();
    std::uint64_t notifications() const { return notifications_; }

private:
    DbStatus failure(::pg_result* result, const char* what, std::string* error);
    void send_claim(const ClaimArgs& args);
    // A statement, prepared or (through a pooler) sent whole.
    int send(const Statement& statement, int count, const char* const* params);
    ::pg_result* exec(const Statement& statement, int count, const char* const* params);
    void queued(int sent);  // a PQsend* call's result
    void read_events(::pg_result* result, Clock::time_point lease_until, std::vector<Event>* events);

    // commit_round's steps: what it sends, reads and decides.
    enum class RoundStep { Ack, Nack, Release, Commit, Begin, Setting, Claim };
    struct RoundFailure {
        ::pg_result* result = nullptr;  // the first statement that failed
        const char* what = nullptr;
    };
    void send_settlement(const Settlement& settlement, std::vector<RoundStep>* steps);
    Clock::time_point send_next_claim(const ClaimArgs& args, std::vector<RoundStep>* steps);
    bool read_round(const std::vector<RoundStep>& steps, SettleResult* result,
                    Clock::time_point lease_until, std::vector<Event>* events,
                    RoundFailure* failed);
    DbStatus end_round(const RoundFailure& failed, bool claimed, std::vector<Event>* events,
                       std::string* error);
    DbStatus rollback_now(std::string* error);
    bool exec_setup(const char* sql, std::string* error, DbStatus* status);
    void collect_notifications();
    void read_retry_settings();

    const Options& options_;
    std::string topics_literal_;  // text[] literal, empty for every topic
    std::string lease_text_;      // interval text
    pg_conn* conn_ = nullptr;
    bool notified_ = false;
    bool can_release_ = false;
    bool pooled_ = false;  // through a pooler: nothing kept in the session
    // "name = value" of each setting a claim's transaction needs; through a
    // pooler each is SET LOCAL after the BEGIN, else SET once per session.
    std::vector<std::string> settings_;
    bool settings_read_ = false;
    bool send_failed_ = false;  // a statement of the pipeline could not be queued
    RetrySettings retry_settings_;
    std::string last_sqlstate_;
    std::uint64_t notifications_ = 0;
};

}  // namespace idem::relay
