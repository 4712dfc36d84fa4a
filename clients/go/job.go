package idempotency

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// Claimed: the caller holds the key's lease. Every call that changes the
// key carries Token, the fencing token: once another worker has taken the
// key over, they fail with ErrFenced and change nothing.
type Claimed struct {
	Key     string
	Scope   string
	Token   int64
	Attempt int // 1 the first time
	Lease   time.Duration

	db        *sql.DB
	beats     *sql.DB // the heartbeat's pool; nil: db
	mu        sync.Mutex
	lost      error     // set by the heartbeat when the lease is lost
	leaseEnds time.Time // at the latest, as the claim or the last beat set it (zero: unknown)
	recording bool      // the outcome is being recorded, the heartbeat still running
	finished  string    // "completed" or "released" once recorded
	result    []byte
	steps     map[string]FinishedStep // multi-step work: the steps finished so far (steps.go)
	resumed   bool                    // the claim resumed after steps an earlier attempt finished
	// a step's result could not be stored (steps.go): the middleware then
	// fails the key for good, whatever the handler answered
	unstorableStep bool
}

// Resume rebuilds a claim made elsewhere (another process handed over its
// key and token), to heartbeat, fence, complete or fail it.
func Resume(db *sql.DB, key string, token int64, opts *ClaimOptions) *Claimed {
	o := opts.normalized()
	return &Claimed{Key: key, Scope: o.Scope, Token: token, Attempt: 1, Lease: o.Lease, db: db, beats: o.Heartbeats}
}

// AssertOwner fences tx: ErrFenced unless the key is still this claim's;
// the key's row stays locked until tx ends. Call it before business writes.
func (c *Claimed) AssertOwner(ctx context.Context, tx *sql.Tx) error {
	_, err := tx.ExecContext(ctx, sqlAssertOwner, c.Key, c.Token, c.Scope)
	return wrap(err)
}

// Complete stores result (any JSON value) in a statement of its own; every
// duplicate gets it back. A lost connection is tried again (record.go).
func (c *Claimed) Complete(ctx context.Context, result any) error {
	value, err := storable(result)
	if err != nil {
		return err
	}
	lost, err := c.retryLost(ctx, func(ctx context.Context) error { return c.completeWith(ctx, c.db, value) })
	if lost && errors.Is(err, ErrWrongState) {
		if _, stored, ok := c.recordedByThisClaim(ctx, "COMPLETED"); ok {
			c.recordFinished("completed", stored)
			return nil
		}
	}
	return err
}

// CompleteTx stores result inside tx, after the business writes: they
// commit together or not at all.
func (c *Claimed) CompleteTx(ctx context.Context, tx *sql.Tx, result any) error {
	return c.complete(ctx, tx, result)
}

func (c *Claimed) complete(ctx context.Context, q Queryer, result any) error {
	value, err := storable(result)
	if err != nil {
		return err
	}
	return c.completeWith(ctx, q, value)
}

func (c *Claimed) completeWith(ctx context.Context, q Queryer, value any) error {
	var stored sql.NullString
	if err := q.QueryRowContext(ctx, sqlComplete, c.Key, c.Token, value, c.Scope).Scan(&stored); err != nil {
		// 22xxx, for the result (the claim took the rest): larger than
		// idempotency.max_value_bytes, or not in the database's encoding.
		if strings.HasPrefix(SQLState(err), "22") {
			return &unstorableResult{err: err}
		}
		return wrap(err)
	}
	c.recordFinished("completed", stored)
	return nil
}

func (c *Claimed) recordFinished(finished string, stored sql.NullString) {
	c.mu.Lock()
	c.finished = finished
	c.result = rawJSON(stored)
	c.mu.Unlock()
}

// unstorableResult: a result that is not JSON (a channel, a function, a
// cycle), or holds a string with a NUL character (which jsonb cannot), or
// that the server refused (larger than idempotency.max_value_bytes, or a
// step's result than idem_step takes); nothing was recorded.
type unstorableResult struct {
	step string // the step's name; "" for the work's result
	err  error
}

func (e *unstorableResult) Error() string {
	if e.step != "" {
		return fmt.Sprintf("the result of step %q cannot be stored: %v", e.step, e.err)
	}
	if SQLState(e.err) != "" {
		return "the result cannot be stored: " + e.err.Error()
	}
	return "the result cannot be stored as JSON: " + e.err.Error()
}
func (e *unstorableResult) Unwrap() error { return e.err }

var errHoldsNUL = errors.New(`a string holds a NUL character (\u0000), which jsonb cannot hold`)

var errNotJSON = errors.New("the raw JSON is not JSON")
var errNotUTF8 = errors.New("the raw JSON is not UTF-8")

// storable: result as the parameter idem_complete takes, or *unstorableResult.
// Raw JSON ([]byte, json.RawMessage) passes as is, so it is checked here:
// the server would refuse it (22P02, 22021) after the work ran.
func storable(result any) (any, error) {
	value, err := jsonParam(result)
	if err != nil {
		return nil, &unstorableResult{err: err}
	}
	text, ok := value.(string)
	if !ok {
		return value, nil
	}
	switch result.(type) {
	case json.RawMessage, []byte:
		if !utf8.ValidString(text) {
			return nil, &unstorableResult{err: errNotUTF8}
		}
		if !json.Valid([]byte(text)) {
			return nil, &unstorableResult{err: errNotJSON}
		}
	}
	if holdsNUL(text) {
		return nil, &unstorableResult{err: errHoldsNUL}
	}
	return value, nil
}

// Transaction runs fn in a transaction fenced by the token, then completes
// the key with fn's result in that same transaction and commits. An error
// (ErrFenced among them) rolls it all back.
func (c *Claimed) Transaction(ctx context.Context, fn func(tx *sql.Tx) (any, error)) (*Completed, error) {
	tx, err := c.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback() //nolint:errcheck // after Commit it does nothing
	if err := c.AssertOwner(ctx, tx); err != nil {
		return nil, err
	}
	result, err := fn(tx)
	if err != nil {
		return nil, err
	}
	if err := c.CompleteTx(ctx, tx, result); err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, wrap(err)
	}
	return &Completed{Result: c.result}, nil
}

// Fail records the work's error: final when marked with Final, otherwise
// retryable (after the extension's backoff, or Retry's delay). The answer
// says whether and when the key may run again. A lost connection is tried
// again (record.go).
func (c *Claimed) Fail(ctx context.Context, cause error) (*Failed, error) {
	var failed *Failed
	lost, err := c.retryLost(ctx, func(ctx context.Context) (err error) {
		failed, err = c.failOnce(ctx, cause)
		return err
	})
	if lost && errors.Is(err, ErrWrongState) {
		if status, _, ok := c.recordedByThisClaim(ctx, "FAILED_RETRYABLE", "FAILED_FINAL"); ok {
			failed = &Failed{Message: errorText(cause), Retryable: status == "FAILED_RETRYABLE", Cause: cause}
			if failed.Retryable {
				var due sql.NullFloat64
				if c.db.QueryRowContext(ctx, sqlNextAttempt, c.Key, c.Scope).Scan(&due) == nil {
					failed.RetryAfter = seconds(due.Float64)
				}
			}
			return failed, nil
		}
	}
	if err != nil {
		return nil, err
	}
	return failed, nil
}

func (c *Claimed) failOnce(ctx context.Context, cause error) (*Failed, error) {
	tx, err := c.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback() //nolint:errcheck // after Commit it does nothing
	failed, err := c.fail(ctx, tx, cause)
	if err != nil {
		return nil, err
	}
	return failed, wrap(tx.Commit())
}

func (c *Claimed) fail(ctx context.Context, q Queryer, cause error) (*Failed, error) {
	final := isFinal(cause)
	var retryIn any
	if d := retryDelay(cause); !final && d != nil {
		retryIn = d.Seconds()
	}
	var status string
	if err := q.QueryRowContext(ctx, sqlFail, c.Key, c.Token, errorText(cause), !final, retryIn, c.Scope).
		Scan(&status); err != nil {
		return nil, wrap(err)
	}
	failed := &Failed{Message: errorText(cause), Retryable: status == "FAILED_RETRYABLE", Cause: cause}
	if failed.Retryable {
		var due sql.NullFloat64
		if err := q.QueryRowContext(ctx, sqlNextAttempt, c.Key, c.Scope).Scan(&due); err != nil {
			return nil, wrap(err)
		}
		failed.RetryAfter = seconds(due.Float64)
	}
	return failed, nil
}

// Release gives the key back without counting an attempt.
func (c *Claimed) Release(ctx context.Context) error {
	_, err := c.db.ExecContext(ctx, sqlRelease, c.Key, c.Token, c.Scope)
	if err == nil {
		c.mu.Lock()
		c.finished = "released"
		c.mu.Unlock()
	}
	return wrap(err)
}

// LeaseLost is the heartbeat's error (wrapping ErrFenced or ErrWrongState)
// once it found the lease lost; nil until then.
func (c *Claimed) LeaseLost() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lost
}

func (c *Claimed) state() (finished string, result []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.finished, c.result
}
