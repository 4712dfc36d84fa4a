package idempotency

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"sync"
	"time"
)

// Complete and Fail outlive a brief loss of the database (a restart, a
// dropped connection) and a wait for a busy pool: a record lost that way
// would leave the key held until its lease ends, and its work would run
// again. They try again for up to recordPatience, or until the claim's
// lease ends when that is later, as the heartbeat moves it on: until then
// the key is the claim's to record, and a record given up leaves it to run
// again. A try whose answer was lost may have committed: the next one then
// finds the key no longer PROCESSING (IK003), and the key itself says
// whether this claim's record is the one it holds.

var recordPatience = 10 * time.Second

// recordMostPatience bounds how long the heartbeat keeps a record trying
// (unless the lease the claim set at the record's start ends later): a
// try that keeps failing as a lost connection while the beats still get
// through must not hold the caller for ever.
const recordMostPatience = time.Minute

// startRecording: from now on a beat that finds the key taken or finished
// stops without a word; the record says what happened.
func (c *Claimed) startRecording() {
	c.mu.Lock()
	c.recording = true
	c.mu.Unlock()
}

// withPatience: ctx, also ended (DeadlineExceeded) once the record's
// patience has: recordPatience from now, or the end of the claim's lease
// when that is later. The end is read again when it comes: a heartbeat
// still running moves the lease on, and a record waiting for a busy pool
// while the lease lasts is not given up (the key is still the claim's),
// for up to recordMostPatience or the lease it started with.
func (c *Claimed) withPatience(ctx context.Context) (context.Context, context.CancelFunc) {
	start := time.Now()
	least := start.Add(recordPatience)
	most := start.Add(recordMostPatience)
	if atStart := c.leaseEnd(); atStart.After(most) {
		most = atStart
	}
	patient := &patientContext{Context: ctx, done: make(chan struct{})}
	stop := make(chan struct{})
	go func() {
		for {
			end := c.leaseEnd()
			if end.After(most) {
				end = most
			}
			if end.Before(least) {
				end = least
			}
			wait := time.Until(end)
			if wait <= 0 {
				patient.end(context.DeadlineExceeded)
				return
			}
			timer := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				timer.Stop()
				patient.end(ctx.Err())
				return
			case <-stop:
				timer.Stop()
				patient.end(context.Canceled)
				return
			case <-timer.C:
			}
		}
	}()
	var once sync.Once
	return patient, func() { once.Do(func() { close(stop) }) }
}

// leaseEnd: when the claim's lease ends, as the claim or its last beat set
// it (zero: unknown).
func (c *Claimed) leaseEnd() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leaseEnds
}

// patientContext is withPatience's context: its parent's values, its own end.
type patientContext struct {
	context.Context
	done chan struct{}
	mu   sync.Mutex
	err  error
}

func (p *patientContext) Deadline() (time.Time, bool) { return time.Time{}, false }
func (p *patientContext) Done() <-chan struct{}       { return p.done }

func (p *patientContext) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

func (p *patientContext) end(err error) {
	p.mu.Lock()
	p.err = err
	p.mu.Unlock()
	close(p.done)
}

// recordingContext: the end of the work is recorded even when ctx is
// cancelled before or while it is (a stopping worker, a client that went
// away), within the record's patience: a record cut short would leave the
// key held, and its work run again once the lease ends. The values of ctx
// are kept.
func (c *Claimed) recordingContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return c.withPatience(withoutCancel{ctx})
}

// lostConnection: the statement may not have reached the server, or its
// answer did not come back (no SQLSTATE: the network, a closed connection;
// or a connection failure or a server shutting down).
func lostConnection(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	code := SQLState(err)
	return code == "" || strings.HasPrefix(code, "08") || code == "57P01" || code == "57P02" || code == "57P03"
}

// retryLost runs try until it does not fail with a lost connection, for at
// most the claim's record patience (withPatience) or until ctx ends, 100 ms
// apart, twice as long each time up to 1 s. lost: a try before the last
// lost its connection.
func (c *Claimed) retryLost(ctx context.Context, try func(context.Context) error) (lost bool, err error) {
	ctx, cancel := c.withPatience(ctx)
	defer cancel()
	pause := 100 * time.Millisecond
	for {
		if err = try(ctx); !lostConnection(err) {
			return lost, err
		}
		lost = true
		timer := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			timer.Stop()
			return lost, err
		case <-timer.C:
		}
		if pause *= 2; pause > time.Second {
			pause = time.Second
		}
	}
}

// recordedByThisClaim reads the key after a try whose answer was lost:
// whether it is in one of statuses with this claim's token (the lost try
// committed), and its stored result.
func (c *Claimed) recordedByThisClaim(ctx context.Context, statuses ...string) (status string, result sql.NullString, ok bool) {
	var token sql.NullInt64
	err := c.db.QueryRowContext(ctx, sqlKeyRecord, c.Key, c.Scope).Scan(&status, &token, &result)
	if err != nil || !token.Valid || token.Int64 != c.Token {
		return "", result, false
	}
	for _, s := range statuses {
		if s == status {
			return status, result, true
		}
	}
	return "", result, false
}
