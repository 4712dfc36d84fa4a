package idempotency_test

// StartMaintenance: idem_maintenance() on an interval, the SQL edition's
// stand-in for the C++ extension's background workers. Against the SQL
// edition (IDEM_EDITION=sql) nothing else expires a lease that nobody
// claims again, or settles a finished key: these passes alone do. The
// superuser calls it (the application role may not).

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	idem "github.com/idempotency/idempotency/clients/go"
)

var sqlEdition = os.Getenv("IDEM_EDITION") == "sql"

// passLog keeps what the passes and failures reported, for the test's goroutine.
type passLog struct {
	mu     sync.Mutex
	passes []map[string]int64
	errors []error
}

func (l *passLog) options(interval time.Duration) idem.MaintenanceOptions {
	return idem.MaintenanceOptions{
		Interval: interval,
		OnPass:   func(tasks map[string]int64) { l.mu.Lock(); l.passes = append(l.passes, tasks); l.mu.Unlock() },
		OnError:  func(err error) { l.mu.Lock(); l.errors = append(l.errors, err); l.mu.Unlock() },
	}
}

func (l *passLog) counts() (passes, errors int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.passes), len(l.errors)
}

func (l *passLog) total(task string) (sum int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, pass := range l.passes {
		sum += pass[task]
	}
	return sum
}

func liveKey(t *testing.T, admin *sql.DB, key string) (status string, live bool) {
	t.Helper()
	err := admin.QueryRow(`SELECT status::text, active_since IS NOT NULL FROM idempotency.idempotency_keys
	                        WHERE scope = 'default' AND key = $1`, key).Scan(&status, &live)
	if err != nil {
		t.Fatal(err)
	}
	return status, live
}

// noRightsRole has the application's rights and not idem_maintenance's.
func noRightsRole(t *testing.T, admin *sql.DB) string {
	role := fmt.Sprintf("maint_go_%d", time.Now().UnixNano())
	mustExec(t, admin, `CREATE ROLE `+role+` LOGIN`)
	mustExec(t, admin, `SELECT idempotency.grant_application($1)`, role)
	t.Cleanup(func() {
		admin.Exec(`SELECT idempotency.revoke_role($1)`, role)
		admin.Exec(`REVOKE ALL ON FUNCTION idempotency.idem_maintenance() FROM ` + role)
		admin.Exec(`DROP ROLE ` + role)
	})
	return role
}

func TestMaintenanceExpiresALeaseNobodyClaimsAgainAndStopEndsIt(t *testing.T) {
	db, admin := openDB(t), adminDB(t)
	key := newKey(t)
	mustExec(t, db, `SELECT idempotency.idem_claim($1, lease => interval '200 milliseconds')`, key)
	var log passLog
	stop, err := idem.StartMaintenance(testContext(t, time.Minute), admin, log.options(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the expired lease", func() bool {
		status, _ := liveKey(t, admin, key)
		return status == "FAILED_RETRYABLE"
	})
	// With the C++ extension its worker may expire the lease before the
	// first pass has ended: the pass is waited for, not assumed.
	eventually(t, 20*time.Second, "a pass", func() bool {
		log.mu.Lock()
		defer log.mu.Unlock()
		return len(log.passes) > 0
	})
	stop()
	if _, attempt := keyStatus(t, db, key, "default"); attempt != 1 {
		t.Fatalf("attempts %d, want 1", attempt)
	}
	log.mu.Lock()
	first := log.passes[0]
	log.mu.Unlock()
	for _, task := range []string{"expire_leases", "settle_leases", "purge_keys"} {
		if _, ok := first[task]; !ok {
			t.Fatalf("no task %s in a pass: %v", task, first)
		}
	}
	if sqlEdition && log.total("expire_leases") < 1 {
		t.Fatal("no pass expired the lease")
	}
	done, _ := log.counts()
	time.Sleep(350 * time.Millisecond) // several intervals: none may pass now
	if now, _ := log.counts(); now != done {
		t.Fatalf("%d passes after stop()", now-done)
	}
}

func TestMaintenanceSettlesAFinishedKeyUntilItsContextEnds(t *testing.T) {
	db, admin := openDB(t), adminDB(t)
	key := newKey(t)
	var token int64
	if err := db.QueryRow(`SELECT token FROM idempotency.idem_claim($1)`, key).Scan(&token); err != nil {
		t.Fatal(err)
	}
	mustExec(t, db, `SELECT idempotency.idem_complete($1, $2, '{"ok": true}')`, key, token)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var log passLog
	stop, err := idem.StartMaintenance(ctx, admin, log.options(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	// The SQL edition's settling pass is awaited as reported too: the row
	// is seen settled once the pass commits, a moment before its report.
	eventually(t, 20*time.Second, "the finished key settled", func() bool {
		_, live := liveKey(t, admin, key)
		return !live && (!sqlEdition || log.total("settle_leases") >= 1)
	})
	cancel()
	stop() // returns once the goroutine has seen ctx end
	if status, _ := liveKey(t, admin, key); status != "COMPLETED" {
		t.Fatalf("status %s", status)
	}
	if _, errs := log.counts(); errs != 0 {
		t.Fatalf("a pass cut short by ctx was reported as a failure: %v", log.errors)
	}
}

func TestMaintenanceReportsAFailedPassAndMakesTheNextOne(t *testing.T) {
	admin := adminDB(t)
	role := noRightsRole(t, admin)
	db := open(t, "user="+role)
	var log passLog
	stop, err := idem.StartMaintenance(testContext(t, time.Minute), db, log.options(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	eventually(t, 20*time.Second, "two failed passes", func() bool { _, errs := log.counts(); return errs >= 2 })
	log.mu.Lock()
	first, passed := log.errors[0], len(log.passes)
	log.mu.Unlock()
	if idem.SQLState(first) != "42501" || !strings.Contains(first.Error(), "idem_maintenance") {
		t.Fatalf("want permission denied for idem_maintenance, got %v", first)
	}
	if passed != 0 {
		t.Fatalf("%d passes without the right", passed)
	}
	mustExec(t, admin, `GRANT EXECUTE ON FUNCTION idempotency.idem_maintenance() TO `+role)
	eventually(t, 20*time.Second, "a pass once the role may call it", func() bool { n, _ := log.counts(); return n >= 1 })
}

func TestStartMaintenanceRefusesANegativeIntervalAndNoDatabase(t *testing.T) {
	db := openDB(t)
	for _, interval := range []time.Duration{-1, -time.Second} {
		if stop, err := idem.StartMaintenance(context.Background(), db, idem.MaintenanceOptions{Interval: interval}); err == nil {
			stop()
			t.Fatalf("interval %v accepted", interval)
		} else if !strings.Contains(err.Error(), "must be positive") {
			t.Fatalf("interval %v: %v", interval, err)
		}
	}
	if _, err := idem.StartMaintenance(context.Background(), nil, idem.MaintenanceOptions{}); err == nil {
		t.Fatal("a nil *sql.DB accepted")
	}
}
