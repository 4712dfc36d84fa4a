#include "relay/db/maintenance_caller.hpp"

#include <chrono>
#include <cstdlib>
#include <string>

#include <libpq-fe.h>

#include "relay/db/pg_text.hpp"
#include "relay/db/statements.hpp"
#include "relay/observe/log.hpp"

namespace idem::relay {

namespace {

// How long a stop waits for a running pass before cancelling it: within
// the relay's promise of a stop in --http-timeout plus 5 s.
constexpr std::chrono::seconds kStopGrace{4};

}  // namespace

MaintenanceCaller::MaintenanceCaller(const Options& options) : options_(options) {}

MaintenanceCaller::~MaintenanceCaller() { stop(); }

void MaintenanceCaller::start() {
    if (options_.maintenance_interval.count() <= 0 || thread_.joinable()) return;
    thread_ = std::thread([this] { run(); });
}

void MaintenanceCaller::stop() {
    if (!thread_.joinable()) return;
    {
        std::unique_lock<std::mutex> lock(mutex_);
        stopping_ = true;
        changed_.notify_all();
        if (!changed_.wait_for(lock, kStopGrace, [this] { return finished_; })) {
            cut_short_ = true;
            char reason[256];
            if (cancel_ != nullptr) PQcancel(cancel_, reason, sizeof reason);
        }
    }
    thread_.join();
}

void MaintenanceCaller::run() {
    for (;;) {
        call_once();
        std::unique_lock<std::mutex> lock(mutex_);
        if (changed_.wait_for(lock, options_.maintenance_interval, [this] { return stopping_; }))
            break;
    }
    disconnect();
    std::lock_guard<std::mutex> lock(mutex_);
    finished_ = true;
    changed_.notify_all();
}

bool MaintenanceCaller::connect() {
    const char* keywords[] = {"connect_timeout", "fallback_application_name", "keepalives",
                              "keepalives_idle", "dbname", nullptr};
    const char* values[] = {"10", "idem-relay maintenance", "1", "30", options_.dsn.c_str(),
                            nullptr};
    conn_ = PQconnectdbParams(keywords, values, 1);
    if (conn_ == nullptr || PQstatus(conn_) != CONNECTION_OK) {
        log_warning("idem_maintenance: cannot connect to the database: %s",
                    conn_ != nullptr ? one_line(PQerrorMessage(conn_)).c_str() : "out of memory");
        disconnect();
        return false;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    cancel_ = PQgetCancel(conn_);
    return true;
}

void MaintenanceCaller::disconnect() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (cancel_ != nullptr) PQfreeCancel(cancel_);
        cancel_ = nullptr;
    }
    if (conn_ != nullptr) PQfinish(conn_);
    conn_ = nullptr;
}

void MaintenanceCaller::call_once() {
    if (conn_ == nullptr && !connect()) return;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (cut_short_) return;
    }
    PGresult* result = PQexec(conn_, kMaintenanceSql);
    if (PQresultStatus(result) != PGRES_TUPLES_OK) {
        const char* primary =
            result != nullptr ? PQresultErrorField(result, PG_DIAG_MESSAGE_PRIMARY) : nullptr;
        const char* sqlstate =
            result != nullptr ? PQresultErrorField(result, PG_DIAG_SQLSTATE) : nullptr;
        log_warning("idem_maintenance failed: %s%s%s%s",
                    one_line(primary != nullptr ? primary : PQerrorMessage(conn_)).c_str(),
                    sqlstate != nullptr ? " (SQLSTATE " : "", sqlstate != nullptr ? sqlstate : "",
                    sqlstate != nullptr ? ")" : "");
        PQclear(result);
        if (PQstatus(conn_) != CONNECTION_OK) disconnect();
        return;
    }
    // Only a pass that changed something is worth a line.
    std::string changed;
    for (int row = 0; row < PQntuples(result); ++row) {
        const char* rows = PQgetvalue(result, row, 1);
        if (strtoll(rows, nullptr, 10) == 0) continue;
        changed += (changed.empty() ? "" : ", ") + std::string(PQgetvalue(result, row, 0)) + " " + rows;
    }
    PQclear(result);
    if (!changed.empty()) log_info("idem_maintenance: %s", changed.c_str());
}

}  // namespace idem::relay
