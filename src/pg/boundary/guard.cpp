#include "pg/boundary/guard.hpp"

#include <cstring>
#include <new>
#include <type_traits>

#include "core/error.hpp"
#include "pg/boundary/owner_scope.hpp"

namespace idem::pg {

namespace {

// Trivially destructible, so it may live across ereport.
struct CaughtError {
    char sqlstate[6];
    char message[1024];

    void set(const char* code, const char* text) {
        std::memcpy(sqlstate, code, 5);
        sqlstate[5] = '\0';
        strlcpy(message, text, sizeof message);
    }
};
static_assert(std::is_trivially_destructible_v<CaughtError>);

// Runs `run`; on a C++ exception fills `caught` and returns true. A
// PostgreSQL error raised inside `run` passes through untouched: nothing here
// has a destructor.
template <typename Run>
bool caught_exception(Run run, CaughtError* caught) {
    try {
        run();
        return false;
    } catch (const Error& error) {
        caught->set(error.sqlstate(), error.what());
    } catch (const std::bad_alloc&) {
        caught->set("53200", "out of memory in the idempotency module");
    } catch (const std::exception& error) {
        caught->set(sqlstate::internal, error.what());
    } catch (...) {
        caught->set(sqlstate::internal, "unknown C++ exception in the idempotency module");
    }
    return true;
}

}  // namespace

Datum guarded(FunctionCallInfo fcinfo, Body body) {
    CaughtError caught;
    Datum result = 0;
    // A body must leave PostgreSQL's error handler as it found it: a
    // PG_TRY left open (by a return or an exception out of it) would make
    // the next ERROR jump into a dead C++ frame.
    sigjmp_buf* const handler = PG_exception_stack;
    const bool failed = caught_exception([&] { result = body(fcinfo); }, &caught);
    if (PG_exception_stack != handler)
        elog(PANIC, "idempotency: a function left PostgreSQL's error handler changed");
    if (failed) {
        const char* s = caught.sqlstate;
        ereport(ERROR, (errcode(MAKE_SQLSTATE(s[0], s[1], s[2], s[3], s[4])),
                        errmsg("%s", caught.message)));
    }
    return result;
}

Datum guarded_as_owner(FunctionCallInfo fcinfo, Body body) {
    const OwnerScope scope = enter_owner_scope(fcinfo);
    const Datum result = guarded(fcinfo, body);
    leave_owner_scope(scope);
    return result;
}

namespace {

void report_from_callback(const CaughtError& caught, bool before_end) {
    const char* s = caught.sqlstate;
    ereport(before_end ? ERROR : WARNING,
            (errcode(MAKE_SQLSTATE(s[0], s[1], s[2], s[3], s[4])), errmsg("%s", caught.message)));
}

void run_guarded_xact(XactEvent event, void* arg) {
    const XactCallback callback = *static_cast<XactCallback*>(arg);
    CaughtError caught;
    if (!caught_exception([&] { callback(event, nullptr); }, &caught)) return;
    report_from_callback(caught, event == XACT_EVENT_PRE_COMMIT ||
                                     event == XACT_EVENT_PARALLEL_PRE_COMMIT ||
                                     event == XACT_EVENT_PRE_PREPARE);
}

void run_guarded_subxact(SubXactEvent event, SubTransactionId mine, SubTransactionId parent,
                         void* arg) {
    const SubXactCallback callback = *static_cast<SubXactCallback*>(arg);
    CaughtError caught;
    if (!caught_exception([&] { callback(event, mine, parent, nullptr); }, &caught)) return;
    report_from_callback(caught, event == SUBXACT_EVENT_PRE_COMMIT_SUB);
}

}  // namespace

void register_guarded_callback(XactCallback callback) {
    auto* kept = static_cast<XactCallback*>(MemoryContextAlloc(TopMemoryContext, sizeof callback));
    *kept = callback;
    RegisterXactCallback(run_guarded_xact, kept);
}

void register_guarded_callback(SubXactCallback callback) {
    auto* kept =
        static_cast<SubXactCallback*>(MemoryContextAlloc(TopMemoryContext, sizeof callback));
    *kept = callback;
    RegisterSubXactCallback(run_guarded_subxact, kept);
}

void guarded_main(const char* who, void (*body)()) {
    CaughtError caught;
    if (caught_exception(body, &caught)) ereport(FATAL, (errmsg("%s: %s", who, caught.message)));
}

}  // namespace idem::pg
