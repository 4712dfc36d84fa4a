package idempotency_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idempotency "github.com/idempotency/idempotency/clients/go"
)

// The transaction and register modes of the middleware, against the real
// cluster. Their handlers write on idempotency.TxOf: go_mode_effects
// counts what committed.

func effectsTable(t *testing.T, db *sql.DB) {
	t.Helper()
	mustExec(t, db, `CREATE TABLE IF NOT EXISTS go_mode_effects (key text, note text)`)
}

func modeEffects(t *testing.T, db *sql.DB, key string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM go_mode_effects WHERE key = $1`, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// keyExists: whether the key has a row at all (a rolled-back claim leaves none).
func keyExists(t *testing.T, db *sql.DB, key, scope string) bool {
	t.Helper()
	var status sql.NullString
	if err := db.QueryRow(`SELECT status::text FROM idempotency.idem_get($1, $2)`, key, scope).Scan(&status); err != nil {
		t.Fatal(err)
	}
	return status.Valid
}

// modeServer serves handler under the middleware; its runs are counted per
// key, and the net/http log of a handler's panic is kept out of the output.
func modeServer(t *testing.T, db *sql.DB, opts *idempotency.MiddlewareOptions, handler http.HandlerFunc) (*httptest.Server, func(key string) int64) {
	t.Helper()
	var mu sync.Mutex
	runs := map[string]int64{}
	counted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		runs[r.Header.Get("Idempotency-Key")]++
		mu.Unlock()
		handler(w, r)
	})
	server := httptest.NewUnstartedServer(idempotency.Middleware(db, opts)(counted))
	server.Config.ErrorLog = log.New(io.Discard, "", 0)
	server.Start()
	t.Cleanup(server.Close)
	return server, func(key string) int64 {
		mu.Lock()
		defer mu.Unlock()
		return runs[key]
	}
}

// txHandler writes one effect on the request's transaction, then answers
// as the body asks: {"status": N} (default 201) or {"panic": true}.
func txHandler(t *testing.T) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var ask struct {
			Status int
			Panic  bool
		}
		json.NewDecoder(r.Body).Decode(&ask) //nolint:errcheck // an empty body asks nothing
		key := r.Header.Get("Idempotency-Key")
		tx := idempotency.TxOf(r.Context())
		if tx == nil || idempotency.ClaimOf(r.Context()) == nil {
			t.Error("transaction mode: no transaction or no claim in the handler's context")
			w.WriteHeader(http.StatusTeapot)
			return
		}
		if _, err := tx.ExecContext(r.Context(), `INSERT INTO go_mode_effects VALUES ($1, 'tx')`, key); err != nil {
			t.Error(err)
		}
		if ask.Panic {
			panic("the handler failed after writing")
		}
		if ask.Status == 0 {
			ask.Status = http.StatusCreated
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(ask.Status)
		fmt.Fprintf(w, `{"status":%d,"at":%q}`, ask.Status, time.Now().Format(time.RFC3339Nano))
	}
}

func sameReplay(t *testing.T, first, replay answer, what string) {
	t.Helper()
	if replay.status != first.status || !bytes.Equal(replay.body, first.body) ||
		replay.header.Get("Content-Type") != first.header.Get("Content-Type") ||
		replay.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("%s: %d %v %s, first %d %s", what, replay.status, replay.header, replay.body, first.status, first.body)
	}
}

func TestTransactionModeCommitsWritesWithTheResponse(t *testing.T) {
	db := openDB(t)
	effectsTable(t, db)
	scope := "go.tx"
	replays := make(chan idempotency.Event, 1)
	opts := &idempotency.MiddlewareOptions{Scope: scope, Mode: idempotency.ModeTransaction,
		OnReplay: func(e idempotency.Event) { replays <- e }}
	server, runs := modeServer(t, db, opts, txHandler(t))
	key := newKey(t)
	first := post(t, server.URL, key, `{}`)
	if first.status != http.StatusCreated || first.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	sameReplay(t, first, post(t, server.URL, key, `{}`), "replay")
	if e := <-replays; e.Mode != idempotency.ModeTransaction || e.Key != key || e.Status != http.StatusCreated {
		t.Fatalf("OnReplay heard %+v", e)
	}
	if runs(key) != 1 || modeEffects(t, db, key) != 1 {
		t.Fatalf("%d runs, %d effects", runs(key), modeEffects(t, db, key))
	}
	if status, _ := keyStatus(t, db, key, scope); status != "COMPLETED" {
		t.Fatalf("key %s", status)
	}
}

func TestTransactionModeFailuresRollBackTheWrites(t *testing.T) {
	db := openDB(t)
	effectsTable(t, db)
	scope := "go.tx.fail"
	server, runs := modeServer(t, db, &idempotency.MiddlewareOptions{Scope: scope, Mode: idempotency.ModeTransaction}, txHandler(t))

	// Retryable (5xx): the writes and the claim roll back; the retry runs anew.
	key := newKey(t)
	if a := post(t, server.URL, key, `{"status":503}`); a.status != 503 {
		t.Fatalf("503: %d", a.status)
	}
	if modeEffects(t, db, key) != 0 || keyExists(t, db, key, scope) {
		t.Fatalf("after a 503: %d effects, key left: %v", modeEffects(t, db, key), keyExists(t, db, key, scope))
	}
	if a := post(t, server.URL, key, `{"status":503}`); a.status != 503 || runs(key) != 2 {
		t.Fatalf("the retry: %d, %d runs", a.status, runs(key))
	}

	// Final (4xx): the writes roll back, the response is kept and replayed.
	key = newKey(t)
	first := post(t, server.URL, key, `{"status":402}`)
	sameReplay(t, first, post(t, server.URL, key, `{"status":402}`), "final failure")
	if first.status != 402 || runs(key) != 1 || modeEffects(t, db, key) != 0 {
		t.Fatalf("final: %d, %d runs, %d effects", first.status, runs(key), modeEffects(t, db, key))
	}
	if status, _ := keyStatus(t, db, key, scope); status != "FAILED_FINAL" {
		t.Fatalf("key %s", status)
	}

	// A panic: no response, and nothing committed.
	key = newKey(t)
	req, _ := http.NewRequest(http.MethodPost, server.URL, strings.NewReader(`{"panic":true}`))
	req.Header.Set("Idempotency-Key", key)
	req.GetBody = nil // net/http's client would send it again on the broken connection
	if res, err := http.DefaultClient.Do(req); err == nil {
		res.Body.Close()
		t.Fatalf("a panicking handler answered %d", res.StatusCode)
	}
	if runs(key) != 1 || modeEffects(t, db, key) != 0 || keyExists(t, db, key, scope) {
		t.Fatalf("after a panic: %d runs, %d effects, key left: %v", runs(key), modeEffects(t, db, key), keyExists(t, db, key, scope))
	}
}

// 100 identical requests at once, in transaction mode: the handler runs
// once and commits once; without Wait the others get 409 (the handler is
// held until all of them have been answered), with Wait the replay.
func TestTransactionModeConcurrentDuplicatesRunOnce(t *testing.T) {
	db := openDB(t)
	effectsTable(t, db)
	http.DefaultTransport.(*http.Transport).MaxIdleConnsPerHost = 100
	const n = 100
	for _, wait := range []time.Duration{0, 20 * time.Second} {
		t.Run(fmt.Sprintf("wait %v", wait), func(t *testing.T) {
			var answered atomic.Int64
			release := make(chan struct{})
			held := func(w http.ResponseWriter, r *http.Request) {
				if wait == 0 {
					select { // until the 99 others have their 409
					case <-release:
					case <-time.After(20 * time.Second):
					}
				}
				txHandler(t)(w, r)
			}
			opts := &idempotency.MiddlewareOptions{Scope: "go.tx.burst", Mode: idempotency.ModeTransaction, Wait: wait}
			server, runs := modeServer(t, db, opts, held)
			key := newKey(t)
			answers := make([]answer, n)
			var wg sync.WaitGroup
			for i := 0; i < n; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					answers[i] = post(t, server.URL, key, `{}`)
					if answers[i].status == http.StatusConflict && answered.Add(1) == n-1 {
						close(release)
					}
				}(i)
			}
			wg.Wait()
			var created, replayed, conflicts int
			var body []byte
			for _, a := range answers {
				switch {
				case a.status == http.StatusCreated && a.header.Get("Idempotent-Replayed") == "true":
					replayed++
				case a.status == http.StatusCreated:
					created++
					body = a.body
				case a.status == http.StatusConflict && a.header.Get("Retry-After") != "":
					conflicts++
				default:
					t.Fatalf("unexpected answer %d %v %s", a.status, a.header, a.body)
				}
			}
			for _, a := range answers {
				if a.status == http.StatusCreated && !bytes.Equal(a.body, body) {
					t.Fatalf("a replay differs: %s, first %s", a.body, body)
				}
			}
			if runs(key) != 1 || modeEffects(t, db, key) != 1 || created != 1 {
				t.Fatalf("%d runs, %d effects, %d created", runs(key), modeEffects(t, db, key), created)
			}
			if wait == 0 && conflicts != n-1 || wait > 0 && replayed != n-1 {
				t.Fatalf("wait %v: %d replayed, %d conflicts", wait, replayed, conflicts)
			}
		})
	}
}

// jobsHandler is a register-mode handler: it enqueues the key's job on the
// request's transaction (topic = scope) and answers 202, or 400 / 500
// after enqueueing when the body asks.
func jobsHandler(t *testing.T, scope string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var ask struct{ Status int }
		body, _ := io.ReadAll(r.Body)
		json.Unmarshal(body, &ask) //nolint:errcheck
		key := r.Header.Get("Idempotency-Key")
		tx, request := idempotency.TxOf(r.Context()), idempotency.RequestOf(r.Context())
		if tx == nil || request == nil || idempotency.ClaimOf(r.Context()) != nil {
			t.Error("register mode: the handler's context has no transaction or request, or a claim")
			w.WriteHeader(http.StatusTeapot)
			return
		}
		job := map[string]any{"key": key, "request": request, "body": json.RawMessage(body)}
		if _, err := idempotency.Enqueue(r.Context(), tx, scope, job, &idempotency.EnqueueOptions{DedupKey: key}); err != nil {
			t.Error(err)
		}
		if ask.Status == 0 {
			ask.Status = http.StatusAccepted
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(ask.Status)
		fmt.Fprintf(w, `{"accepted":%q}`, key)
	}
}

type job struct {
	id      int64
	Key     string
	Request json.RawMessage
	Body    json.RawMessage
}

// jobsOf claims the events of topic and returns those of key (the others
// go back).
func jobsOf(t *testing.T, db *sql.DB, topic, key string) []job {
	t.Helper()
	rows, err := db.Query(`SELECT id, payload::text FROM idempotency.outbox_claim('go-test', batch => 1000, topics => ARRAY[$1])`, topic)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var mine []job
	var others []int64
	for rows.Next() {
		var j job
		var payload string
		if err := rows.Scan(&j.id, &payload); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(payload), &j); err != nil {
			t.Fatal(err)
		}
		if j.Key == key {
			mine = append(mine, j)
		} else {
			others = append(others, j.id)
		}
	}
	for _, id := range others {
		mustExec(t, db, `SELECT idempotency.outbox_release(ARRAY[$1::bigint], 'go-test')`, id)
	}
	return mine
}

// work is the worker side of register mode: it claims the job's key with
// the request it was registered with and runs fn.
func work(t *testing.T, db *sql.DB, scope string, j job, fn idempotency.Work) error {
	t.Helper()
	_, err := idempotency.Run(context.Background(), db, j.Key, j.Request, &idempotency.ClaimOptions{Scope: scope}, fn)
	mustExec(t, db, `SELECT idempotency.outbox_ack(ARRAY[$1::bigint])`, j.id)
	return err
}

func TestRegisterModeJobThenTheWorkersResult(t *testing.T) {
	db := openDB(t)
	scope := "go.jobs"
	opts := &idempotency.MiddlewareOptions{Scope: scope, Mode: idempotency.ModeRegister,
		FailedResponse: func(message string) idempotency.Response {
			return idempotency.Response{Status: 402, Header: http.Header{"Content-Type": {"text/plain"}}, Body: []byte(message)}
		}}
	server, runs := modeServer(t, db, opts, jobsHandler(t, scope))

	key := newKey(t)
	if a := post(t, server.URL, key, `{"amount":5}`); a.status != http.StatusAccepted {
		t.Fatalf("first: %d %s", a.status, a.body)
	}
	queued := post(t, server.URL, key, `{"amount":5}`)
	if queued.status != http.StatusConflict || queued.header.Get("Retry-After") != "1" {
		t.Fatalf("while queued: %d %v", queued.status, queued.header)
	}
	if a := post(t, server.URL, key, `{"amount":6}`); a.status != http.StatusUnprocessableEntity {
		t.Fatalf("another body: %d", a.status)
	}
	jobs := jobsOf(t, db, scope, key)
	if len(jobs) != 1 || runs(key) != 1 {
		t.Fatalf("%d jobs, %d runs", len(jobs), runs(key))
	}
	err := work(t, db, scope, jobs[0], func(ctx context.Context, job *idempotency.Claimed) (any, error) {
		return map[string]int{"paid": 5}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	done := post(t, server.URL, key, `{"amount":5}`)
	if done.status != http.StatusOK || string(done.body) != `{"paid":5}` || done.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("after the worker: %d %v %s", done.status, done.header, done.body)
	}
	sameReplay(t, done, post(t, server.URL, key, `{"amount":5}`), "the worker's result again")

	// The worker fails for good: FailedResponse answers, replayed.
	key = newKey(t)
	post(t, server.URL, key, `{"amount":7}`)
	jobs = jobsOf(t, db, scope, key)
	if len(jobs) != 1 {
		t.Fatalf("%d jobs", len(jobs))
	}
	work(t, db, scope, jobs[0], func(ctx context.Context, job *idempotency.Claimed) (any, error) { //nolint:errcheck
		return nil, idempotency.Final(fmt.Errorf("insufficient funds"))
	})
	failed := post(t, server.URL, key, `{"amount":7}`)
	if failed.status != 402 || string(failed.body) != "insufficient funds" || failed.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("after a final failure: %d %s", failed.status, failed.body)
	}
}

func TestRegisterModeRejectedRequestsRegisterNothing(t *testing.T) {
	db := openDB(t)
	scope := "go.jobs.rejected"
	server, runs := modeServer(t, db, &idempotency.MiddlewareOptions{Scope: scope, Mode: idempotency.ModeRegister}, jobsHandler(t, scope))
	for _, status := range []int{400, 503} {
		key := newKey(t)
		if a := post(t, server.URL, key, fmt.Sprintf(`{"status":%d}`, status)); a.status != status {
			t.Fatalf("%d: %d", status, a.status)
		}
		if keyExists(t, db, key, scope) || len(jobsOf(t, db, scope, key)) != 0 {
			t.Fatalf("a %d left the key or its job behind", status)
		}
		// The corrected request is accepted: the key never existed.
		if a := post(t, server.URL, key, `{}`); a.status != http.StatusAccepted || runs(key) != 2 {
			t.Fatalf("after a %d: %d, %d runs", status, a.status, runs(key))
		}
		if len(jobsOf(t, db, scope, key)) != 1 {
			t.Fatal("the accepted request enqueued no job")
		}
	}
}

// 100 identical requests at once in register mode: one 202, one job.
func TestRegisterModeConcurrentDuplicatesRegisterOnce(t *testing.T) {
	db := openDB(t)
	scope := "go.jobs.burst"
	server, runs := modeServer(t, db, &idempotency.MiddlewareOptions{Scope: scope, Mode: idempotency.ModeRegister}, jobsHandler(t, scope))
	http.DefaultTransport.(*http.Transport).MaxIdleConnsPerHost = 100
	key := newKey(t)
	accepted := 0
	for _, a := range burst(t, server.URL, key, `{"amount":1}`, 100) {
		switch a.status {
		case http.StatusAccepted:
			accepted++
		case http.StatusConflict:
		default:
			t.Fatalf("unexpected answer %d %s", a.status, a.body)
		}
	}
	if accepted != 1 || runs(key) != 1 || len(jobsOf(t, db, scope, key)) != 1 {
		t.Fatalf("%d accepted, %d runs", accepted, runs(key))
	}
}
