package idempotency

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"
)

// Complete and Fail outlive a brief loss of the database (a restart, a
// dropped connection) and a wait for a busy pool: a record lost that way
// would leave the key held until its lease ends, and its work would run
// again. They try again for up to recordPatience, or until the claim's
// lease ends when that is later: until then the key is the claim's to
// record, and a record given up leaves it to run again. A try whose answer
// was lost may have committed: the next one then finds the key no longer
// PROCESSING (IK003), and the key itself says whether this claim's record
// is the one it holds.

var recordPatience = 10 * time.Second

// startRecording: from now on a beat that finds the key taken or finished
// stops without a word; the record says what happened.
func (c *Claimed) startRecording() {
	c.mu.Lock()
	c.recording = true
	c.mu.Unlock()
}

// patience: how long a record of this claim keeps trying.
func (c *Claimed) patience() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if left := time.Until(c.leaseEnds); left > recordPatience {
		return left
	}
	return recordPatience
}

// recordingContext: the end of the work is recorded even when ctx is
// cancelled before or while it is (a stopping worker, a client that went
// away), within the record's patience: a record cut short would leave the
// key held, and its work run again once the lease ends. The values of ctx
// are kept.
func (c *Claimed) recordingContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(withoutCancel{ctx}, c.patience())
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
// most patience or until ctx ends, 100 ms apart, twice as long each time up
// to 1 s. lost: a try before the last lost its connection.
func retryLost(ctx context.Context, patience time.Duration, try func(context.Context) error) (lost bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, patience)
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
