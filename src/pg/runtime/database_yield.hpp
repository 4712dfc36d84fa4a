// How the background workers connected to a database get out of the way of
// the commands that need them gone (DROP DATABASE, ALTER DATABASE RENAME or
// SET TABLESPACE, CREATE DATABASE with it as template).
#pragma once

#include "pg/boundary/postgres.hpp"

namespace idem::pg {

// Such a command locks the database object, then waits at most five seconds
// for the other backends to leave. This takes, without waiting, the lock a
// new connection takes; true when it cannot (the worker should leave). Call
// inside a transaction: the lock is held until its end.
bool database_wanted_elsewhere(Oid database);

}  // namespace idem::pg
