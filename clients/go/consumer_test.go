package idempotency_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	idempotency "github.com/idempotency/idempotency/clients/go"
)

func enqueueAll(t *testing.T, topic string, keys, perKey int) {
	t.Helper()
	db := openDB(t)
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	for seq := 0; seq < perKey; seq++ {
		for k := 0; k < keys; k++ {
			payload := map[string]int{"key": k, "seq": seq}
			if _, err := idempotency.Enqueue(context.Background(), tx, topic, payload,
				&idempotency.EnqueueOptions{Key: fmt.Sprintf("k%d", k)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// Two consumers (two pools, each two slots claiming batches of 4) share a
// topic of 6 keys × 15 events: each key's events are handled one at a time,
// in enqueue order, each once; a nacked event comes back and is handled
// again before its key's next one.
func TestConsumersKeepPerKeyOrder(t *testing.T) {
	topic := "go.order." + newKey(t)
	const keys, perKey = 6, 15
	enqueueAll(t, topic, keys, perKey)

	var mu sync.Mutex
	seen := map[int][]int{}     // key -> seqs handled, in order
	running := map[int]bool{}   // key -> a handler runs for it
	nacked := map[string]bool{} // the event failed once on purpose
	by := map[string]int{}      // consumer -> events handled
	total := 0
	handler := func(name string) idempotency.Handler {
		return func(ctx context.Context, d idempotency.Delivery) error {
			var p struct{ Key, Seq int }
			if err := json.Unmarshal(d.Payload, &p); err != nil {
				return idempotency.Final(err)
			}
			mu.Lock()
			if running[p.Key] {
				mu.Unlock()
				t.Errorf("two events of key %d at once", p.Key)
				return nil
			}
			running[p.Key] = true
			mu.Unlock()
			time.Sleep(2 * time.Millisecond) // a handler that takes a moment
			mu.Lock()
			defer mu.Unlock()
			running[p.Key] = false
			id := fmt.Sprintf("%d/%d", p.Key, p.Seq)
			if p.Seq == 3 && !nacked[id] {
				nacked[id] = true
				return idempotency.Retry(errors.New("once more"), 0)
			}
			seen[p.Key] = append(seen[p.Key], p.Seq)
			by[name]++
			total++
			return nil
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var wg sync.WaitGroup
	for _, name := range []string{"a", "b"} {
		db := openDB(t)
		wg.Add(1)
		go func(name string) {
			defer wg.Done()
			opts := &idempotency.ConsumeOptions{Name: "go-test-" + name, Concurrency: 2, Batch: 4,
				PollInterval: 20 * time.Millisecond, OnError: func(err error) { t.Errorf("consumer %s: %v", name, err) }}
			if err := idempotency.Consume(ctx, db, []string{topic}, handler(name), opts); err != nil {
				t.Error(err)
			}
		}(name)
	}
	eventually(t, 60*time.Second, "every event handled", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return total >= keys*perKey
	})
	stop()
	wg.Wait()
	for k := 0; k < keys; k++ {
		if len(seen[k]) != perKey {
			t.Fatalf("key %d: %v", k, seen[k])
		}
		for i, seq := range seen[k] {
			if seq != i {
				t.Fatalf("key %d out of order: %v", k, seen[k])
			}
		}
	}
	if len(nacked) != keys {
		t.Fatalf("nacked %d events, want %d", len(nacked), keys)
	}
	t.Logf("handled by consumer: %v", by)
}

// A handler that asks for a retry delay the extension refuses (negative,
// or over 36,000 days) gets its event nacked after the outbox's backoff:
// passed on, the delay made outbox_nack fail (22023), and the event came
// back only once its lease (60 s) ended.
func TestConsumerRetryDelayOutOfRangeGetsTheBackoff(t *testing.T) {
	for _, d := range []time.Duration{-time.Second, 36001 * 24 * time.Hour} {
		nackedOnce(t, fmt.Sprintf("Retry(err, %v)", d), idempotency.Retry(errors.New("provider busy"), d))
	}
}

// A handler error whose message holds a NUL byte or is not UTF-8 gets its
// event nacked, the message stored with U+FFFD in their place: passed on
// as it was, text PostgreSQL cannot hold made outbox_nack fail (22021),
// and the event came back only once its lease (60 s) ended.
func TestConsumerErrorMessageHoldingANUL(t *testing.T) {
	for _, message := range []string{"bad\x00byte", "bad\xffbyte"} {
		if stored := nackedOnce(t, fmt.Sprintf("%q", message), errors.New(message)); stored != "bad\uFFFDbyte" {
			t.Fatalf("%q stored as %q", message, stored)
		}
	}
}

// nackedOnce consumes an event whose handler returns handlerErr, then
// nil: the event must be nacked, handled again after the outbox's backoff
// and acked, with no error on the way. It returns the error the nack
// stored.
func nackedOnce(t *testing.T, what string, handlerErr error) (lastError string) {
	t.Helper()
	db, admin := openDB(t), adminDB(t)
	topic := "go.nacked-once." + newKey(t)
	id, err := idempotency.Enqueue(context.Background(), db, topic, map[string]int{"n": 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	deliveries := 0
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- idempotency.Consume(ctx, db, []string{topic}, func(context.Context, idempotency.Delivery) error {
			mu.Lock()
			defer mu.Unlock()
			if deliveries++; deliveries == 1 {
				return handlerErr
			}
			return nil
		}, &idempotency.ConsumeOptions{PollInterval: 20 * time.Millisecond,
			OnError: func(err error) { t.Errorf("%s: %v", what, err) }})
	}()
	defer func() { // the consumer ends before the test does, even a failed one
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	var state string
	eventually(t, 15*time.Second, "the event nacked with "+what+" delivered", func() bool {
		if err := admin.QueryRow(`SELECT state::text, coalesce(last_error, '') FROM idempotency.outbox WHERE id = $1`, id).
			Scan(&state, &lastError); err != nil {
			t.Fatal(err)
		}
		return state == "delivered"
	})
	mu.Lock()
	defer mu.Unlock()
	if deliveries != 2 {
		t.Fatalf("%s: %d deliveries", what, deliveries)
	}
	return lastError
}

// Stopping a consumer lets the event in hand finish and be acked.
func TestConsumerStopsGracefully(t *testing.T) {
	db := openDB(t)
	topic := "go.stop." + newKey(t)
	id, err := idempotency.Enqueue(context.Background(), db, topic, map[string]int{"n": 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error)
	var handled bool
	go func() {
		done <- idempotency.Consume(ctx, db, []string{topic}, func(hctx context.Context, d idempotency.Delivery) error {
			close(started)
			<-ctx.Done() // the stop comes while the event is in hand
			select {
			case <-hctx.Done():
				return errors.New("the handler's context ended before StopTimeout")
			case <-time.After(100 * time.Millisecond):
			}
			handled = true
			return nil
		}, &idempotency.ConsumeOptions{PollInterval: 20 * time.Millisecond})
	}()
	select {
	case <-started:
	case <-time.After(20 * time.Second):
		t.Fatal("the event was not delivered")
	}
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Consume did not return")
	}
	var state string
	if err := adminDB(t).QueryRow(`SELECT state::text FROM idempotency.outbox WHERE id = $1`, id).Scan(&state); err != nil {
		t.Fatal(err)
	}
	if !handled || state != "delivered" {
		t.Fatalf("handled %v, state %s", handled, state)
	}
}

// An event whose key another worker holds (here a claim whose worker
// died, its lease 3 s) is not a failure of the event: it comes back
// without an attempt counted until the key is free, then the work runs
// once and the event is acked. The scope's quick completions make the
// extension answer in_progress with a retry_after of milliseconds; nacked
// after it, the event used up its ten attempts in about a second and died
// without the work ever running.
func TestConsumerWaitsForAKeyHeldElsewhere(t *testing.T) {
	db := openDB(t)
	ctx := testContext(t, 60*time.Second)
	scope := fmt.Sprintf("go.held.%d", time.Now().UnixNano())
	opts := &idempotency.ClaimOptions{Scope: scope, Lease: 3 * time.Second}
	quick := func(context.Context, *idempotency.Claimed) (any, error) { return "ok", nil }
	for i := 0; i < 10; i++ {
		if _, err := idempotency.Run(ctx, db, fmt.Sprintf("quick-%d", i), nil, opts, quick); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := idempotency.Claim(ctx, db, "held", nil, opts); err != nil { // its worker dies
		t.Fatal(err)
	}
	topic := "go.held." + newKey(t)
	id, err := idempotency.Enqueue(ctx, db, topic, map[string]int{"n": 1}, &idempotency.EnqueueOptions{Key: "held"})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	ran, deliveries := 0, 0
	consuming, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- idempotency.Consume(consuming, db, []string{topic}, func(hctx context.Context, d idempotency.Delivery) error {
			mu.Lock()
			deliveries++
			mu.Unlock()
			_, err := idempotency.Run(hctx, db, "held", nil, opts, func(context.Context, *idempotency.Claimed) (any, error) {
				mu.Lock()
				ran++
				mu.Unlock()
				return "done", nil
			})
			return err
		}, &idempotency.ConsumeOptions{PollInterval: 100 * time.Millisecond, Lease: 10 * time.Second})
	}()
	var state string
	var attempts int
	eventually(t, 40*time.Second, "the event delivered or dead", func() bool {
		if err := adminDB(t).QueryRow(`SELECT state::text, attempts FROM idempotency.outbox WHERE id = $1`, id).
			Scan(&state, &attempts); err != nil {
			t.Fatal(err)
		}
		return state == "delivered" || state == "dead"
	})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d deliveries, the work ran %d time(s), event %s after %d attempt(s)", deliveries, ran, state, attempts)
	if state != "delivered" || ran != 1 || deliveries < 2 {
		t.Fatalf("event %s, work ran %d time(s) in %d deliveries", state, ran, deliveries)
	}
}
