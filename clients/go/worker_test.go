package idempotency_test

import (
	"bufio"
	"database/sql"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	idempotency "github.com/idempotency/idempotency/clients/go"
)

var (
	buildWorker sync.Once
	workerPath  string
	workerErr   error
)

// testWorker builds internal/testworker once per test run.
func testWorker(t *testing.T) string {
	t.Helper()
	buildWorker.Do(func() {
		dir, err := os.MkdirTemp("", "idempotency-go-worker")
		if err != nil {
			workerErr = err
			return
		}
		workerPath = filepath.Join(dir, "testworker")
		out, err := exec.Command("go", "build", "-o", workerPath, "./internal/testworker").CombinedOutput()
		if err != nil {
			workerErr = errors.New(string(out))
		}
	})
	if workerErr != nil {
		t.Fatalf("building the test worker: %v", workerErr)
	}
	return workerPath
}

// worker is a running testworker process.
type worker struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan map[string]any
}

func startWorker(t *testing.T, env ...string) *worker {
	t.Helper()
	cmd := exec.Command(testWorker(t))
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &worker{cmd: cmd, stdin: stdin, lines: make(chan map[string]any, 10)}
	go func() {
		scanner := bufio.NewScanner(stdout)
		for scanner.Scan() {
			var line map[string]any
			if json.Unmarshal(scanner.Bytes(), &line) == nil {
				w.lines <- line
			}
		}
		close(w.lines)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill() //nolint:errcheck // it may have exited
		cmd.Wait()         //nolint:errcheck
	})
	return w
}

// next is the worker's next line, within a deadline.
func (w *worker) next(t *testing.T, limit time.Duration) map[string]any {
	t.Helper()
	select {
	case line, ok := <-w.lines:
		if !ok {
			t.Fatal("the worker exited without a line")
		}
		return line
	case <-time.After(limit):
		t.Fatalf("no line from the worker within %v", limit)
	}
	return nil
}

func effects(t *testing.T, db *sql.DB, key string) []string {
	rows, err := db.Query(`SELECT worker FROM go_effects WHERE key = $1 ORDER BY worker`, key)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var w string
		rows.Scan(&w)
		out = append(out, w)
	}
	return out
}

// A worker process killed with SIGKILL mid-job: a second process takes the
// key over once the lease has ended (attempt 2) and completes it; the first
// one's token, used late, gets ErrFenced.
func TestKilledWorkerIsTakenOver(t *testing.T) {
	db := openDB(t)
	ctx := testContext(t, 60*time.Second)
	mustExec(t, db, `CREATE TABLE IF NOT EXISTS go_effects (key text, worker text)`)
	key := newKey(t)
	first := startWorker(t, "KEY="+key, "NAME=first", "LEASE=1s")
	claimed := first.next(t, 20*time.Second)
	token := int64(claimed["claimed"].(float64))
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	first.cmd.Wait() //nolint:errcheck // killed
	if status, _ := keyStatus(t, db, key, "default"); status != "PROCESSING" {
		t.Fatalf("the killed worker's key is %s", status)
	}

	second := startWorker(t, "KEY="+key, "NAME=second", "LEASE=1s", "WAIT=20s", "FINISH=now")
	if took := second.next(t, 30*time.Second); took["attempt"].(float64) != 2 || int64(took["claimed"].(float64)) <= token {
		t.Fatalf("takeover: %v (first token %d)", took, token)
	}
	if end := second.next(t, 20*time.Second); end["outcome"] != "completed" {
		t.Fatalf("second worker: %v", end)
	}
	late := idempotency.Resume(db, key, token, &idempotency.ClaimOptions{Lease: time.Second})
	if err := late.Complete(ctx, map[string]string{"worker": "first"}); !errors.Is(err, idempotency.ErrFenced) {
		t.Fatalf("the first worker's late complete: %v", err)
	}
	if got := effects(t, db, key); len(got) != 1 || got[0] != "second" {
		t.Fatalf("effects %v", got)
	}
}

// A worker process paused (SIGSTOP) past its lease: a second takes over and
// completes; the first, resumed, finds itself fenced and its write rolls back.
func TestPausedWorkerIsFenced(t *testing.T) {
	db := openDB(t)
	mustExec(t, db, `CREATE TABLE IF NOT EXISTS go_effects (key text, worker text)`)
	key := newKey(t)
	first := startWorker(t, "KEY="+key, "NAME=first", "LEASE=1s")
	first.next(t, 20*time.Second)
	if err := first.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	second := startWorker(t, "KEY="+key, "NAME=second", "LEASE=1s", "WAIT=20s", "FINISH=now")
	second.next(t, 30*time.Second)
	if end := second.next(t, 20*time.Second); end["outcome"] != "completed" {
		t.Fatalf("second worker: %v", end)
	}
	if err := first.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	io.WriteString(first.stdin, "finish\n") //nolint:errcheck
	if end := first.next(t, 20*time.Second); end["outcome"] != "fenced" {
		t.Fatalf("the resumed worker: %v", end)
	}
	if got := effects(t, db, key); len(got) != 1 || got[0] != "second" {
		t.Fatalf("effects %v", got)
	}
}

func TestMain(m *testing.M) {
	code := m.Run()
	if workerPath != "" {
		os.RemoveAll(filepath.Dir(workerPath))
	}
	os.Exit(code)
}
