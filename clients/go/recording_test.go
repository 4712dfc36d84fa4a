package idempotency_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	idempotency "github.com/idempotency/idempotency/clients/go"
)

// Work that panics stops its heartbeat and fails the key retryably before
// the panic goes on: the key is not held until the caller's context ends.
func TestRunWorkThatPanicsFailsTheKey(t *testing.T) {
	db := openDB(t)
	ctx := testContext(t, 30*time.Second)
	key := newKey(t)
	opts := &idempotency.ClaimOptions{Scope: "go.run-panic", Lease: time.Second}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the panic did not reach the caller")
			}
		}()
		idempotency.Run(ctx, db, key, nil, opts, func(context.Context, *idempotency.Claimed) (any, error) { //nolint:errcheck
			panic("the work broke")
		})
	}()
	if status, _ := keyStatus(t, db, key, "go.run-panic"); status != "FAILED_RETRYABLE" {
		t.Fatalf("after the panic the key is %s, not FAILED_RETRYABLE", status)
	}
}

// A client that goes away while its response is being recorded does not
// cut the record short: the key is completed once the record can go on,
// instead of staying held until its lease ends and running again.
func TestMiddlewareRecordsAfterTheClientLeft(t *testing.T) {
	db := openDB(t)
	admin := adminDB(t)
	const scope = "go.record-leaves"
	key := newKey(t)
	running := make(chan struct{})
	carryOn := make(chan struct{})
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(running)
		<-carryOn
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"order":1}`)) //nolint:errcheck
	})
	server := httptest.NewServer(idempotency.Middleware(db, &idempotency.MiddlewareOptions{Scope: scope})(handler))
	defer server.Close()

	clientCtx, leave := context.WithCancel(context.Background())
	defer leave()
	req, _ := http.NewRequestWithContext(clientCtx, http.MethodPost, server.URL, strings.NewReader(`{}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	go func() {
		if res, err := http.DefaultClient.Do(req); err == nil {
			res.Body.Close()
		}
	}()
	<-running
	// The key's row is held, so that the record waits for it.
	lock, err := admin.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Rollback() //nolint:errcheck
	if _, err := lock.Exec(`SELECT FROM idempotency.idempotency_keys WHERE scope = $1 AND key = $2 FOR UPDATE`,
		scope, key); err != nil {
		t.Fatal(err)
	}
	close(carryOn)
	recording := func() bool {
		var waiting bool
		err := admin.QueryRow(`SELECT count(*) > 0 FROM pg_stat_activity
		                        WHERE wait_event_type = 'Lock' AND query LIKE '%idem_complete%'`).Scan(&waiting)
		return err == nil && waiting
	}
	eventually(t, 10*time.Second, "the record waits for the key's row", recording)
	leave()
	// A record that the client's leaving cancelled stops waiting at once;
	// one that goes on keeps waiting for the row.
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline) && recording(); {
		time.Sleep(20 * time.Millisecond)
	}
	if err := lock.Commit(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the key is completed", func() bool {
		status, _ := keyStatus(t, db, key, scope)
		return status == "COMPLETED"
	})
}

// A response larger than the server stores (idempotency.max_value_bytes,
// 1 MB by default) fails its key for good: the handler runs once, and this
// request and every retry get the failure, instead of the key staying held
// and the handler running again at each lease's end.
func TestMiddlewareResponseTooLargeToStore(t *testing.T) {
	db := openDB(t)
	const scope = "go.too-large"
	var runs atomic.Int64
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Content-Type", "text/plain")
		w.Write(bytes.Repeat([]byte("x"), 1200000)) //nolint:errcheck
	})
	server := httptest.NewServer(idempotency.Middleware(db, &idempotency.MiddlewareOptions{Scope: scope})(handler))
	defer server.Close()

	key := newKey(t)
	first := post(t, server.URL, key, `{}`)
	if status, _ := keyStatus(t, db, key, scope); status != "FAILED_FINAL" {
		t.Fatalf("after the first request the key is %s, not FAILED_FINAL", status)
	}
	retry := post(t, server.URL, key, `{}`)
	if first.status != 500 || !bytes.Contains(first.body, []byte("larger than the server stores")) ||
		retry.status != 500 || !bytes.Equal(retry.body, first.body) ||
		retry.header.Get("Idempotent-Replayed") != "true" || runs.Load() != 1 {
		t.Fatalf("first %d %s, retry %d %s (replayed %q); %d runs", first.status, first.body,
			retry.status, retry.body, retry.header.Get("Idempotent-Replayed"), runs.Load())
	}
}

// A body that holds a NUL byte (which jsonb cannot hold as text) is stored
// in base64, in the format the three clients share ({"encoding":
// "base64"}), and replayed byte for byte, in claim and transaction modes.
func TestMiddlewareBodyHoldingANUL(t *testing.T) {
	db := openDB(t)
	body := []byte("a\x00b")
	for _, mode := range []idempotency.Mode{idempotency.ModeClaim, idempotency.ModeTransaction} {
		scope := "go.nul-body." + string(mode)
		server, runs := modeServer(t, db, &idempotency.MiddlewareOptions{Scope: scope, Mode: mode},
			func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/plain")
				w.Write(body) //nolint:errcheck
			})
		key := newKey(t)
		first := post(t, server.URL, key, `{}`)
		replay := post(t, server.URL, key, `{}`)
		if first.status != http.StatusOK || !bytes.Equal(first.body, body) || replay.status != http.StatusOK ||
			!bytes.Equal(replay.body, body) || replay.header.Get("Idempotent-Replayed") != "true" || runs(key) != 1 {
			t.Fatalf("%s mode: first %d %q, replay %d %q, %d runs", mode, first.status, first.body,
				replay.status, replay.body, runs(key))
		}
		var encoding, stored string
		if err := db.QueryRow(`SELECT result->>'encoding', result->>'body' FROM idempotency.idem_get($1, $2)`,
			key, scope).Scan(&encoding, &stored); err != nil || encoding != "base64" || stored != "YQBi" {
			t.Fatalf("%s mode: stored %q %q %v", mode, encoding, stored, err)
		}
	}
}

// A header value that holds a NUL byte is recorded, sent and replayed
// with a space in its place (as RFC 9110 lets a recipient do), and a
// header whose name holds one is dropped (net/http drops a name that is
// no token): jsonb cannot hold U+0000, and the response was answered with
// a 500 while its key stayed held until its lease ended, so that the
// handler ran again.
func TestMiddlewareHeaderHoldingANUL(t *testing.T) {
	db := openDB(t)
	for _, mode := range []idempotency.Mode{idempotency.ModeClaim, idempotency.ModeTransaction} {
		scope := "go.nul-header." + string(mode)
		server, runs := modeServer(t, db, &idempotency.MiddlewareOptions{Scope: scope, Mode: mode},
			func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-Note", "a\x00b")
				w.Header()["X-\x00"] = []string{"c"}
				w.WriteHeader(http.StatusCreated)
			})
		key := newKey(t)
		first := post(t, server.URL, key, `{}`)
		if status, _ := keyStatus(t, db, key, scope); status != "COMPLETED" {
			t.Fatalf("%s mode: the first answer %d %s left the key %s", mode, first.status, first.body, status)
		}
		replay := post(t, server.URL, key, `{}`)
		if first.status != http.StatusCreated || first.header.Get("X-Note") != "a b" ||
			replay.status != http.StatusCreated || replay.header.Get("X-Note") != "a b" || runs(key) != 1 {
			t.Fatalf("%s mode: first %d %v, replay %d %v, %d runs", mode, first.status, first.header,
				replay.status, replay.header, runs(key))
		}
	}
}
