package idempotency

// Multi-step work (docs/keys.md, "Multi-step work"): each finished step is
// recorded on the key with idem_step, in the transaction of the step's own
// writes; a claim that resumes the key is given the finished steps, and
// Step returns a finished step's stored result instead of running it.

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
)

// FinishedStep is a step recorded on the key: its place in the order the
// steps finished, the attempt (claim) that recorded it, and its result.
type FinishedStep struct {
	Name    string
	N       int
	Attempt int
	Result  json.RawMessage
}

// StepFunc runs a step in tx (its writes commit with the step's record);
// stepKey is the key to give the step's external call as the provider's
// idempotency key. Its value is the step's result (any JSON value).
type StepFunc func(ctx context.Context, tx *sql.Tx, stepKey string) (any, error)

// StepKey is the key of a step's external call: the text
// idem_step_key(key, step, scope) returns, computed without a round trip
// (the step's name, a dash and the first 128 bits of the SHA-256 of scope,
// key and step, each preceded by its length in bytes and a colon). It
// panics for a step's name idem_step_key refuses, which no step can be
// recorded under: names are the program's constants, and a bad one is a
// programmer's error, as a bad pattern is to regexp.MustCompile. Check a
// name that comes from data with CheckStepName first.
func StepKey(scope, key, step string) string {
	if err := CheckStepName(step); err != nil {
		panic(err)
	}
	h := sha256.New()
	for _, part := range []string{scope, key, step} {
		fmt.Fprintf(h, "%d:%s", len(part), part)
	}
	return step + "-" + hex.EncodeToString(h.Sum(nil))[:32]
}

const stepNameRule = "a step's name is 1 to 63 bytes of ASCII letters, digits and _ . : -"

// CheckStepName is nil for a name idem_step and idem_step_key take (1 to 63
// bytes of ASCII letters, digits and _ . : -; it is part of the step's key,
// which providers receive in a header), otherwise an error naming the rule.
func CheckStepName(name string) error {
	if name == "" || len(name) > 63 {
		return fmt.Errorf("idempotency: a step's name of %d bytes: %s", len(name), stepNameRule)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("_.:-", c) >= 0) {
			return fmt.Errorf("idempotency: step %q (byte %d): %s", name, i+1, stepNameRule)
		}
	}
	return nil
}

// parseSteps reads the steps of a claim's answer (name -> {n, attempt,
// result}).
func parseSteps(s sql.NullString) (map[string]FinishedStep, error) {
	steps := map[string]FinishedStep{}
	if !s.Valid {
		return steps, nil
	}
	var raw map[string]struct {
		N       int             `json:"n"`
		Attempt int             `json:"attempt"`
		Result  json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal([]byte(s.String), &raw); err != nil {
		return nil, fmt.Errorf("idempotency: the claim's steps: %w", err)
	}
	for name, step := range raw {
		steps[name] = FinishedStep{Name: name, N: step.N, Attempt: step.Attempt, Result: step.Result}
	}
	return steps, nil
}

// Steps are the steps finished so far, in their order: those an earlier
// attempt finished (this claim resumed after them), then this claim's.
func (c *Claimed) Steps() []FinishedStep {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]FinishedStep, 0, len(c.steps))
	for _, step := range c.steps {
		out = append(out, step)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].N < out[j].N })
	return out
}

// Resumed is true when the claim resumed after steps an earlier attempt
// finished.
func (c *Claimed) Resumed() bool { return c.resumed }

// StepKey is the key of the step's external call (idem_step_key); it
// panics for a name CheckStepName refuses.
func (c *Claimed) StepKey(name string) string { return StepKey(c.Scope, c.Key, name) }

// Step runs the step name unless it finished before: fn in a transaction
// of its own, then the step's record (idem_step) in it, and commits. It
// returns the step's result: the stored one when the step had finished.
// ErrFenced when the key was taken over: the step's writes roll back. A
// result that can never be recorded (not JSON, a string with a NUL
// character, larger than idempotency.max_step_bytes) is an error marked
// Final, saying why: the work that returns it fails its key for good,
// instead of running the step's function again at every attempt. So is a
// name CheckStepName refuses, before fn runs. Under Middleware, a step
// whose result could not be stored fails the request's key for good
// whatever the handler answers (or, in claim mode, if it panics).
func (c *Claimed) Step(ctx context.Context, name string, fn StepFunc) (json.RawMessage, error) {
	if result, done, err := c.finishedStep(name); done || err != nil {
		return result, err
	}
	tx, err := c.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback() //nolint:errcheck // after Commit it does nothing
	step, err := c.runStep(ctx, tx, name, fn)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, wrap(err)
	}
	c.recorded(step)
	return step.Result, nil
}

// StepTx is Step inside tx, the caller's transaction (in the middleware's
// transaction mode, TxOf's): the step's record commits with it. It is not
// remembered as finished, since tx may still roll back (a serialization
// failure the caller retries in another transaction) and the step with it:
// a step already recorded is read from the key, as tx sees it.
func (c *Claimed) StepTx(ctx context.Context, tx *sql.Tx, name string, fn StepFunc) (json.RawMessage, error) {
	if result, done, err := c.finishedStep(name); done || err != nil {
		return result, err
	}
	var recorded sql.NullString
	if err := tx.QueryRowContext(ctx, sqlStepRecorded, c.Key, c.Scope, name).Scan(&recorded); err != nil {
		return nil, wrap(err)
	}
	if recorded.Valid {
		var stored struct {
			Result json.RawMessage `json:"result"`
		}
		if err := json.Unmarshal([]byte(recorded.String), &stored); err != nil {
			return nil, fmt.Errorf("idempotency: step %q as recorded: %w", name, err)
		}
		return stored.Result, nil
	}
	step, err := c.runStep(ctx, tx, name, fn)
	if err != nil {
		return nil, err
	}
	return step.Result, nil
}

// finishedStep: the stored result of the step name when it finished
// (done), or an error marked Final for a name no step can be recorded
// under, before the step's function runs.
func (c *Claimed) finishedStep(name string) (result json.RawMessage, done bool, err error) {
	if err := CheckStepName(name); err != nil {
		return nil, false, Final(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	step, ok := c.steps[name]
	return step.Result, ok, nil
}

func (c *Claimed) runStep(ctx context.Context, tx *sql.Tx, name string, fn StepFunc) (FinishedStep, error) {
	// The key must still be this claim's before the step's work: a worker
	// paused past its lease, whose key another took over and finished,
	// would run again a step that one finished (fenced only at its record).
	if _, err := tx.ExecContext(ctx, sqlAssertOwner, c.Key, c.Token, c.Scope); err != nil {
		return FinishedStep{}, wrap(err)
	}
	value, err := fn(ctx, tx, c.StepKey(name))
	if err != nil {
		return FinishedStep{}, err
	}
	result, err := storableStep(name, value)
	if err != nil {
		c.noteUnstorableStep()
		return FinishedStep{}, err
	}
	var n int
	if err := tx.QueryRowContext(ctx, sqlStep, c.Key, c.Token, name, string(result), c.Scope).Scan(&n); err != nil {
		switch SQLState(err) {
		case "22001": // the name was checked: the result is too large
			c.noteUnstorableStep()
			return FinishedStep{}, unstorableStep(name, fmt.Errorf(
				"it is larger than the server stores for a step (idempotency.max_step_bytes): %w", err))
		case "54000": // as at every attempt, after the step's work
			c.noteUnstorableStep()
			return FinishedStep{}, unstorableStep(name, fmt.Errorf(
				"the key holds as many steps as idempotency.max_steps allows: %w", err))
		}
		return FinishedStep{}, wrap(err)
	}
	return FinishedStep{Name: name, N: n, Attempt: c.Attempt, Result: result}, nil
}

// storableStep: a step's result as idem_step takes it, or unstorableStep's
// error.
func storableStep(name string, value any) ([]byte, error) {
	result, err := json.Marshal(value)
	if err != nil {
		return nil, unstorableStep(name, fmt.Errorf("it is not JSON: %w", err))
	}
	if holdsNUL(string(result)) {
		return nil, unstorableStep(name, errHoldsNUL)
	}
	return result, nil
}

// unstorableStep: the step's result can never be recorded, at any attempt,
// so the error is marked Final: failed retryably, the key would run the
// step's function (its external call too) again at every attempt, to the
// same end.
func unstorableStep(name string, err error) error {
	return Final(&unstorableResult{step: name, err: err})
}

// noteUnstorableStep remembers that a step's result could not be stored.
// The middleware's handler makes a response of the step's error, which
// its classification may call retryable (a 500): the key would then run
// the handler, and the step's function with its external call, again at
// every attempt, to the same end. The middleware fails it for good instead
// (hadUnstorableStep).
func (c *Claimed) noteUnstorableStep() {
	c.mu.Lock()
	c.unstorableStep = true
	c.mu.Unlock()
}

// hadUnstorableStep: a step of this claim could not be stored.
func (c *Claimed) hadUnstorableStep() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.unstorableStep
}

func (c *Claimed) recorded(step FinishedStep) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.steps == nil {
		c.steps = map[string]FinishedStep{}
	}
	c.steps[step.Name] = step
}
