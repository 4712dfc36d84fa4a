package idempotency

// The SQL edition (docs/managed-postgres.md) has no background workers:
// idempotency.idem_maintenance() does one pass of their sweeps (lease
// expiry, settling, purges). Where pg_cron is not available, a process
// that runs anyway calls it on an interval with StartMaintenance. The
// role needs EXECUTE on idem_maintenance (grant_admin, or a GRANT of that
// one function). Against the C++ extension a pass finds what its workers
// left.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"sync"
	"time"
)

// MaintenanceOptions: all optional.
type MaintenanceOptions struct {
	Interval time.Duration          // from the end of one pass to the next: 5 s (negative is an error)
	OnPass   func(map[string]int64) // each pass: rows changed by task
	OnError  func(error)            // each failed pass (the next is still made): log.Printf by default
}

// StartMaintenance calls idem_maintenance() at once and then Interval after
// the end of each pass, on a goroutine, until ctx ends or stop is called.
// stop ends it and returns once a running pass is over; ctx ending cancels
// a running pass too. A failure never ends it: OnError hears it and the
// next pass is made.
func StartMaintenance(ctx context.Context, db *sql.DB, opts MaintenanceOptions) (stop func(), err error) {
	if db == nil {
		return nil, errors.New("idempotency: StartMaintenance needs a *sql.DB")
	}
	if opts.Interval < 0 {
		return nil, fmt.Errorf("idempotency: the maintenance interval must be positive, not %v", opts.Interval)
	}
	if opts.Interval == 0 {
		opts.Interval = 5 * time.Second
	}
	if opts.OnError == nil {
		opts.OnError = func(err error) { log.Printf("idempotency: idem_maintenance failed: %v", err) }
	}
	stopping := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		timer := time.NewTimer(0)
		defer timer.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-stopping:
				return
			case <-timer.C:
			}
			maintenancePass(ctx, db, opts)
			timer.Reset(opts.Interval)
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() { close(stopping) })
		<-done
	}, nil
}

func maintenancePass(ctx context.Context, db *sql.DB, opts MaintenanceOptions) {
	tasks, err := maintenanceTasks(ctx, db)
	if err != nil {
		if ctx.Err() == nil { // a pass cut short by ctx is no failure
			opts.OnError(err)
		}
		return
	}
	if opts.OnPass != nil {
		opts.OnPass(tasks)
	}
}

func maintenanceTasks(ctx context.Context, db *sql.DB) (map[string]int64, error) {
	rows, err := db.QueryContext(ctx, sqlMaintenance)
	if err != nil {
		return nil, wrap(err)
	}
	defer rows.Close()
	tasks := map[string]int64{}
	for rows.Next() {
		var task string
		var changed int64
		if err := rows.Scan(&task, &changed); err != nil {
			return nil, err
		}
		tasks[task] = changed
	}
	return tasks, wrap(rows.Err())
}
