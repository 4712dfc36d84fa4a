package idempotency_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	idempotency "github.com/idempotency/idempotency/clients/go"
)

// startNodeService runs testdata/node-service.mjs (the Node client's
// Express middleware) and returns its URL. NODE_MODULES names a
// node_modules folder with express and pg (test/clients/go.sh installs
// them); without it the test is skipped.
func startNodeService(t *testing.T) string {
	t.Helper()
	modules := os.Getenv("NODE_MODULES")
	if modules == "" {
		t.Skip("NODE_MODULES is not set: no Node service to share keys with")
	}
	src, _ := filepath.Abs("../node/src")
	cmd := exec.Command("node", "testdata/node-service.mjs")
	cmd.Env = append(os.Environ(),
		"NODE_MODULES="+(&url.URL{Scheme: "file", Path: modules + "/"}).String(),
		"CLIENT_SRC="+(&url.URL{Scheme: "file", Path: src + "/"}).String())
	cmd.Stderr = os.Stderr
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill() //nolint:errcheck
		cmd.Wait()         //nolint:errcheck
	})
	ports := make(chan int, 1)
	go func() {
		var line struct{ Port int }
		scanner := bufio.NewScanner(stdout)
		if scanner.Scan() && json.Unmarshal(scanner.Bytes(), &line) == nil {
			ports <- line.Port
		}
		close(ports)
	}()
	select {
	case port, ok := <-ports:
		if !ok {
			t.Fatal("the Node service exited")
		}
		return fmt.Sprintf("http://127.0.0.1:%d", port)
	case <-time.After(30 * time.Second):
		t.Fatal("the Node service did not start")
	}
	return ""
}

// A Node and a Go service behind the same scope and mode answer one key
// with the same stored response, whichever answered it first. Each mode
// runs against the Node client's Express middleware in that mode.
func TestNodeAndGoShareKeys(t *testing.T) {
	node := startNodeService(t)
	db := openDB(t)
	mustExec(t, db, `CREATE TABLE IF NOT EXISTS go_shared_effects (key text, by text)`)
	var runs atomic.Int64
	created := func(write func(r *http.Request) error) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			runs.Add(1)
			if err := write(r); err != nil {
				t.Error(err)
			}
			w.Header().Set("Content-Type", "application/json; charset=utf-8")
			w.Header().Set("Location", "/orders/go")
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte(`{"by":"go"}`)) //nolint:errcheck
		}
	}
	noWrite := func(*http.Request) error { return nil }
	writeEffect := func(r *http.Request) error {
		_, err := idempotency.TxOf(r.Context()).ExecContext(r.Context(),
			`INSERT INTO go_shared_effects VALUES ($1, 'go')`, r.Header.Get("Idempotency-Key"))
		return err
	}
	register := func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		key := r.Header.Get("Idempotency-Key")
		job := map[string]any{"key": key, "request": idempotency.RequestOf(r.Context())}
		if _, err := idempotency.Enqueue(r.Context(), idempotency.TxOf(r.Context()), "go.shared.jobs", job,
			&idempotency.EnqueueOptions{DedupKey: key}); err != nil {
			t.Error(err)
		}
		w.WriteHeader(http.StatusAccepted)
	}
	mux := http.NewServeMux()
	mux.Handle("/orders", idempotency.Middleware(db, &idempotency.MiddlewareOptions{Scope: "go.shared"})(created(noWrite)))
	mux.Handle("/tx", idempotency.Middleware(db, &idempotency.MiddlewareOptions{Scope: "go.shared.tx",
		Mode: idempotency.ModeTransaction})(created(writeEffect)))
	mux.Handle("/jobs", idempotency.Middleware(db, &idempotency.MiddlewareOptions{Scope: "go.shared.jobs",
		Mode: idempotency.ModeRegister})(http.HandlerFunc(register)))
	goService := httptest.NewServer(mux)
	defer goService.Close()
	body := `{"item": "tea", "qty": 1}`

	same := func(first, replay answer, what string) {
		t.Helper()
		if replay.status != first.status || !bytes.Equal(replay.body, first.body) ||
			replay.header.Get("Location") != first.header.Get("Location") ||
			replay.header.Get("Content-Type") != first.header.Get("Content-Type") ||
			replay.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("%s: %d %v %s, first %d %v %s", what, replay.status, replay.header, replay.body,
				first.status, first.header, first.body)
		}
	}
	writtenBy := func(key string) string {
		var by []string
		rows, err := db.Query(`SELECT by FROM go_shared_effects WHERE key = $1`, key)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var b string
			rows.Scan(&b) //nolint:errcheck
			by = append(by, b)
		}
		return strings.Join(by, ",")
	}

	for _, path := range []string{"/orders", "/tx"} {
		t.Run(path+" Node first", func(t *testing.T) {
			key, before := newKey(t), runs.Load()
			first := post(t, node+path, key, body)
			if first.status != http.StatusCreated || !bytes.Contains(first.body, []byte(`"by":"node"`)) {
				t.Fatalf("node: %d %s", first.status, first.body)
			}
			same(first, post(t, goService.URL+path, key, `{"qty":1,"item":"tea"}`), "Go replaying Node's response")
			if runs.Load() != before {
				t.Fatal("the Go handler ran for a key Node answered")
			}
			if path == "/tx" && writtenBy(key) != "node" {
				t.Fatalf("effects: %q", writtenBy(key))
			}
		})
		t.Run(path+" Go first", func(t *testing.T) {
			key := newKey(t)
			first := post(t, goService.URL+path, key, body)
			if first.status != http.StatusCreated || string(first.body) != `{"by":"go"}` {
				t.Fatalf("go: %d %s", first.status, first.body)
			}
			same(first, post(t, node+path, key, body), "Node replaying Go's response")
			if other := post(t, node+path, key, `{"item": "coffee"}`); other.status != http.StatusUnprocessableEntity {
				t.Fatalf("Node with another body for Go's key: %d", other.status)
			}
			if path == "/tx" && writtenBy(key) != "go" {
				t.Fatalf("effects: %q", writtenBy(key))
			}
		})
	}

	// Register mode: one service registers the key and enqueues its job,
	// the other answers 409 until a worker completes it; then both replay
	// the worker's result alike.
	for _, registrar := range []string{"Node", "Go"} {
		t.Run("/jobs "+registrar+" registers", func(t *testing.T) {
			key, before := newKey(t), runs.Load()
			first, other := node, goService.URL
			if registrar == "Go" {
				first, other = other, first
			}
			if a := post(t, first+"/jobs", key, body); a.status != http.StatusAccepted {
				t.Fatalf("%s: %d %s", registrar, a.status, a.body)
			}
			if a := post(t, other+"/jobs", key, `{"qty":1,"item":"tea"}`); a.status != http.StatusConflict || a.header.Get("Retry-After") != "1" {
				t.Fatalf("the other service while queued: %d %v", a.status, a.header)
			}
			jobs := jobsOf(t, db, "go.shared.jobs", key)
			if len(jobs) != 1 {
				t.Fatalf("%d jobs", len(jobs))
			}
			if err := work(t, db, "go.shared.jobs", jobs[0], func(ctx context.Context, job *idempotency.Claimed) (any, error) {
				return map[string]any{"paid": 5, "by": "worker"}, nil
			}); err != nil {
				t.Fatal(err)
			}
			fromNode, fromGo := post(t, node+"/jobs", key, body), post(t, goService.URL+"/jobs", key, body)
			if fromNode.status != http.StatusOK || fromNode.header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("Node after the worker: %d %s", fromNode.status, fromNode.body)
			}
			same(fromNode, fromGo, "Go and Node replaying the worker's result")
			if want := before + map[string]int64{"Node": 0, "Go": 1}[registrar]; runs.Load() != want {
				t.Fatalf("the Go handler ran %d times, want %d", runs.Load()-before, want-before)
			}
		})
	}
}
