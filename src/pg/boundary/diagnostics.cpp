// Small SQL helpers: the boundary self-test and settings the views read.
#include <cstring>
#include <new>
#include <stdexcept>

#include "core/error.hpp"
#include "core/validate.hpp"
#include "pg/boundary/guard.hpp"
#include "pg/boundary/settings.hpp"

namespace idem::pg {

namespace {

// Armed by boundary_selftest('commit'): the next commit's pre-commit
// callback throws, to prove that callbacks are guarded like entry points.
bool throw_before_commit = false;

void selftest_callback(XactEvent event, void*) {
    if (event == XACT_EVENT_ABORT) throw_before_commit = false;
    if (event != XACT_EVENT_PRE_COMMIT || !throw_before_commit) return;
    throw_before_commit = false;
    throw std::runtime_error("self-test: C++ exception in a pre-commit callback");
}

// Throws a C++ exception of the requested kind from inside the module, so
// tests can watch the boundary turn it into a SQL error.
Datum selftest_body(FunctionCallInfo fcinfo) {
    if (PG_ARGISNULL(0)) throw_null_argument("kind");
    // Only trivially destructible locals: the "postgres" case longjmps from here.
    const char* kind = text_to_cstring(PG_GETARG_TEXT_PP(0));
    if (strcmp(kind, "error") == 0) throw Error(sqlstate::wrong_state, "self-test: idem::Error with IK003");
    if (strcmp(kind, "runtime") == 0) throw std::runtime_error("self-test: std::runtime_error");
    if (strcmp(kind, "bad_alloc") == 0) throw std::bad_alloc();
    if (strcmp(kind, "other") == 0) throw 42;
    if (strcmp(kind, "commit") == 0) throw_before_commit = true;
    if (strcmp(kind, "postgres") == 0) {
        // A PostgreSQL error raised below C++ frames that hold no destructors.
        ereport(ERROR, (errcode(ERRCODE_DIVISION_BY_ZERO), errmsg("self-test: PostgreSQL error")));
    }
    PG_RETURN_VOID();
}

Datum stuck_after_body(FunctionCallInfo) {
    Interval* interval = static_cast<Interval*>(palloc0(sizeof(Interval)));
    interval->time = settings::ms(settings::stuck_after_ms);
    PG_RETURN_INTERVAL_P(interval);
}

}  // namespace

void install_selftest_callbacks() { register_guarded_callback(selftest_callback); }

}  // namespace idem::pg

IDEM_SQL_FUNCTION_AS_CALLER(idem_boundary_selftest, idem::pg::selftest_body)
IDEM_SQL_FUNCTION_AS_CALLER(idem_stuck_after, idem::pg::stuck_after_body)
