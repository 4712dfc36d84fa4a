#!/usr/bin/env bash
# pg_regress's --launcher for the SQL edition's run: psql as pg_regress
# starts it, without the CONTEXT lines of errors. The edition raises its
# errors from PL/pgSQL, which names the function and line in the error's
# context field; SQLSTATE, message, detail and hint are the C++ edition's.
psql=$1
shift
exec "$psql" -v SHOW_CONTEXT=never "$@"
