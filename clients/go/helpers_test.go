package idempotency_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v4/stdlib"
	_ "github.com/lib/pq"
)

// The tests run against a real cluster: the connection comes from the
// standard PG* environment (test/clients/go.sh sets it), or IDEM_TEST_DSN.
// IDEM_TEST_DRIVER names the database/sql driver: "postgres" (lib/pq, the
// default) or "pgx" (pgx v4's stdlib); test/clients/go.sh runs both.
func driverName() string {
	if name := os.Getenv("IDEM_TEST_DRIVER"); name != "" {
		return name
	}
	return "postgres"
}

var keySeq atomic.Int64

// newKey is a key no other test or run uses.
func newKey(t *testing.T) string {
	return fmt.Sprintf("%s-%d-%d", t.Name(), time.Now().UnixNano(), keySeq.Add(1))
}

func openDB(t *testing.T) *sql.DB {
	t.Helper()
	return open(t, os.Getenv("IDEM_TEST_DSN"))
}

// adminDB connects as the superuser, to read the extension's tables.
func adminDB(t *testing.T) *sql.DB {
	t.Helper()
	dsn := os.Getenv("IDEM_TEST_ADMIN_DSN")
	if dsn == "" {
		dsn = "user=postgres"
	}
	return open(t, dsn)
}

func open(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open(driverName(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(40)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		t.Fatalf("no database (set the PG* environment): %v", err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func testContext(t *testing.T, limit time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond every 20 ms until it holds or the deadline passes.
func eventually(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", limit, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func keyStatus(t *testing.T, db *sql.DB, key, scope string) (status string, attempt int) {
	t.Helper()
	err := db.QueryRow(`SELECT status::text, attempts FROM idempotency.idem_get($1, $2)`, key, scope).Scan(&status, &attempt)
	if err != nil {
		t.Fatal(err)
	}
	return status, attempt
}

func mustExec(t *testing.T, db *sql.DB, query string, args ...any) {
	t.Helper()
	if _, err := db.Exec(query, args...); err != nil {
		t.Fatal(err)
	}
}

// expireResult leaves of a finished key what the purge leaves once its
// result's retention has passed: its tombstone, made as the purge makes it
// (docs/keys.md, the digest and the fingerprint's prefix in SQL), for this
// key alone so that no other test's keys are touched.
func expireResult(t *testing.T, admin *sql.DB, key, scope string) {
	t.Helper()
	res, err := admin.Exec(`
		WITH gone AS (DELETE FROM idempotency.idempotency_keys WHERE scope = $1 AND key = $2
		              RETURNING scope, key, status, fingerprint)
		INSERT INTO idempotency.key_tombstones (key_digest, forget_at, fingerprint, status)
		SELECT encode(substr(sha256(convert_to(scope, 'UTF8') || '\x00'::bytea || convert_to(key, 'UTF8')), 1, 16), 'hex')::uuid,
		       now() + interval '1 day', ('x' || encode(substr(fingerprint, 1, 4), 'hex'))::bit(32)::int4, status
		  FROM gone`, scope, key)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		t.Fatalf("no finished key %s/%s to expire", scope, key)
	}
}
