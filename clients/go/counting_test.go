package idempotency_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
)

// countingDB opens the test database through the chosen driver, wrapped so
// that the statements calling idem_claim are counted: what a crowd of
// waiting requests costs the database.
func countingDB(t *testing.T) (*sql.DB, *atomic.Int64) {
	t.Helper()
	db, claims, _ := faultyDB(t)
	return db, claims
}

// faultyDB is countingDB whose next `fail` statements calling idem_claim
// fail without reaching the server, as they would while it restarts.
func faultyDB(t *testing.T) (db *sql.DB, claims *atomic.Int64, fail *atomic.Int64) {
	t.Helper()
	probe, err := sql.Open(driverName(), "")
	if err != nil {
		t.Fatal(err)
	}
	base := probe.Driver()
	probe.Close()
	claims, fail = new(atomic.Int64), new(atomic.Int64)
	db = sql.OpenDB(countingConnector{dsn: os.Getenv("IDEM_TEST_DSN"), base: base, claims: claims, fail: fail})
	db.SetMaxOpenConns(40)
	t.Cleanup(func() { db.Close() })
	if err := db.Ping(); err != nil {
		t.Fatal(err)
	}
	return db, claims, fail
}

type countingConnector struct {
	dsn    string
	base   driver.Driver
	claims *atomic.Int64
	fail   *atomic.Int64
}

func (c countingConnector) Connect(context.Context) (driver.Conn, error) {
	conn, err := c.base.Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return countingConn{Conn: conn, claims: c.claims, fail: c.fail}, nil
}

func (c countingConnector) Driver() driver.Driver { return c.base }

// countingConn passes everything on; lib/pq's and pgx's connections both
// have the context methods it forwards to.
type countingConn struct {
	driver.Conn
	claims *atomic.Int64
	fail   *atomic.Int64
}

var errInjected = errors.New("the test failed this statement (the server restarting)")

func (c countingConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if strings.Contains(query, "idem_claim(") {
		c.claims.Add(1)
		for n := c.fail.Load(); n > 0; n = c.fail.Load() {
			if c.fail.CompareAndSwap(n, n-1) {
				return nil, errInjected
			}
		}
	}
	return c.Conn.(driver.QueryerContext).QueryContext(ctx, query, args)
}

func (c countingConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	return c.Conn.(driver.ExecerContext).ExecContext(ctx, query, args)
}

func (c countingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	return c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
}

func (c countingConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	return c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
}
