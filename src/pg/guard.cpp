#include "pg/guard.hpp"

#include <cstring>
#include <new>

#include "core/error.hpp"

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

}  // namespace

Datum guarded(FunctionCallInfo fcinfo, Body body) {
    CaughtError caught;
    bool failed = false;
    Datum result = 0;
    try {
        result = body(fcinfo);
    } catch (const Error& error) {
        caught.set(error.sqlstate(), error.what());
        failed = true;
    } catch (const std::bad_alloc&) {
        caught.set("53200", "out of memory in the idempotency module");
        failed = true;
    } catch (const std::exception& error) {
        caught.set(sqlstate::internal, error.what());
        failed = true;
    } catch (...) {
        caught.set(sqlstate::internal, "unknown C++ exception in the idempotency module");
        failed = true;
    }
    if (failed) {
        const char* s = caught.sqlstate;
        ereport(ERROR, (errcode(MAKE_SQLSTATE(s[0], s[1], s[2], s[3], s[4])),
                        errmsg("%s", caught.message)));
    }
    return result;
}

}  // namespace idem::pg
