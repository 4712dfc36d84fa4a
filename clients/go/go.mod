module github.com/idempotency/idempotency/clients/go

go 1.19

// Only the tests and the test worker use a driver (lib/pq, and pgx's
// stdlib for the second run of the tests); the package itself needs
// nothing but database/sql, so any driver works. The versions are those
// Debian 12 packages, which vendor.sh vendors for offline builds.
require (
	github.com/jackc/pgx/v4 v4.15.0
	github.com/lib/pq v1.10.7
)

require (
	github.com/jackc/chunkreader/v2 v2.0.1 // indirect
	github.com/jackc/pgconn v1.11.0 // indirect
	github.com/jackc/pgio v1.0.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgproto3/v2 v2.2.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20200714003250-2b9c44734f2b // indirect
	github.com/jackc/pgtype v1.10.0 // indirect
	golang.org/x/crypto v0.4.0 // indirect
	golang.org/x/text v0.7.0 // indirect
)
