// The C++ -> PostgreSQL boundary. Every function PostgreSQL calls runs its
// C++ body through guarded(): any exception is caught, its message copied
// into a plain buffer, the try scope left (so every destructor has run),
// and only then is ereport(ERROR) raised with the exception's SQLSTATE.
//
// The reverse direction is kept safe by convention: code that calls anything
// that can ereport (SPI, palloc, detoasting) holds only trivially
// destructible locals, so a PostgreSQL error may longjmp over it.
#pragma once

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

using Body = Datum (*)(FunctionCallInfo fcinfo);

Datum guarded(FunctionCallInfo fcinfo, Body body);

// guarded() run as the function's owner with the search path pinned
// (pg/boundary/owner_scope.hpp): every function that works on the tables.
Datum guarded_as_owner(FunctionCallInfo fcinfo, Body body);

// The same for an entry point that returns nothing (a background worker's
// main): a C++ exception ends the process with FATAL, naming `who`.
void guarded_main(const char* who, void (*body)());

// Registers a transaction or subtransaction callback guarded like an entry
// point: a C++ exception never leaves it. Before the (sub)transaction ends
// it becomes an ERROR, which aborts it; after the end, where an error would
// be a PANIC, a WARNING.
void register_guarded_callback(XactCallback callback);
void register_guarded_callback(SubXactCallback callback);

// The callback behind boundary_selftest('commit'); from _PG_init.
void install_selftest_callbacks();

}  // namespace idem::pg

// Defines the C-linkage SQL entry point `name` as a shim over `body`, run
// as the function's owner with the search path pinned.
#define IDEM_SQL_FUNCTION(name, body)                                   \
    extern "C" {                                                         \
    PG_FUNCTION_INFO_V1(name);                                           \
    }                                                                    \
    extern "C" Datum name(PG_FUNCTION_ARGS) {                            \
        return ::idem::pg::guarded_as_owner(fcinfo, body);               \
    }

// The same, run as the caller: for functions that touch no table.
#define IDEM_SQL_FUNCTION_AS_CALLER(name, body)                         \
    extern "C" {                                                         \
    PG_FUNCTION_INFO_V1(name);                                           \
    }                                                                    \
    extern "C" Datum name(PG_FUNCTION_ARGS) {                            \
        return ::idem::pg::guarded(fcinfo, body);                        \
    }
