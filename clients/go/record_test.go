package idempotency_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	idempotency "github.com/idempotency/idempotency/clients/go"
)

// throughProxy: a pool through a proxy that cuts connections, and a
// claim's options without a heartbeat (whose statements would meet the cuts).
func throughProxy(t *testing.T) (*cutProxy, *sql.DB, context.Context, *idempotency.ClaimOptions) {
	proxy := newCutProxy(t)
	opts := &idempotency.ClaimOptions{Scope: "go.outage", Lease: 20 * time.Second, NoHeartbeat: true}
	return proxy, proxy.db(t), testContext(t, 30*time.Second), opts
}

// The connection is cut as the work ends, and the server refuses new ones
// for a second (a restart): the complete is tried again until it goes
// through, instead of leaving the key held until its lease ends and the
// work to run again.
func TestRunRecordsThroughABriefOutage(t *testing.T) {
	proxy, db, ctx, opts := throughProxy(t)
	key := newKey(t)
	runs := 0
	done, err := idempotency.Run(ctx, db, key, nil, opts, func(context.Context, *idempotency.Claimed) (any, error) {
		runs++
		proxy.cutFor(time.Second)
		return "sent", nil
	})
	if err != nil || string(done.Result) != `"sent"` {
		t.Fatalf("Run through the outage: %#v %v", done, err)
	}
	if status, _ := keyStatus(t, openDB(t), key, "go.outage"); status != "COMPLETED" || runs != 1 {
		t.Fatalf("the key is %s after %d runs", status, runs)
	}

	// The same for a failure (Fail's own transaction).
	failing := newKey(t)
	_, err = idempotency.Run(ctx, db, failing, nil, opts, func(context.Context, *idempotency.Claimed) (any, error) {
		proxy.cutFor(time.Second)
		return nil, idempotency.Final(errors.New("card declined"))
	})
	var failed *idempotency.Failed
	if !errors.As(err, &failed) || failed.Retryable || failed.Message != "card declined" {
		t.Fatalf("Fail through the outage: %v", err)
	}
	if status, _ := keyStatus(t, openDB(t), failing, "go.outage"); status != "FAILED_FINAL" {
		t.Fatalf("the failed key is %s", status)
	}
}

// The complete reaches the server and commits, and its answer is lost:
// the next try finds the key completed with this claim's token, which is
// this record, not another worker's (IK003 without it).
func TestRunRecordWhoseAnswerWasLost(t *testing.T) {
	proxy, db, ctx, opts := throughProxy(t)
	key := newKey(t)
	done, err := idempotency.Run(ctx, db, key, nil, opts, func(context.Context, *idempotency.Claimed) (any, error) {
		proxy.cutAfterNextStatement()
		return map[string]int{"charge": 7}, nil
	})
	if err != nil || string(done.Result) != `{"charge": 7}` {
		t.Fatalf("Run whose complete's answer was lost: %#v %v", done, err)
	}

	failing := newKey(t)
	_, err = idempotency.Run(ctx, db, failing, nil, opts, func(context.Context, *idempotency.Claimed) (any, error) {
		proxy.cutAfterNextStatement() // BEGIN: the failure's transaction is cut before its idem_fail
		return nil, errors.New("provider timeout")
	})
	var failed *idempotency.Failed
	if !errors.As(err, &failed) || !failed.Retryable {
		t.Fatalf("Run whose failure was cut: %v", err)
	}
	if status, attempts := keyStatus(t, openDB(t), failing, "go.outage"); status != "FAILED_RETRYABLE" || attempts != 1 {
		t.Fatalf("the failed key is %s after %d attempts", status, attempts)
	}
}

// A record waits for a busy pool while the lease lasts: one that gave up at
// its least patience (10 s, here 0.5 s) left the key held until its lease
// ended, and the work ran again. With a lease shorter than the wait, the
// heartbeat keeps the lease: a record that gave up once the lease the claim
// set had ended left the key PROCESSING under a lease its heartbeat still
// renewed.
func TestARecordWaitsForABusyPoolWhileTheLeaseLasts(t *testing.T) {
	defer idempotency.SetRecordPatience(500 * time.Millisecond)()
	for _, c := range []struct {
		name  string
		lease time.Duration
		hold  time.Duration
		beats bool
	}{
		{"the lease lasts", 5 * time.Second, 1500 * time.Millisecond, false},
		{"the heartbeat keeps it", time.Second, 3 * time.Second, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			small := openDB(t)
			small.SetMaxOpenConns(1)
			ctx := testContext(t, 30*time.Second)
			key := newKey(t)
			opts := &idempotency.ClaimOptions{Lease: c.lease, NoHeartbeat: !c.beats}
			if c.beats {
				opts.Heartbeats = openDB(t)
			}
			done, err := idempotency.Run(ctx, small, key, nil, opts, func(ctx context.Context, job *idempotency.Claimed) (any, error) {
				// Another request takes the pool's only connection.
				conn, err := small.Conn(ctx)
				if err != nil {
					return nil, err
				}
				time.AfterFunc(c.hold, func() { conn.Close() })
				return "done", nil
			})
			if err != nil || string(done.Result) != `"done"` {
				t.Fatalf("%#v %v", done, err)
			}
			var status string
			if err := small.QueryRowContext(ctx, "SELECT status FROM idempotency.idem_get($1)", key).Scan(&status); err != nil || status != "COMPLETED" {
				t.Fatalf("the key is %s (%v)", status, err)
			}
		})
	}
}

// The heartbeat goes on while the record waits for a busy pool: stopped
// before it, the lease ended, another worker took the key over and the
// work ran again.
func TestTheHeartbeatGoesOnWhileABusyPoolDelaysTheRecord(t *testing.T) {
	small := openDB(t)
	small.SetMaxOpenConns(2)
	other := openDB(t)
	ctx := testContext(t, 30*time.Second)
	key := newKey(t)
	opts := &idempotency.ClaimOptions{Lease: time.Second, Heartbeats: openDB(t)}
	seen := make(chan string, 1)
	done, err := idempotency.Run(ctx, small, key, nil, opts, func(ctx context.Context, job *idempotency.Claimed) (any, error) {
		// Another request holds both pool connections for 2.5 leases, and
		// a worker elsewhere tries the key meanwhile.
		var held []*sql.Conn
		for i := 0; i < 2; i++ {
			conn, err := small.Conn(ctx)
			if err != nil {
				return nil, err
			}
			held = append(held, conn)
		}
		go func() {
			time.Sleep(2 * time.Second)
			r, err := idempotency.Claim(context.Background(), other, key, nil, nil)
			seen <- fmt.Sprintf("%T %v", r, err)
			time.Sleep(500 * time.Millisecond)
			for _, conn := range held {
				conn.Close()
			}
		}()
		return "done", nil
	})
	if err != nil || string(done.Result) != `"done"` {
		t.Fatalf("%#v %v", done, err)
	}
	if got := <-seen; got != "*idempotency.InProgress <nil>" {
		t.Fatalf("the other worker got %s", got)
	}
}
