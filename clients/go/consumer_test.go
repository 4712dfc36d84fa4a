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
