package idempotency_test

import (
	"bytes"
	"database/sql"
	"errors"
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

// The database errors the middleware answers with a 500 reach OnError,
// naming the key and what failed, with the driver's error still inside;
// a hook that panics changes no answer. Each case answered the same 500
// before, and told nobody why.
func TestMiddlewareReportsDatabaseErrors(t *testing.T) {
	db, admin := openDB(t), adminDB(t)
	const scope = "go.on-error"
	var mu sync.Mutex
	var heard []error
	onError := func(err error) {
		mu.Lock()
		heard = append(heard, err)
		mu.Unlock()
		panic("the hook broke")
	}
	// request posts with a new key through a middleware of opts and
	// returns the answer and what OnError heard.
	request := func(opts idempotency.MiddlewareOptions, handler http.HandlerFunc) (string, answer, []error) {
		opts.Scope, opts.OnError = scope, onError
		server := httptest.NewServer(idempotency.Middleware(db, &opts)(handler))
		defer server.Close()
		key := newKey(t)
		a := post(t, server.URL, key, `{}`)
		mu.Lock()
		defer mu.Unlock()
		got := heard
		heard = nil
		return key, a, got
	}
	check := func(what, key string, a answer, got []error, detail string, is func(error) bool) {
		t.Helper()
		if a.status != http.StatusInternalServerError || !bytes.Contains(a.body, []byte(detail)) {
			t.Errorf("%s: %d %s, want 500 %q", what, a.status, a.body, detail)
		}
		if len(got) != 1 || !strings.Contains(got[0].Error(), key) || !is(got[0]) {
			t.Errorf("%s: OnError heard %v, want one error naming %s", what, got, key)
			return
		}
		t.Logf("%s: %v", what, got[0])
	}

	// Claim mode: the key's row is gone when the response is recorded.
	key, a, got := request(idempotency.MiddlewareOptions{}, func(w http.ResponseWriter, r *http.Request) {
		if _, err := admin.Exec(`DELETE FROM idempotency.idempotency_keys WHERE scope = $1 AND key = $2`,
			scope, idempotency.ClaimOf(r.Context()).Key); err != nil {
			t.Error(err)
		}
		w.WriteHeader(http.StatusCreated)
	})
	check("a record that failed", key, a, got, "could not be recorded",
		func(err error) bool { return errors.Is(err, idempotency.ErrNotFound) })

	// Transaction mode: a statement of the handler failed on TxOf, so the
	// transaction cannot record the response.
	key, a, got = request(idempotency.MiddlewareOptions{Mode: idempotency.ModeTransaction},
		func(w http.ResponseWriter, r *http.Request) {
			idempotency.TxOf(r.Context()).ExecContext(r.Context(), `SELECT 1/0`) //nolint:errcheck
			w.WriteHeader(http.StatusCreated)
		})
	check("a transaction that failed", key, a, got, "could not be recorded",
		func(err error) bool { return idempotency.SQLState(err) == "25P02" })

	// A lease over the server's idempotency.max_lease (1 day): the claim
	// is refused and holds nothing.
	var ran atomic.Bool
	key, a, got = request(idempotency.MiddlewareOptions{Lease: 48 * time.Hour},
		func(w http.ResponseWriter, r *http.Request) { ran.Store(true) })
	check("a claim refused", key, a, got, "could not be claimed",
		func(err error) bool { return idempotency.SQLState(err) == "22023" })
	var status sql.NullString
	if err := db.QueryRow(`SELECT status::text FROM idempotency.idem_get($1, $2)`, key, scope).Scan(&status); err != nil ||
		status.Valid || ran.Load() {
		t.Errorf("a claim refused: the key is %q (%v), the handler ran: %v", status.String, err, ran.Load())
	}
}

// A heartbeat that fails while the database is away (every connection cut
// and refused for 1.5 s) reaches OnError too; the lease outlives it, and
// the response, recorded once the database is back, is the handler's.
func TestMiddlewareReportsFailedHeartbeats(t *testing.T) {
	proxy := newCutProxy(t)
	var mu sync.Mutex
	var heard []error
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proxy.cutFor(1500 * time.Millisecond)
		time.Sleep(2 * time.Second) // a beat after 1 s fails, the one after 2 s goes through
		w.WriteHeader(http.StatusCreated)
	})
	server := httptest.NewServer(idempotency.Middleware(proxy.db(t), &idempotency.MiddlewareOptions{
		Scope: "go.on-error", Lease: 3 * time.Second,
		OnError: func(err error) {
			mu.Lock()
			defer mu.Unlock()
			heard = append(heard, err)
		}})(handler))
	defer server.Close()
	key := newKey(t)
	a := post(t, server.URL, key, `{}`)
	mu.Lock()
	defer mu.Unlock()
	if a.status != http.StatusCreated || len(heard) == 0 {
		t.Fatalf("%d %s; OnError heard %v", a.status, a.body, heard)
	}
	for _, err := range heard {
		if !strings.Contains(err.Error(), "key "+strconv.Quote(key)) || !strings.Contains(err.Error(), "renewing the lease") {
			t.Fatalf("OnError heard %v, want failed heartbeats of %s", heard, key)
		}
	}
	t.Logf("OnError heard %d error(s), the first: %v", len(heard), heard[0])
}
