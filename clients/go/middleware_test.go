package idempotency_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idempotency "github.com/idempotency/idempotency/clients/go"
)

type answer struct {
	status int
	header http.Header
	body   []byte
}

func post(t *testing.T, url, key, body string) answer {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return answer{}
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		t.Error(err)
	}
	return answer{res.StatusCode, res.Header, data}
}

// orders is a handler that counts its runs and answers 201 with a body
// that differs per run, so that a replay is told from a second run.
func orders(runs *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := runs.Add(1)
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", fmt.Sprintf("/orders/%d", n))
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%d,"request":%s,"at":%q}`, n, body, time.Now().Format(time.RFC3339Nano))
	})
}

func TestMiddlewareReplayMismatchAndMissingKey(t *testing.T) {
	db := openDB(t)
	var runs atomic.Int64
	server := httptest.NewServer(idempotency.Middleware(db, &idempotency.MiddlewareOptions{Scope: "go.orders"})(orders(&runs)))
	defer server.Close()
	key := newKey(t)

	first := post(t, server.URL+"/orders", key, `{"item": "tea", "qty": 2}`)
	if first.status != http.StatusCreated || first.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first: %d %v", first.status, first.header)
	}
	// The same document encoded otherwise is the same request.
	again := post(t, server.URL+"/orders", key, `{"qty":2,"item":"tea"}`)
	if again.status != http.StatusCreated || !bytes.Equal(again.body, first.body) ||
		again.header.Get("Location") != first.header.Get("Location") ||
		again.header.Get("Content-Type") != first.header.Get("Content-Type") ||
		again.header.Get("Idempotent-Replayed") != "true" || runs.Load() != 1 {
		t.Fatalf("replay: %d %v %s (first %s), %d runs", again.status, again.header, again.body, first.body, runs.Load())
	}
	other := post(t, server.URL+"/orders", key, `{"item": "coffee"}`)
	if other.status != http.StatusUnprocessableEntity || runs.Load() != 1 ||
		other.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("another body with the key: %d %s", other.status, other.body)
	}
	missing := post(t, server.URL+"/orders", "", `{"item": "tea"}`)
	if missing.status != http.StatusBadRequest || runs.Load() != 1 {
		t.Fatalf("no key: %d %s", missing.status, missing.body)
	}
	long := post(t, server.URL+"/orders", strings.Repeat("k", 256), `{}`)
	if long.status != http.StatusBadRequest || runs.Load() != 1 {
		t.Fatalf("a 256-byte key: %d", long.status)
	}
	res, err := http.Get(server.URL + "/orders") // GET is not covered: it passes
	if err != nil || res.StatusCode != http.StatusCreated || runs.Load() != 2 {
		t.Fatalf("GET: %v %v", res, err)
	}
	res.Body.Close()
}

// 100 identical requests at once: the handler runs once. It answers only
// once the 99 others have had their 409, so every one of them met the key
// in progress.
func TestMiddlewareConcurrentDuplicatesRunOnce(t *testing.T) {
	db := openDB(t)
	var runs, conflicts atomic.Int64
	release := make(chan struct{})
	gate := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-time.After(20 * time.Second):
		}
		orders(&runs).ServeHTTP(w, r)
	})
	server := httptest.NewServer(idempotency.Middleware(db, &idempotency.MiddlewareOptions{Scope: "go.burst"})(gate))
	defer server.Close()
	http.DefaultTransport.(*http.Transport).MaxIdleConnsPerHost = 100
	key := newKey(t)

	const n = 100
	answers := make([]answer, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			answers[i] = post(t, server.URL+"/orders", key, `{"item": "tea"}`)
			if answers[i].status == http.StatusConflict && conflicts.Add(1) == n-1 {
				close(release)
			}
		}(i)
	}
	wg.Wait()
	created := 0
	for _, a := range answers {
		switch a.status {
		case http.StatusCreated:
			created++
		case http.StatusConflict:
			if a.header.Get("Retry-After") == "" {
				t.Fatalf("409 without Retry-After: %v", a.header)
			}
		default:
			t.Fatalf("unexpected answer %d %s", a.status, a.body)
		}
	}
	if runs.Load() != 1 || created != 1 || conflicts.Load() != n-1 {
		t.Fatalf("%d runs, %d created, %d conflicts", runs.Load(), created, conflicts.Load())
	}
}

// With Wait, the duplicates wait for the running one and get its response.
func TestMiddlewareWaitingDuplicatesGetTheReplay(t *testing.T) {
	db := openDB(t)
	var runs atomic.Int64
	slow := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(300 * time.Millisecond)
		orders(&runs).ServeHTTP(w, r)
	})
	opts := &idempotency.MiddlewareOptions{Scope: "go.wait", Wait: 20 * time.Second}
	server := httptest.NewServer(idempotency.Middleware(db, opts)(slow))
	defer server.Close()
	key := newKey(t)
	const n = 100
	answers := make([]answer, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			answers[i] = post(t, server.URL+"/orders", key, `{"item": "tea"}`)
		}(i)
	}
	wg.Wait()
	replayed := 0
	for _, a := range answers {
		if a.status != http.StatusCreated || !bytes.Equal(a.body, answers[0].body) {
			t.Fatalf("answer %d %s, want 201 %s", a.status, a.body, answers[0].body)
		}
		if a.header.Get("Idempotent-Replayed") == "true" {
			replayed++
		}
	}
	if runs.Load() != 1 || replayed != n-1 {
		t.Fatalf("%d runs, %d replayed", runs.Load(), replayed)
	}
}

// 4xx other than 408/425/429 is final and replayed; 5xx is retryable: the
// next request runs the handler again.
// A key that is not UTF-8 is the client's error (400), not the server's.
func TestMiddlewareKeyNotUTF8(t *testing.T) {
	db := openDB(t)
	var runs atomic.Int64
	server := httptest.NewServer(idempotency.Middleware(db, &idempotency.MiddlewareOptions{Scope: "go.utf8"})(orders(&runs)))
	defer server.Close()
	if a := post(t, server.URL, "caf\xe9-"+newKey(t), `{}`); a.status != 400 || runs.Load() != 0 {
		t.Fatalf("a key that is not UTF-8: %d %s; %d runs", a.status, a.body, runs.Load())
	}
}

func TestMiddlewareFailures(t *testing.T) {
	db := openDB(t)
	var runs atomic.Int64
	status := http.StatusServiceUnavailable
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(status)
		fmt.Fprintf(w, "run %d", runs.Load())
	})
	server := httptest.NewServer(idempotency.Middleware(db, &idempotency.MiddlewareOptions{Scope: "go.failures"})(handler))
	defer server.Close()

	key := newKey(t)
	if a := post(t, server.URL, key, `{}`); a.status != 503 {
		t.Fatalf("first: %d", a.status)
	}
	status = http.StatusNotFound
	first := post(t, server.URL, key, `{}`)
	replay := post(t, server.URL, key, `{}`)
	if first.status != 404 || runs.Load() != 2 || replay.status != 404 || !bytes.Equal(replay.body, first.body) ||
		replay.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("after a 503: %d %s, then %d %s; %d runs", first.status, first.body, replay.status, replay.body, runs.Load())
	}
}

// A duplicate after the stored response expired (only the key's tombstone
// is left): 410 with a problem document naming the key; the handler does
// not run again, and another body is still a mismatch.
func TestMiddlewareAnswers410OnceTheResponseExpired(t *testing.T) {
	db, admin := openDB(t), adminDB(t)
	var runs atomic.Int64
	var replays []idempotency.Event
	var mu sync.Mutex
	server := httptest.NewServer(idempotency.Middleware(db, &idempotency.MiddlewareOptions{
		Scope: "go.expired",
		OnReplay: func(e idempotency.Event) {
			mu.Lock()
			defer mu.Unlock()
			replays = append(replays, e)
		},
	})(orders(&runs)))
	defer server.Close()
	key := newKey(t)

	if first := post(t, server.URL+"/orders", key, `{"item": "tea"}`); first.status != http.StatusCreated {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	expireResult(t, admin, key, "go.expired")
	late := post(t, server.URL+"/orders", key, `{"item": "tea"}`)
	var doc struct {
		Status         int    `json:"status"`
		Detail         string `json:"detail"`
		IdempotencyKey string `json:"idempotency_key"`
	}
	if late.status != http.StatusGone || late.header.Get("Content-Type") != "application/problem+json" ||
		json.Unmarshal(late.body, &doc) != nil || doc.Status != http.StatusGone || doc.IdempotencyKey != key ||
		!strings.Contains(doc.Detail, strconv.Quote(key)) || runs.Load() != 1 {
		t.Fatalf("late duplicate: %d %v %s, %d runs", late.status, late.header, late.body, runs.Load())
	}
	if other := post(t, server.URL+"/orders", key, `{"item": "coffee"}`); other.status != http.StatusUnprocessableEntity {
		t.Fatalf("another body: %d %s", other.status, other.body)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(replays) != 1 || !replays[0].ResultExpired || replays[0].Status != http.StatusGone {
		t.Fatalf("OnReplay: %#v", replays)
	}
}

// The middleware's heartbeats go through MiddlewareOptions.Heartbeats: a
// handler that holds every connection of its pool for 2.5 leases still
// holds a live lease. Through the pool, its beats wait behind it and the
// lease ends.
func TestMiddlewareHeartbeatsThroughAPoolOfTheirOwn(t *testing.T) {
	small := openDB(t)
	small.SetMaxOpenConns(2)
	admin := adminDB(t)
	var runs atomic.Int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		for i := 0; i < 2; i++ {
			held, err := small.Conn(r.Context())
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			defer held.Close()
		}
		time.Sleep(2500 * time.Millisecond)
		var live bool
		err := admin.QueryRowContext(r.Context(), `SELECT coalesce(lease_until > now(), false)
		  FROM idempotency.idempotency_keys WHERE scope = 'go.beats' AND key = $1`,
			idempotency.ClaimOf(r.Context()).Key).Scan(&live)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "lease live: %v", live)
	})
	server := httptest.NewServer(idempotency.Middleware(small, &idempotency.MiddlewareOptions{
		Scope: "go.beats", Lease: time.Second, Heartbeats: openDB(t)})(handler))
	defer server.Close()
	got := post(t, server.URL, newKey(t), `{}`)
	if got.status != http.StatusCreated || string(got.body) != "lease live: true" || runs.Load() != 1 {
		t.Fatalf("%d %s (runs %d)", got.status, got.body, runs.Load())
	}
}
