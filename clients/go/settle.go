package idempotency

import (
	"errors"
	"time"
)

// Settlement is what the consumer does with an event once its handler
// returned.
type Settlement struct {
	// "ack", "nack", "leave" (it comes back when its lease ends) or
	// "release" (pending again after RetryIn, its attempt not counted)
	Action    string
	Error     string // nack: the error recorded on the event
	Retryable bool   // nack: false makes it a dead letter
	RetryIn   *time.Duration
}

// Settle maps a handler's error to a settlement. Handlers that run Run (or
// InTx) return its error as is:
//
//	nil, or Run's *Completed                   ack
//	*Failed that was replayed (failed earlier)  ack
//	*Failed of this delivery                    nack, retryable or not as the key, after its backoff
//	*InProgress, *RetryLater                    release after RetryAfter, the attempt not counted:
//	                                            the key's holder and its own retries decide
//	ErrReleased                                 nack, back after the outbox's backoff
//	*Mismatch, or an error marked Final         nack for good: a dead letter
//	ErrFenced                                   leave: the worker that took the key over holds it
//	any other error                             nack, retryable (Retry's delay when given and in
//	                                            0..36,000 days; otherwise the outbox's backoff)
func Settle(err error) Settlement {
	if err == nil {
		return Settlement{Action: "ack"}
	}
	var (
		failed     *Failed
		inProgress *InProgress
		retryLater *RetryLater
		mismatch   *Mismatch
	)
	switch {
	case errors.Is(err, ErrFenced):
		return Settlement{Action: "leave"}
	case errors.As(err, &failed) && failed.Replayed:
		return Settlement{Action: "ack"}
	case errors.As(err, &failed):
		s := Settlement{Action: "nack", Error: failed.Message, Retryable: failed.Retryable}
		if failed.Retryable {
			s.RetryIn = &failed.RetryAfter
		}
		return s
	case errors.As(err, &inProgress):
		// Another worker holds the key: the event did not fail, and counting
		// an attempt each time would make it a dead letter while the holder
		// works (a few milliseconds apart, retry_after being when the holder
		// is expected to finish).
		return Settlement{Action: "release", Error: "key in_progress", RetryIn: &inProgress.RetryAfter}
	case errors.As(err, &retryLater):
		return Settlement{Action: "release", Error: "key retry_later", RetryIn: &retryLater.RetryAfter}
	case errors.Is(err, ErrReleased):
		return Settlement{Action: "nack", Error: "released", Retryable: true}
	case errors.As(err, &mismatch):
		return Settlement{Action: "nack", Error: "the event does not carry the request its key was used with"}
	case isFinal(err):
		return Settlement{Action: "nack", Error: errorText(err)}
	}
	return Settlement{Action: "nack", Error: errorText(err), Retryable: true, RetryIn: retryDelay(err)}
}
