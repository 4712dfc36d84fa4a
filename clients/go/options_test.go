package idempotency_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	idempotency "github.com/idempotency/idempotency/clients/go"
)

// Options the extension refuses whatever its settings make Middleware
// panic, naming the option. A negative RetryIn made every retryable
// response a 500 whose key stayed held until its lease ended.
func TestMiddlewareRefusesOutOfRangeOptions(t *testing.T) {
	db := openDB(t)
	for _, c := range []struct {
		option string
		opts   idempotency.MiddlewareOptions
	}{
		{"RetryIn", idempotency.MiddlewareOptions{RetryIn: -time.Second}},
		{"RetryIn", idempotency.MiddlewareOptions{RetryIn: 36001 * 24 * time.Hour}},
		{"Lease", idempotency.MiddlewareOptions{Lease: -time.Second}},
		{"Lease", idempotency.MiddlewareOptions{Lease: time.Nanosecond}}, // 0 once in microseconds
		{"Lease", idempotency.MiddlewareOptions{Lease: 25 * 24 * time.Hour}},
		{"Wait", idempotency.MiddlewareOptions{Wait: -time.Second}},
		// A scope the server refuses failed every request (22001); a
		// header name no request carries, or a replay cannot send.
		{"Scope", idempotency.MiddlewareOptions{Scope: strings.Repeat("s", 64)}},
		{"Scope", idempotency.MiddlewareOptions{Scope: "a\xffb"}},
		{"Header", idempotency.MiddlewareOptions{Header: "Idempotency Key"}},
		{"ReplayHeader", idempotency.MiddlewareOptions{ReplayHeader: "Idempotent-Replayed\n"}},
	} {
		func() {
			defer func() {
				if p := recover(); p == nil || !strings.Contains(fmt.Sprint(p), c.option) {
					t.Errorf("Middleware with %s: panic %v, want one naming it", given(c.opts, c.option), p)
				}
			}()
			idempotency.Middleware(db, &c.opts)
		}()
	}

	idempotency.Middleware(db, &idempotency.MiddlewareOptions{Lease: time.Microsecond})              // the shortest
	idempotency.Middleware(db, &idempotency.MiddlewareOptions{Scope: strings.Repeat("é", 31) + "s"}) // 63 bytes

	// The bounds themselves are the server's: a retryable response is
	// recorded with a RetryIn of 36,000 days.
	const scope = "go.options"
	unavailable := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	server := httptest.NewServer(idempotency.Middleware(db, &idempotency.MiddlewareOptions{
		Scope: scope, RetryIn: 36000 * 24 * time.Hour})(unavailable))
	defer server.Close()
	key := newKey(t)
	if a := post(t, server.URL, key, `{}`); a.status != http.StatusServiceUnavailable {
		t.Fatalf("a 503 with RetryIn 36,000 days: %d %s", a.status, a.body)
	}
	if status, _ := keyStatus(t, db, key, scope); status != "FAILED_RETRYABLE" {
		t.Fatalf("the key is %s, not FAILED_RETRYABLE", status)
	}
}

// Options outbox_claim refuses make Consume return an error naming the
// option, instead of claiming in vain forever with only OnError told why.
// A lease over the server's idempotency.max_lease (1 day here; a
// superuser may raise it) is refused by the first claim.
func TestConsumeRefusesOutOfRangeOptions(t *testing.T) {
	db := openDB(t)
	topics := []string{"go.options." + newKey(t)}
	handler := func(context.Context, idempotency.Delivery) error { return nil }
	for _, c := range []struct {
		option string
		opts   idempotency.ConsumeOptions
	}{
		{"Batch", idempotency.ConsumeOptions{Batch: 10001}},
		{"Batch", idempotency.ConsumeOptions{Batch: -1}},
		{"Concurrency", idempotency.ConsumeOptions{Concurrency: -1}},
		{"Lease", idempotency.ConsumeOptions{Lease: -time.Second}},
		{"Lease", idempotency.ConsumeOptions{Lease: 25 * 24 * time.Hour}},
		{"PollInterval", idempotency.ConsumeOptions{PollInterval: -time.Second}},
		{"StopTimeout", idempotency.ConsumeOptions{StopTimeout: -time.Second}},
		{"Lease", idempotency.ConsumeOptions{Lease: 48 * time.Hour}},
	} {
		c.opts.OnError = func(error) {}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := idempotency.Consume(ctx, db, topics, handler, &c.opts)
		stopped := ctx.Err()
		cancel()
		if err == nil || stopped != nil || !strings.Contains(err.Error(), c.option) {
			t.Errorf("Consume with %s: %v (context: %v), want an error naming it at once", given(c.opts, c.option), err, stopped)
		}
		if c.opts.Lease == 48*time.Hour && idempotency.SQLState(err) != "22023" {
			t.Errorf("a 48 h lease: %v, want the server's 22023", err)
		}
	}
}

// given: the option by its name and value, "Lease 48h0m0s".
func given(opts any, option string) string {
	return fmt.Sprintf("%s %v", option, reflect.ValueOf(opts).FieldByName(option))
}
