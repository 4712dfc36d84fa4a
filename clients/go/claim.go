package idempotency

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"
)

// Queryer is what runs the client's statements: *sql.DB, *sql.Conn or
// *sql.Tx.
type Queryer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// ClaimOptions: all optional. The zero value claims in scope "default" with
// a 30 s lease, answers at once and keeps the lease with a heartbeat.
type ClaimOptions struct {
	Scope string        // the kind of operation; "default"
	Lease time.Duration // 30 s
	// Wait: how long to wait for another holder instead of answering
	// *InProgress (or *RetryLater). Duplicates waiting for one key in this
	// process share one poller (25 ms, doubling, at most 250 ms apart; see
	// wait.go): they hold no connection, and cost one short statement a
	// tick between them all.
	Wait time.Duration
	// NoHeartbeat: Run and the middleware do not renew the lease.
	NoHeartbeat bool
	// Heartbeats: the pool the heartbeat renews the lease through (nil:
	// the claim's). Give a pool of its own where the application's has a
	// limit (SetMaxOpenConns) that its handlers can fill: there a beat
	// waits for a connection behind them, and one that waits past the
	// lease lets another worker take the key over while the work runs on.
	Heartbeats *sql.DB
}

const defaultLease = 30 * time.Second

func (o *ClaimOptions) normalized() ClaimOptions {
	var n ClaimOptions
	if o != nil {
		n = *o
	}
	if n.Scope == "" {
		n.Scope = "default"
	}
	if n.Lease <= 0 {
		n.Lease = defaultLease
	}
	return n
}

// Claim claims key for request (any JSON value; the same key with another
// request is a *Mismatch) and returns what the extension answered: a
// *Claimed holding the lease and its fencing token, or *Completed,
// *InProgress, *RetryLater, *Failed or *Mismatch.
func Claim(ctx context.Context, db *sql.DB, key string, request any, opts *ClaimOptions) (Result, error) {
	o := opts.normalized()
	req, err := jsonParam(request)
	if err != nil {
		return nil, err
	}
	t, err := claimWaiting(ctx, db, waitID("claim", key, req, o), o.Wait, func(ctx context.Context) (tryResult, error) {
		return claimTry(ctx, db, key, req, o)
	})
	return t.res, err
}

// claimTry is one idem_claim in a statement of its own; a claim nobody
// takes (see wait.go) is released. The statement is not cut when ctx ends:
// a claim cut in flight may have committed all the same, and would hold
// the key for its lease with an attempt counted, its token lost. The
// caller leaves at once with ctx's error; the statement ends on its own
// (within claimAfterCallerLeft) and a claim it made is released.
func claimTry(ctx context.Context, db *sql.DB, key string, req any, o ClaimOptions) (tryResult, error) {
	if err := ctx.Err(); err != nil { // nothing sent yet: nothing to give back
		return tryResult{}, err
	}
	statement, cut := context.WithCancel(withoutCancel{ctx})
	answer := make(chan waitAnswer, 1)
	go func() {
		defer cut()
		r, err := claimStatement(statement, db, key, req, o)
		answer <- waitAnswer{r, err}
	}()
	select {
	case a := <-answer:
		if ctx.Err() == nil {
			return a.r, a.err
		}
		if a.r.abandon != nil {
			go a.r.abandon()
		}
	case <-ctx.Done():
		limit := time.AfterFunc(claimAfterCallerLeft, cut)
		go func() {
			a := <-answer
			limit.Stop()
			if a.r.abandon != nil {
				a.r.abandon()
			}
		}()
	}
	return tryResult{}, ctx.Err()
}

// claimAfterCallerLeft bounds a claim statement whose caller has left.
const claimAfterCallerLeft = 10 * time.Second

// claimStatement runs idem_claim; a claim it makes comes with its release.
func claimStatement(ctx context.Context, db *sql.DB, key string, req any, o ClaimOptions) (tryResult, error) {
	started := time.Now()
	r, err := claimOnce(ctx, db, key, req, o)
	if err != nil {
		return tryResult{}, err
	}
	c, ok := r.(*Claimed)
	if !ok {
		return tryResult{res: r}, nil
	}
	c.db, c.beats, c.leaseEnds = db, o.Heartbeats, started.Add(c.Lease)
	release := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		db.ExecContext(ctx, sqlRelease, key, c.Token, o.Scope) //nolint:errcheck // the lease ends anyway
	}
	return tryResult{res: r, abandon: release}, nil
}

// waitID names what a try asks for: requests with the same one share their
// waiting (wait.go).
func waitID(mode, key string, req any, o ClaimOptions) string {
	id, _ := json.Marshal([]any{mode, o.Scope, key, o.Lease.String(), req})
	return string(id)
}

// claimOnce runs idem_claim once on q and reads its answer.
func claimOnce(ctx context.Context, q Queryer, key string, request any, o ClaimOptions) (Result, error) {
	return readOutcome(q.QueryRowContext(ctx, sqlClaim, key, request, o.Lease.Seconds(), o.Scope), key, o)
}

// registerOnce runs idem_register once on q (inside the transaction that
// enqueues the key's job) and reads its answer.
func registerOnce(ctx context.Context, q Queryer, key string, request any, o ClaimOptions) (Result, error) {
	return readOutcome(q.QueryRowContext(ctx, sqlRegister, key, request, key, o.Scope), key, o)
}

func readOutcome(row *sql.Row, key string, o ClaimOptions) (Result, error) {
	var (
		outcome                      string
		status, result, cause, steps sql.NullString
		token, attempt               sql.NullInt64
		retryAfter                   sql.NullFloat64
		expired                      bool
	)
	if err := row.Scan(&outcome, &status, &token, &attempt, &result, &cause, &retryAfter, &expired, &steps); err != nil {
		return nil, wrap(err)
	}
	switch Outcome(outcome) {
	case OutcomeClaimed:
		finished, err := parseSteps(steps)
		if err != nil {
			return nil, err
		}
		return &Claimed{Key: key, Scope: o.Scope, Token: token.Int64, Attempt: int(attempt.Int64), Lease: o.Lease,
			steps: finished, resumed: len(finished) > 0}, nil
	case outcomeRegistered:
		return &registered{}, nil
	case OutcomeCompleted:
		return &Completed{Result: rawJSON(result), Replayed: true, ResultExpired: expired}, nil
	case OutcomeInProgress:
		return &InProgress{RetryAfter: seconds(retryAfter.Float64)}, nil
	case OutcomeRetryLater:
		return &RetryLater{RetryAfter: seconds(retryAfter.Float64)}, nil
	case OutcomeFailed:
		return &Failed{Message: cause.String, Replayed: true, ResultExpired: expired}, nil
	case OutcomeMismatch:
		return &Mismatch{}, nil
	}
	return nil, fmt.Errorf("idempotency: unknown outcome %q", outcome)
}

func rawJSON(s sql.NullString) []byte {
	if !s.Valid {
		return []byte("null")
	}
	return []byte(s.String)
}
