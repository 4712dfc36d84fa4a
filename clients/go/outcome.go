package idempotency

import (
	"encoding/json"
	"fmt"
	"time"
)

// Outcome is what idem_claim answered.
type Outcome string

const (
	OutcomeClaimed    Outcome = "claimed"
	OutcomeCompleted  Outcome = "completed"
	OutcomeInProgress Outcome = "in_progress"
	OutcomeRetryLater Outcome = "retry_later"
	OutcomeFailed     Outcome = "failed"
	OutcomeMismatch   Outcome = "mismatch"
)

// Result is one of *Claimed, *Completed, *InProgress, *RetryLater, *Failed
// or *Mismatch: switch on its type. Those that are not the work's success
// are errors as well, so that the helpers can return them as such.
type Result interface {
	Outcome() Outcome
}

// Completed: the key's work is done; Result is the stored result.
type Completed struct {
	Result   json.RawMessage // null when the work stored none
	Replayed bool            // a duplicate of work done earlier
	// ResultExpired: a duplicate of work done so long ago that only the
	// key's tombstone is left; Result is null because it is gone. The work
	// is never run again.
	ResultExpired bool
}

// Decode unmarshals the stored result into v.
func (c *Completed) Decode(v any) error { return json.Unmarshal(c.Result, v) }

// InProgress: another worker holds the key.
type InProgress struct {
	RetryAfter time.Duration // when the holder is expected to be done
}

// RetryLater: the key failed retryably and its backoff has not passed.
type RetryLater struct {
	RetryAfter time.Duration // the backoff left
}

// Failed: the key failed. Replayed is true when it failed for good earlier;
// false when this call's work just failed, and then Retryable says whether
// a later claim runs it again (after RetryAfter).
type Failed struct {
	Message    string // the key's error, as stored
	Retryable  bool
	RetryAfter time.Duration
	Replayed   bool
	// ResultExpired: a duplicate of a final failure so old that only the
	// key's tombstone is left; Message is empty because it is gone.
	ResultExpired bool
	Cause         error // the work's error, when this call's work failed
}

// Mismatch: the key was used with another request; nothing changed.
type Mismatch struct{}

func (*Claimed) Outcome() Outcome    { return OutcomeClaimed }
func (*Completed) Outcome() Outcome  { return OutcomeCompleted }
func (*InProgress) Outcome() Outcome { return OutcomeInProgress }
func (*RetryLater) Outcome() Outcome { return OutcomeRetryLater }
func (*Failed) Outcome() Outcome     { return OutcomeFailed }
func (*Mismatch) Outcome() Outcome   { return OutcomeMismatch }

func (r *InProgress) Error() string {
	return fmt.Sprintf("%v (retry after %v)", ErrInProgress, r.RetryAfter)
}
func (r *RetryLater) Error() string {
	return fmt.Sprintf("%v (retry after %v)", ErrRetryLater, r.RetryAfter)
}
func (r *Failed) Error() string   { return fmt.Sprintf("%v: %s", ErrFailed, r.Message) }
func (r *Mismatch) Error() string { return ErrMismatch.Error() }

func (r *InProgress) Is(target error) bool { return target == ErrInProgress }
func (r *RetryLater) Is(target error) bool { return target == ErrRetryLater }
func (r *Failed) Is(target error) bool     { return target == ErrFailed }
func (r *Mismatch) Is(target error) bool   { return target == ErrMismatch }
func (r *Failed) Unwrap() error            { return r.Cause }

// seconds turns a retry_after in seconds into a Duration (0 when NULL).
func seconds(s float64) time.Duration {
	if s <= 0 {
		return 0
	}
	return time.Duration(s * float64(time.Second))
}
