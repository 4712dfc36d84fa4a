module github.com/idempotency/idempotency/clients/go

go 1.19

// Only the tests and the test worker use lib/pq; the package itself needs
// nothing but database/sql, so any driver works.
require github.com/lib/pq v1.10.7
