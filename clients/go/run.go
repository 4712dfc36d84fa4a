package idempotency

import (
	"context"
	"database/sql"
	"errors"
	"time"
)

// Work is the job Run runs once the key is claimed. ctx is cancelled when
// the heartbeat finds the lease lost: pass it to long calls.
type Work func(ctx context.Context, job *Claimed) (any, error)

// Run is the worker pattern: it claims key, runs work under a heartbeat and
// records how it ended. It returns *Completed when the work is done (now,
// or earlier: Replayed), and otherwise an error that errors.Is recognises:
//
//	the work returned a value        completed with it (unless it completed the key itself)
//	... that is not JSON             *Failed (ErrFailed), final: a channel, a cycle or a string
//	                                 with a NUL character (jsonb cannot hold U+0000) cannot be stored
//	the work returned an error       *Failed (ErrFailed): idem_fail, final when marked with Final
//	the lease was lost meanwhile     ErrFenced: nothing recorded, the writes rolled back
//	job.Release was called           ErrReleased
//	ctx was cancelled, and the work  ErrReleased: given back, no attempt counted (a stop is
//	returned an error                not a failure; a deadline that passed is one)
//	the sweep failed the key first   ErrWrongState (the lease had run out)
//	another worker holds the key     *InProgress (ErrInProgress), after opts.Wait
//	the key waits for its retry      *RetryLater (ErrRetryLater)
//	the key failed for good earlier  *Failed (ErrFailed), Replayed
//	used with another request        *Mismatch (ErrMismatch)
func Run(ctx context.Context, db *sql.DB, key string, request any, opts *ClaimOptions, work Work) (*Completed, error) {
	o := opts.normalized()
	r, err := Claim(ctx, db, key, request, &o)
	if err != nil {
		return nil, err
	}
	job, ok := r.(*Claimed)
	if !ok {
		return settled(r)
	}
	workCtx, stop := ctx, func() {}
	if !o.NoHeartbeat {
		workCtx, stop = job.KeepAlive(ctx)
	}
	// The heartbeat goes on while the outcome is recorded: a record that
	// waits for a busy pool must not let the lease end, or another worker
	// takes the key over and runs the work again.
	defer stop()
	value, workErr := runWork(workCtx, job, work)
	job.startRecording()

	record, cancel := job.recordingContext(ctx)
	defer cancel()
	finished, result := job.state()
	switch {
	case finished == "released":
		return nil, ErrReleased
	case workErr != nil && finished == "completed":
		return nil, workErr // the caller's own error, after the key was recorded
	case workErr != nil && errors.Is(workErr, ErrFenced):
		return nil, workErr
	case workErr != nil && errors.Is(ctx.Err(), context.Canceled) && job.LeaseLost() == nil:
		// The caller stopped the work (a worker shutting down), which is
		// not the work failing: the key is given back without counting an
		// attempt, so that stops (a deploy's) do not use the attempts up
		// and fail it for good. A deadline that passed is a failure.
		if err := job.Release(record); err != nil {
			return nil, err
		}
		return nil, ErrReleased
	case workErr != nil:
		failed, err := job.Fail(record, workErr)
		if err != nil {
			return nil, err
		}
		return nil, failed
	case finished == "completed":
		return &Completed{Result: result}, nil
	}
	if err := job.Complete(record, value); err != nil {
		var unstorable *unstorableResult
		if !errors.As(err, &unstorable) {
			return nil, err
		}
		// Left as it is, the key would stay held until its lease ends and
		// the work would run again, to the same end: it fails for good.
		failed, ferr := job.Fail(record, Final(err))
		if ferr != nil {
			return nil, ferr
		}
		return nil, failed
	}
	_, result = job.state()
	return &Completed{Result: result}, nil
}

// settled turns an answer that is not a claim into Run's return values.
func settled(r Result) (*Completed, error) {
	if done, ok := r.(*Completed); ok {
		return done, nil
	}
	return nil, r.(error)
}

// runWork runs work. Work that panics fails the key retryably (as the
// middleware does for a handler) before the panic goes on, and Run's
// deferred stop ends the heartbeat: left running, it would hold the key
// until ctx ends.
func runWork(ctx context.Context, job *Claimed, work Work) (value any, err error) {
	finished := false
	defer func() {
		if finished {
			return
		}
		job.startRecording()
		record, cancel := job.recordingContext(ctx)
		defer cancel()
		job.Fail(record, errors.New("the work panicked")) //nolint:errcheck
	}()
	value, err = work(ctx, job)
	finished = true
	return value, err
}

// withoutCancel has the values of its parent, not its deadline or end.
type withoutCancel struct{ parent context.Context }

func (withoutCancel) Deadline() (time.Time, bool) { return time.Time{}, false }
func (withoutCancel) Done() <-chan struct{}       { return nil }
func (withoutCancel) Err() error                  { return nil }
func (c withoutCancel) Value(key any) any         { return c.parent.Value(key) }
