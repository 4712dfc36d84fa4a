package idempotency

import (
	"context"
	"errors"
	"time"
)

// KeepAlive starts a goroutine that renews the lease (idem_heartbeat) every
// third of it while the work runs. It returns a context for the work, which
// is cancelled when the lease is lost (the token is stale, IK001, or the key
// is no longer PROCESSING, IK003; LeaseLost says which) or ctx ends, and a
// stop function that ends the heartbeat and waits for it. The heartbeat
// also stops with ctx. Other errors (a dropped connection) are transient:
// the next beat tries again. It runs through ClaimOptions.Heartbeats when
// the claim was given one.
func (c *Claimed) KeepAlive(ctx context.Context) (context.Context, func()) {
	return c.keepAlive(ctx, nil)
}

// keepAlive is KeepAlive; failed, when given, hears each beat that failed
// for another reason than a lost lease.
func (c *Claimed) keepAlive(ctx context.Context, failed func(error)) (context.Context, func()) {
	work, cancel := context.WithCancel(ctx)
	db := c.beats
	if db == nil {
		db = c.db
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		ticker := time.NewTicker(beatInterval(c.Lease))
		defer ticker.Stop()
		for {
			select {
			case <-work.Done():
				return
			case <-ticker.C:
			}
			started := time.Now()
			_, err := db.ExecContext(work, sqlHeartbeat, c.Key, c.Token, c.Lease.Seconds(), c.Scope)
			if err == nil {
				c.mu.Lock()
				c.leaseEnds = started.Add(c.Lease)
				c.mu.Unlock()
			}
			if err = wrap(err); errors.Is(err, ErrFenced) || errors.Is(err, ErrWrongState) {
				c.mu.Lock()
				if !c.recording { // else the record says what happened
					c.lost = err
				}
				c.mu.Unlock()
				cancel()
				return
			}
			if err != nil && failed != nil && work.Err() == nil { // not the stop itself
				failed(err)
			}
		}
	}()
	return work, func() {
		cancel()
		<-done
	}
}

// beatInterval: a third of the lease, and never less than 10 ms, so that
// an absurdly short lease (a Resume given 1 ns) neither stops the process
// (a ticker refuses an interval of 0) nor floods the database.
func beatInterval(lease time.Duration) time.Duration {
	if interval := lease / 3; interval > 10*time.Millisecond {
		return interval
	}
	return 10 * time.Millisecond
}
