package idempotency_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
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

// A Node and a Go service behind the same scope answer one key with the
// same stored response, whichever answered it first.
func TestNodeAndGoShareKeys(t *testing.T) {
	node := startNodeService(t)
	db := openDB(t)
	var runs atomic.Int64
	goHandler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		w.Header().Set("Location", "/orders/go")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"by":"go"}`)) //nolint:errcheck
	})
	mux := http.NewServeMux()
	mux.Handle("/orders", idempotency.Middleware(db, &idempotency.MiddlewareOptions{Scope: "go.shared"})(goHandler))
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
	nodeFirst := newKey(t)
	first := post(t, node+"/orders", nodeFirst, body)
	if first.status != http.StatusCreated || !bytes.Contains(first.body, []byte(`"by":"node"`)) {
		t.Fatalf("node: %d %s", first.status, first.body)
	}
	same(first, post(t, goService.URL+"/orders", nodeFirst, `{"qty":1,"item":"tea"}`), "Go replaying Node's response")
	if runs.Load() != 0 {
		t.Fatal("the Go handler ran for a key Node answered")
	}

	goFirst := newKey(t)
	first = post(t, goService.URL+"/orders", goFirst, body)
	if first.status != http.StatusCreated || string(first.body) != `{"by":"go"}` {
		t.Fatalf("go: %d %s", first.status, first.body)
	}
	same(first, post(t, node+"/orders", goFirst, body), "Node replaying Go's response")
	if other := post(t, node+"/orders", goFirst, `{"item": "coffee"}`); other.status != http.StatusUnprocessableEntity {
		t.Fatalf("Node with another body for Go's key: %d", other.status)
	}
}
