// The relay a user writes by hand, the baseline of the idem-relay
// benchmark: one transaction per batch takes the oldest ready events of
// bench.outbox with FOR UPDATE SKIP LOCKED, writes them to stdout as JSON
// lines, flushes, marks them published (delivered) and commits; it stops
// when a batch comes back empty. Prepared statements, one connection; no
// per-key order, leases, retries or payload escaping (the payload is
// already JSON): everything idem-relay does on top costs it, not this.
// With "ordered", the loop keeps per-key order as a user would write it:
// an event is taken only when no earlier event of its key is undelivered
// (a probe of the key-order index per candidate).
//
//   hand_loop CONNINFO BATCH [ordered]   prints "N" (events published) on stderr
#include <libpq-fe.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

const char* const kTake =
    "SELECT id, topic, key, payload, headers, dedup_key FROM bench.outbox"
    " WHERE ready_at IS NOT NULL AND ready_at <= clock_timestamp()"
    " ORDER BY ready_at, id LIMIT $1 FOR UPDATE SKIP LOCKED";

const char* const kTakeOrdered =
    "SELECT id, topic, key, payload, headers, dedup_key FROM bench.outbox o"
    " WHERE ready_at IS NOT NULL AND ready_at <= clock_timestamp()"
    "   AND NOT EXISTS (SELECT FROM bench.outbox p"
    "        WHERE hashtextextended(p.key, hashtextextended(p.topic, 0))"
    "              = hashtextextended(o.key, hashtextextended(o.topic, 0))"
    "          AND COALESCE(p.key_seq, p.id) < COALESCE(o.key_seq, o.id)"
    "          AND p.key = o.key AND p.topic = o.topic AND p.key IS NOT NULL"
    "          AND p.state IN ('pending', 'in_flight'))"
    " ORDER BY ready_at, id LIMIT $1 FOR UPDATE SKIP LOCKED";
const char* const kMark =
    "UPDATE bench.outbox SET state = 'delivered', delivered_at = clock_timestamp(),"
    " updated_at = clock_timestamp(), lease_until = NULL, ready_at = NULL"
    " WHERE id = ANY ($1::bigint[])";

[[noreturn]] void die(PGconn* conn, const char* what) {
    std::fprintf(stderr, "hand_loop: %s: %s", what, PQerrorMessage(conn));
    std::exit(1);
}

void run(PGconn* conn, const char* sql) {
    PGresult* result = PQexec(conn, sql);
    if (PQresultStatus(result) != PGRES_COMMAND_OK) die(conn, sql);
    PQclear(result);
}

}  // namespace

int main(int argc, char** argv) {
    const bool ordered = argc == 4 && std::string(argv[3]) == "ordered";
    if (argc != 3 && !ordered) {
        std::fprintf(stderr, "usage: hand_loop CONNINFO BATCH [ordered]\n");
        return 2;
    }
    PGconn* conn = PQconnectdb(argv[1]);
    if (PQstatus(conn) != CONNECTION_OK) die(conn, "connect");
    PGresult* prepared = PQprepare(conn, "take", ordered ? kTakeOrdered : kTake, 0, nullptr);
    if (PQresultStatus(prepared) != PGRES_COMMAND_OK) die(conn, "prepare take");
    PQclear(prepared);
    prepared = PQprepare(conn, "mark", kMark, 0, nullptr);
    if (PQresultStatus(prepared) != PGRES_COMMAND_OK) die(conn, "prepare mark");
    PQclear(prepared);

    long long published = 0;
    std::string ids;
    for (;;) {
        run(conn, "BEGIN");
        const char* take_params[1] = {argv[2]};
        PGresult* rows = PQexecPrepared(conn, "take", 1, take_params, nullptr, nullptr, 0);
        if (PQresultStatus(rows) != PGRES_TUPLES_OK) die(conn, "take");
        const int n = PQntuples(rows);
        if (n == 0) {
            PQclear(rows);
            run(conn, "COMMIT");
            break;
        }
        ids = "{";
        for (int i = 0; i < n; ++i) {
            std::printf("{\"id\":%s,\"topic\":\"%s\",\"key\":%s%s%s,\"headers\":%s,\"payload\":%s}\n",
                        PQgetvalue(rows, i, 0), PQgetvalue(rows, i, 1),
                        PQgetisnull(rows, i, 2) ? "" : "\"",
                        PQgetisnull(rows, i, 2) ? "null" : PQgetvalue(rows, i, 2),
                        PQgetisnull(rows, i, 2) ? "" : "\"",
                        PQgetisnull(rows, i, 4) ? "null" : PQgetvalue(rows, i, 4),
                        PQgetvalue(rows, i, 3));
            if (i > 0) ids += ',';
            ids += PQgetvalue(rows, i, 0);
        }
        ids += '}';
        PQclear(rows);
        // Published once the lines are out; only then marked.
        if (std::fflush(stdout) != 0) die(conn, "stdout");
        const char* mark_params[1] = {ids.c_str()};
        PGresult* marked = PQexecPrepared(conn, "mark", 1, mark_params, nullptr, nullptr, 0);
        if (PQresultStatus(marked) != PGRES_COMMAND_OK) die(conn, "mark");
        PQclear(marked);
        run(conn, "COMMIT");
        published += n;
    }
    PQfinish(conn);
    std::fprintf(stderr, "%lld\n", published);
    return 0;
}
