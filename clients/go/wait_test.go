package idempotency_test

import (
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idempotency "github.com/idempotency/idempotency/clients/go"
)

// 100 requests wait (Wait) for one key while its handler runs. They share
// one poller: after they have all arrived, the database sees about four
// claims a second between them, not one per request and tick. The handler
// is held until all 100 have arrived and the poller has tried six times
// since, then every request gets the one response.
func TestWaitingDuplicatesShareOnePoller(t *testing.T) {
	db, claims := countingDB(t)
	const n = 100
	var runs, arrived atomic.Int64
	release := make(chan struct{})
	held := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-time.After(30 * time.Second):
		}
		orders(&runs).ServeHTTP(w, r)
	})
	mw := idempotency.Middleware(db, &idempotency.MiddlewareOptions{Scope: "go.poller", Wait: 30 * time.Second})(held)
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived.Add(1)
		mw.ServeHTTP(w, r)
	}))
	defer server.Close()
	http.DefaultTransport.(*http.Transport).MaxIdleConnsPerHost = n
	key := newKey(t)

	start := time.Now()
	answers := make(chan []answer, 1)
	go func() { answers <- burst(t, server.URL+"/orders", key, `{"item": "tea"}`, n) }()
	eventually(t, 20*time.Second, "all requests arrived", func() bool { return arrived.Load() == n })
	base, since := claims.Load(), time.Now()
	eventually(t, 20*time.Second, "six polls", func() bool { return claims.Load() >= base+6 })
	close(release)
	got := <-answers
	polls, total, pollTime := claims.Load()-base, claims.Load(), time.Since(since)

	replayed := 0
	for _, a := range got {
		if a.status != http.StatusCreated || !bytes.Equal(a.body, got[0].body) {
			t.Fatalf("answer %d %s, want 201 %s", a.status, a.body, got[0].body)
		}
		if a.header.Get("Idempotent-Replayed") == "true" {
			replayed++
		}
	}
	if runs.Load() != 1 || replayed != n-1 {
		t.Fatalf("%d runs, %d replayed", runs.Load(), replayed)
	}
	t.Logf("%d claims in %v (%d while all %d waited, over %v)", total, time.Since(start), polls, n, pollTime)
	// The poller tries at most every 25, 50, 100, 200, then 250 ms.
	if limit := int64(4*pollTime.Seconds()) + 10; polls > limit {
		t.Fatalf("%d claims in %v while %d requests waited: more than one poller's %d", polls, pollTime, n, limit)
	}
	if limit := int64(n + 4*time.Since(start).Seconds() + 10); total > limit {
		t.Fatalf("%d claims in all, more than one per request and one poller's (%d)", total, limit)
	}
}

// Claim with Wait shares the poller too. When the holder fails retryably,
// the poller's claim goes to one waiting caller only; it completes, and
// the others get its result.
func TestWaitingClaimsGetTheKeyOneAtATime(t *testing.T) {
	db := openDB(t)
	ctx := testContext(t, 30*time.Second)
	key := newKey(t)
	opts := &idempotency.ClaimOptions{Scope: "go.poller.claim", Wait: 20 * time.Second}
	first, err := idempotency.Claim(ctx, db, key, nil, opts)
	holder, ok := first.(*idempotency.Claimed)
	if err != nil || !ok {
		t.Fatalf("first claim: %v %v", first, err)
	}
	const n = 10
	var claimed, completed atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := idempotency.Claim(ctx, db, key, nil, opts)
			switch r := res.(type) {
			case *idempotency.Claimed:
				claimed.Add(1)
				if err := r.Complete(ctx, map[string]int{"attempt": r.Attempt}); err != nil {
					t.Error(err)
				}
			case *idempotency.Completed:
				completed.Add(1)
			default:
				t.Errorf("a waiting claim got %T %v", res, err)
			}
		}()
	}
	if _, err := holder.Fail(ctx, idempotency.Retry(errors.New("try again"), 0)); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if claimed.Load() != 1 || completed.Load() != n-1 {
		t.Fatalf("%d claimed, %d completed", claimed.Load(), completed.Load())
	}
}

// A poll that fails (the server restarting) answers none of the waiting
// claims: the next poll goes on, and when the holder completes every
// waiting claim gets its result.
func TestWaitingClaimsOutliveAFailedPoll(t *testing.T) {
	db, claims, fail := faultyDB(t)
	ctx := testContext(t, 30*time.Second)
	key := newKey(t)
	opts := &idempotency.ClaimOptions{Scope: "go.poller.fault", Wait: 20 * time.Second}
	first, err := idempotency.Claim(ctx, openDB(t), key, nil, opts)
	holder, ok := first.(*idempotency.Claimed)
	if err != nil || !ok {
		t.Fatalf("first claim: %v %v", first, err)
	}
	const n = 10
	var arrived, answered, completed atomic.Int64
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			arrived.Add(1)
			res, err := idempotency.Claim(ctx, db, key, nil, opts)
			answered.Add(1)
			if _, ok := res.(*idempotency.Completed); ok && err == nil {
				completed.Add(1)
			} else {
				t.Errorf("a waiting claim got %T %v", res, err)
			}
		}()
	}
	eventually(t, 20*time.Second, "all claims arrived", func() bool { return arrived.Load() == n })
	base := claims.Load()
	eventually(t, 20*time.Second, "two polls", func() bool { return claims.Load() >= base+2 })
	fail.Store(1)
	eventually(t, 20*time.Second, "a failed poll", func() bool { return fail.Load() == 0 })
	base = claims.Load()
	eventually(t, 20*time.Second, "a poll after it", func() bool { return claims.Load() >= base+1 })
	if got := answered.Load(); got != 0 {
		t.Fatalf("%d of %d waiting claims answered after a failed poll", got, n)
	}
	if err := holder.Complete(ctx, map[string]string{"done": "yes"}); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if completed.Load() != n {
		t.Fatalf("%d of %d waiting claims got the result", completed.Load(), n)
	}
}

// burst sends n identical requests at once and returns the answers.
func burst(t *testing.T, url, key, body string, n int) []answer {
	answers := make([]answer, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			answers[i] = post(t, url, key, body)
		}(i)
	}
	wg.Wait()
	return answers
}
