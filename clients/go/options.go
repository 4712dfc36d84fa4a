package idempotency

import (
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"
)

// The bounds the extension puts on what it is given (docs/keys.md, 22023)
// that hold whatever its settings. They are checked when the middleware or
// the consumer is made: a value out of them would fail every request or
// claim instead. A lease is also at most idempotency.max_lease (1 day by
// default); a superuser may raise that up to maxLease, so only the server
// checks it.
const (
	maxLease   = math.MaxInt32 * time.Millisecond // the highest idempotency.max_lease
	maxRetryIn = 36000 * 24 * time.Hour           // retry_in: 100 years of 360 days
	maxBatch   = 10000                            // outbox_claim's batch
	maxScope   = 63                               // a scope's bytes
)

// checkLease: at least a microsecond (an interval counts microseconds:
// less would be 0, which no lease is) and at most maxLease.
func checkLease(name string, d time.Duration) error {
	if d < time.Microsecond || d > maxLease {
		return fmt.Errorf("idempotency: %s must be from 1µs to %v, not %v", name, maxLease, d)
	}
	return nil
}

// retryInTaken: whether retry_in takes d (idem_fail's and outbox_nack's).
func retryInTaken(d time.Duration) bool { return d >= 0 && d <= maxRetryIn }

func checkRetryIn(name string, d time.Duration) error {
	if !retryInTaken(d) {
		return fmt.Errorf("idempotency: %s must be from 0 to %v (36,000 days), not %v", name, maxRetryIn, d)
	}
	return nil
}

// checkScope: what idem_claim takes as a scope, at most 63 bytes of UTF-8;
// another fails every request.
func checkScope(name, scope string) error {
	if len(scope) > maxScope || !utf8.ValidString(scope) {
		return fmt.Errorf("idempotency: %s must be at most %d bytes of UTF-8, not %q", name, maxScope, scope)
	}
	return nil
}

// checkHeaderName: an HTTP header's name (RFC 9110's token); no request
// carries another, and a replay could not send it.
func checkHeaderName(name, header string) error {
	for i := 0; i < len(header); i++ {
		if !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(header[i])) && !isAlnum(header[i]) {
			return fmt.Errorf("idempotency: %s must be an HTTP header name, not %q", name, header)
		}
	}
	return nil
}

func isAlnum(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

func checkNotNegative(name string, d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("idempotency: %s must not be negative, not %v", name, d)
	}
	return nil
}

// firstError: the first of errs that is not nil.
func firstError(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
