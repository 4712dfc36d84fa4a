package idempotency

import (
	"context"
	"database/sql"
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
	// *InProgress. It polls (25 ms, doubling, at most 250 ms apart) with
	// short statements, so a waiting claim holds no connection between tries.
	Wait time.Duration
	// NoHeartbeat: Run and the middleware do not renew the lease.
	NoHeartbeat bool
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
	return waitFor(ctx, o.Wait, func() (Result, error) {
		r, err := claimOnce(ctx, db, key, req, o)
		if c, ok := r.(*Claimed); ok {
			c.db = db
		}
		return r, err
	})
}

// waitFor tries until the answer is not *InProgress or *RetryLater, or wait
// has passed; the last answer is returned.
func waitFor(ctx context.Context, wait time.Duration, try func() (Result, error)) (Result, error) {
	deadline := time.Now().Add(wait)
	delay := 25 * time.Millisecond
	for {
		r, err := try()
		if err != nil {
			return nil, err
		}
		switch r.(type) {
		case *InProgress, *RetryLater:
		default:
			return r, nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return r, nil
		}
		if delay > left {
			delay = left
		}
		select {
		case <-ctx.Done():
			return r, nil
		case <-time.After(delay):
		}
		if delay *= 2; delay > 250*time.Millisecond {
			delay = 250 * time.Millisecond
		}
	}
}

// claimOnce runs idem_claim once on q and reads its answer.
func claimOnce(ctx context.Context, q Queryer, key string, request any, o ClaimOptions) (Result, error) {
	var (
		outcome               string
		status, result, cause sql.NullString
		token, attempt        sql.NullInt64
		retryAfter            sql.NullFloat64
	)
	err := q.QueryRowContext(ctx, sqlClaim, key, request, o.Lease.Seconds(), o.Scope).
		Scan(&outcome, &status, &token, &attempt, &result, &cause, &retryAfter)
	if err != nil {
		return nil, wrap(err)
	}
	switch Outcome(outcome) {
	case OutcomeClaimed:
		return &Claimed{Key: key, Scope: o.Scope, Token: token.Int64, Attempt: int(attempt.Int64), Lease: o.Lease}, nil
	case OutcomeCompleted:
		return &Completed{Result: rawJSON(result), Replayed: true}, nil
	case OutcomeInProgress:
		return &InProgress{RetryAfter: seconds(retryAfter.Float64)}, nil
	case OutcomeRetryLater:
		return &RetryLater{RetryAfter: seconds(retryAfter.Float64)}, nil
	case OutcomeFailed:
		return &Failed{Message: cause.String, Replayed: true}, nil
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
