package idempotency

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// Errors that errors.Is recognises. The extension's SQLSTATEs come back
// wrapped in *Error (so errors.As still finds the driver's own error); the
// outcomes that are not the work's success come back as their result types
// (*InProgress, *RetryLater, *Failed, *Mismatch), which match these too.
var (
	ErrFenced     = errors.New("idempotency: stale token: the key was taken over (IK001)")
	ErrNotFound   = errors.New("idempotency: the key does not exist (IK002)")
	ErrWrongState = errors.New("idempotency: the key's state does not allow the call (IK003)")
	ErrInProgress = errors.New("idempotency: the key is held by another worker")
	ErrRetryLater = errors.New("idempotency: the key failed and waits for its retry")
	ErrFailed     = errors.New("idempotency: the key failed")
	ErrMismatch   = errors.New("idempotency: the key was used with another request")
	ErrReleased   = errors.New("idempotency: the work gave the key back")
)

var sqlStates = map[string]error{
	"IK001": ErrFenced,
	"IK002": ErrNotFound,
	"IK003": ErrWrongState,
}

// Error is a database error the extension raised with one of its SQLSTATEs.
type Error struct {
	Code string // the SQLSTATE, e.g. IK001
	Err  error  // the driver's error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Is matches the sentinel of the error's SQLSTATE.
func (e *Error) Is(target error) bool { return sqlStates[e.Code] == target }

// SQLState reads the code through the method both lib/pq (*pq.Error) and
// pgx (*pgconn.PgError) have, so that no driver is imported here.
func SQLState(err error) string {
	var coded interface{ SQLState() string }
	if errors.As(err, &coded) {
		return coded.SQLState()
	}
	return ""
}

// wrap gives the extension's errors their sentinel; others pass unchanged.
func wrap(err error) error {
	if err == nil {
		return nil
	}
	var known *Error
	if errors.As(err, &known) {
		return err
	}
	if code := SQLState(err); sqlStates[code] != nil {
		return &Error{Code: code, Err: err}
	}
	return err
}

// FinalError marks a work's error as final: the key fails for good and is
// not retried. Make one with Final.
type FinalError struct{ Err error }

func (e *FinalError) Error() string { return e.Err.Error() }
func (e *FinalError) Unwrap() error { return e.Err }

// Final marks err as final (no retry).
func Final(err error) error { return &FinalError{Err: err} }

// RetryableError asks for a retry after RetryIn instead of the extension's
// backoff. Make one with Retry. Any error not marked final is retryable.
// A RetryIn the extension refuses (negative, or over 36,000 days) is
// ignored: the error is retryable after the extension's backoff.
type RetryableError struct {
	Err     error
	RetryIn time.Duration
}

func (e *RetryableError) Error() string { return e.Err.Error() }
func (e *RetryableError) Unwrap() error { return e.Err }

// Retry marks err as retryable after d (0: at once). A d the extension
// refuses (negative, or over 36,000 days) is ignored: err is still
// retryable, after the extension's backoff, instead of a record that fails
// and leaves the key (or the event) held until its lease ends.
func Retry(err error, d time.Duration) error { return &RetryableError{Err: err, RetryIn: d} }

// retryDelay: the delay err asks for with a RetryableError, when the
// extension takes it; nil otherwise (the extension's backoff).
func retryDelay(err error) *time.Duration {
	var retryable *RetryableError
	if !errors.As(err, &retryable) || !retryInTaken(retryable.RetryIn) {
		return nil
	}
	return &retryable.RetryIn
}

func isFinal(err error) bool {
	var final *FinalError
	return errors.As(err, &final)
}

// errorText is err's message as idem_fail and outbox_nack store it: text
// cannot hold a NUL byte or bytes that are not UTF-8 (22021), which become
// U+FFFD, and a message over maxErrorBytes is cut; passed on, they failed
// the record and left the key (or the event) held until its lease ended.
func errorText(err error) string {
	if err == nil {
		return "unknown error"
	}
	text := strings.ReplaceAll(strings.ToValidUTF8(fmt.Sprint(err), "\uFFFD"), "\x00", "\uFFFD")
	if len(text) <= maxErrorBytes {
		return text
	}
	// Cut where a character ends, and say so.
	note := fmt.Sprintf(" [cut from %d bytes]", len(text))
	cut := maxErrorBytes - len(note)
	for cut > 0 && !utf8.RuneStart(text[cut]) {
		cut--
	}
	return text[:cut] + note
}

// maxErrorBytes is the longest error message stored: the server refuses one
// over idempotency.max_value_bytes (1 MB by default) with 22001, which left
// the key (or the event) held.
const maxErrorBytes = 8192
