package idempotency_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	idempotency "github.com/idempotency/idempotency/clients/go"
)

func TestClaimOutcomes(t *testing.T) {
	db := openDB(t)
	ctx := testContext(t, 30*time.Second)
	key := newKey(t)
	request := map[string]any{"amount": 1500}

	first, err := idempotency.Claim(ctx, db, key, request, nil)
	if err != nil {
		t.Fatal(err)
	}
	job, ok := first.(*idempotency.Claimed)
	if !ok || job.Token <= 0 || job.Attempt != 1 {
		t.Fatalf("first claim: %#v", first)
	}
	again, err := idempotency.Claim(ctx, db, key, request, nil)
	if err != nil {
		t.Fatal(err)
	}
	busy, ok := again.(*idempotency.InProgress)
	if !ok || !errors.Is(busy, idempotency.ErrInProgress) {
		t.Fatalf("duplicate while held: %#v", again)
	}
	if err := job.Complete(ctx, map[string]int{"charge": 981}); err != nil {
		t.Fatal(err)
	}
	replay, err := idempotency.Claim(ctx, db, key, request, nil)
	if err != nil {
		t.Fatal(err)
	}
	done, ok := replay.(*idempotency.Completed)
	var result struct{ Charge int }
	if !ok || !done.Replayed || done.Decode(&result) != nil || result.Charge != 981 {
		t.Fatalf("duplicate of finished work: %#v", replay)
	}
	other, err := idempotency.Claim(ctx, db, key, map[string]any{"amount": 9999}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := other.(*idempotency.Mismatch); !ok || !errors.Is(other.(error), idempotency.ErrMismatch) {
		t.Fatalf("another request: %#v", other)
	}
	// A token the key never had is fenced.
	forged := idempotency.Resume(db, key, job.Token+1000, nil)
	if err := forged.Complete(ctx, nil); !errors.Is(err, idempotency.ErrFenced) {
		t.Fatalf("complete with a token the key never had: %v", err)
	}
}

func TestRunRecordsHowTheWorkEnded(t *testing.T) {
	db := openDB(t)
	ctx := testContext(t, 30*time.Second)

	key := newKey(t)
	runs := 0
	work := func(ctx context.Context, job *idempotency.Claimed) (any, error) {
		runs++
		return map[string]string{"sent": job.Key}, nil
	}
	first, err := idempotency.Run(ctx, db, key, nil, nil, work)
	if err != nil || first.Replayed {
		t.Fatalf("first run: %#v %v", first, err)
	}
	second, err := idempotency.Run(ctx, db, key, nil, nil, work)
	if err != nil || !second.Replayed || string(second.Result) != string(first.Result) || runs != 1 {
		t.Fatalf("second run: %#v %v, %d runs", second, err, runs)
	}

	final := newKey(t)
	_, err = idempotency.Run(ctx, db, final, nil, nil, func(context.Context, *idempotency.Claimed) (any, error) {
		return nil, idempotency.Final(errors.New("card declined"))
	})
	var failed *idempotency.Failed
	if !errors.As(err, &failed) || failed.Retryable || failed.Replayed || failed.Message != "card declined" {
		t.Fatalf("final failure: %v", err)
	}
	if status, _ := keyStatus(t, db, final, "default"); status != "FAILED_FINAL" {
		t.Fatalf("final failure left %s", status)
	}
	_, err = idempotency.Run(ctx, db, final, nil, nil, work)
	if !errors.As(err, &failed) || !failed.Replayed || !errors.Is(err, idempotency.ErrFailed) {
		t.Fatalf("a duplicate of the final failure: %v", err)
	}

	retry := newKey(t)
	_, err = idempotency.Run(ctx, db, retry, nil, nil, func(context.Context, *idempotency.Claimed) (any, error) {
		return nil, idempotency.Retry(errors.New("provider timeout"), 0)
	})
	if !errors.As(err, &failed) || !failed.Retryable {
		t.Fatalf("retryable failure: %v", err)
	}
	again, err := idempotency.Run(ctx, db, retry, nil, nil, work)
	if err != nil || again.Replayed {
		t.Fatalf("the retry runs the work again: %#v %v", again, err)
	}
	if _, attempts := keyStatus(t, db, retry, "default"); attempts != 2 {
		t.Fatalf("attempts %d, want 2", attempts)
	}
}

// Work that asks for a retry delay the extension refuses (negative, or
// over 36,000 days) fails its key retryably after the extension's
// backoff: passed on, the delay made idem_fail fail (22023) and the key
// stayed held until its lease ended, so that the work ran again then.
func TestRunRetryDelayOutOfRangeGetsTheBackoff(t *testing.T) {
	db := openDB(t)
	ctx := testContext(t, 30*time.Second)
	for _, d := range []time.Duration{-time.Second, 36001 * 24 * time.Hour} {
		key := newKey(t)
		_, err := idempotency.Run(ctx, db, key, nil, nil, func(context.Context, *idempotency.Claimed) (any, error) {
			return nil, idempotency.Retry(errors.New("provider busy"), d)
		})
		var failed *idempotency.Failed
		if !errors.As(err, &failed) || !failed.Retryable || failed.RetryAfter <= 0 || failed.RetryAfter > time.Minute {
			t.Fatalf("Retry(err, %v): %v", d, err)
		}
		if status, _ := keyStatus(t, db, key, "default"); status != "FAILED_RETRYABLE" {
			t.Fatalf("Retry(err, %v) left the key %s", d, status)
		}
	}
}

// Work whose error's message holds a NUL byte or is not UTF-8 fails its
// key retryably, the message stored with U+FFFD in their place: passed on
// as it was, text PostgreSQL cannot hold made idem_fail fail (22021), and
// the key stayed held until its lease ended, so that the work ran again.
func TestRunErrorMessageHoldingANUL(t *testing.T) {
	db := openDB(t)
	ctx := testContext(t, 30*time.Second)
	for _, message := range []string{"bad\x00byte", "bad\xffbyte"} {
		key := newKey(t)
		_, err := idempotency.Run(ctx, db, key, nil, nil, func(context.Context, *idempotency.Claimed) (any, error) {
			return nil, errors.New(message)
		})
		var failed *idempotency.Failed
		if !errors.As(err, &failed) || !failed.Retryable || failed.Message != "bad\uFFFDbyte" {
			t.Fatalf("an error %q: %v", message, err)
		}
		var stored string
		if err := db.QueryRow(`SELECT last_error FROM idempotency.idem_get($1)`, key).Scan(&stored); err != nil || stored != failed.Message {
			t.Fatalf("an error %q: stored %q %v", message, stored, err)
		}
	}
}

// Work whose value cannot be stored as JSON fails its key for good, at
// once: left held, the key would run its work again once the lease ended,
// to the same end.
func TestRunFailsAResultThatIsNotJSON(t *testing.T) {
	db := openDB(t)
	ctx := testContext(t, 30*time.Second)
	key := newKey(t)
	runs := 0
	work := func(context.Context, *idempotency.Claimed) (any, error) {
		runs++
		return make(chan int), nil
	}
	_, err := idempotency.Run(ctx, db, key, nil, nil, work)
	var failed *idempotency.Failed
	if !errors.As(err, &failed) || failed.Retryable || !strings.Contains(failed.Message, "cannot be stored as JSON") {
		t.Fatalf("a result that is not JSON: %v", err)
	}
	if status, _ := keyStatus(t, db, key, "default"); status != "FAILED_FINAL" {
		t.Fatalf("the key is %s", status)
	}
	if _, err := idempotency.Run(ctx, db, key, nil, nil, work); !errors.As(err, &failed) || !failed.Replayed || runs != 1 {
		t.Fatalf("a duplicate: %v, %d runs", err, runs)
	}
}

// Work whose value holds a string with a NUL character fails its key for
// good, as a value that is not JSON does: jsonb cannot hold U+0000
// (22P05), and the key stayed held until its lease ended, so that the work
// ran again, to the same end. A backslash followed by u0000 is no NUL: it
// is stored.
func TestRunFailsAResultHoldingANUL(t *testing.T) {
	db := openDB(t)
	ctx := testContext(t, 30*time.Second)
	for _, value := range []any{map[string][]string{"names": {"a\x00b"}}, json.RawMessage(`["\u0000"]`)} {
		runFailsForGood(t, ctx, db, value, "NUL")
	}
	notNUL := map[string]string{`\u0000`: `a\u0000b\\`} // backslashes, not NULs
	done, err := idempotency.Run(ctx, db, newKey(t), nil, nil, func(context.Context, *idempotency.Claimed) (any, error) {
		return notNUL, nil
	})
	var back map[string]string
	if err != nil || done.Decode(&back) != nil || !reflect.DeepEqual(back, notNUL) {
		t.Fatalf("a backslash and u0000: %v %v", back, err)
	}
}

// Work whose value is raw JSON ([]byte, json.RawMessage) that is not JSON,
// or not UTF-8, fails its key for good: the server refused it (22P02,
// 22021), and the key stayed held until its lease ended, so that the work
// ran again, to the same end.
func TestRunFailsARawResultThatIsNotJSON(t *testing.T) {
	db := openDB(t)
	ctx := testContext(t, 30*time.Second)
	for _, value := range []any{json.RawMessage(`{"a":`), []byte("not json"), json.RawMessage("\"caf\xe9\"")} {
		runFailsForGood(t, ctx, db, value, "cannot be stored")
	}
}

// runFailsForGood: Run with work that returns value fails its key for good,
// its message saying says, and a duplicate gets that failure without the
// work running again.
func runFailsForGood(t *testing.T, ctx context.Context, db *sql.DB, value any, says string) {
	t.Helper()
	key := newKey(t)
	runs := 0
	work := func(context.Context, *idempotency.Claimed) (any, error) {
		runs++
		return value, nil
	}
	_, err := idempotency.Run(ctx, db, key, nil, nil, work)
	var failed *idempotency.Failed
	if !errors.As(err, &failed) || failed.Retryable || !strings.Contains(failed.Message, says) {
		t.Fatalf("a result %q: %v", value, err)
	}
	if status, _ := keyStatus(t, db, key, "default"); status != "FAILED_FINAL" {
		t.Fatalf("a result %q left the key %s", value, status)
	}
	if _, err := idempotency.Run(ctx, db, key, nil, nil, work); !errors.As(err, &failed) || !failed.Replayed || runs != 1 {
		t.Fatalf("a duplicate of %q: %v, %d runs", value, err, runs)
	}
}

// A result larger than idempotency.max_value_bytes (1 MB by default) fails
// its key for good: the server refused it (22001) after the work ran, and
// the key stayed held until its lease ended, so that the work ran again.
func TestRunFailsAResultLargerThanTheServerStores(t *testing.T) {
	db := openDB(t)
	ctx := testContext(t, 30*time.Second)
	runFailsForGood(t, ctx, db, map[string]string{"big": strings.Repeat("x", 1024*1024+1)}, "the result cannot be stored: ")
}

// An error message over 8 KiB is stored cut, saying so: the server refused
// one over idempotency.max_value_bytes (22001), which left the key held.
func TestRunStoresAnErrorMessageOver8KiBCut(t *testing.T) {
	db := openDB(t)
	ctx := testContext(t, 30*time.Second)
	key := newKey(t)
	_, err := idempotency.Run(ctx, db, key, nil, nil, func(context.Context, *idempotency.Claimed) (any, error) {
		return nil, idempotency.Final(errors.New(strings.Repeat("é", 1024*1024)))
	})
	var failed *idempotency.Failed
	if !errors.As(err, &failed) || len(failed.Message) > 8192 || !strings.HasSuffix(failed.Message, " [cut from 2097152 bytes]") {
		t.Fatalf("an error of 2 MB: %.80v", err)
	}
	if status, _ := keyStatus(t, db, key, "default"); status != "FAILED_FINAL" {
		t.Fatalf("the key is %s", status)
	}
}

// A claim resumed with an absurd lease (1 ns) gets a heartbeat that beats
// at most every 10 ms, instead of a ticker that stops the process.
func TestKeepAliveOfAnAbsurdlyShortLease(t *testing.T) {
	db := openDB(t)
	ctx := testContext(t, 30*time.Second)
	key := newKey(t)
	r, err := idempotency.Claim(ctx, db, key, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	job := idempotency.Resume(db, key, r.(*idempotency.Claimed).Token, &idempotency.ClaimOptions{Lease: time.Nanosecond})
	work, stop := job.KeepAlive(ctx)
	time.Sleep(50 * time.Millisecond)
	stop()
	if work.Err() == nil {
		t.Fatal("the work's context is still live after stop")
	}
}

// A lease of 1 s survives 2.5 s of work: the heartbeat renews it, and a
// duplicate meanwhile is told the key is in progress.
func TestHeartbeatKeepsTheLease(t *testing.T) {
	db := openDB(t)
	ctx := testContext(t, 30*time.Second)
	key := newKey(t)
	opts := &idempotency.ClaimOptions{Lease: time.Second}
	done, err := idempotency.Run(ctx, db, key, nil, opts, func(ctx context.Context, job *idempotency.Claimed) (any, error) {
		deadline := time.Now().Add(2500 * time.Millisecond)
		for time.Now().Before(deadline) {
			r, err := idempotency.Claim(ctx, db, key, nil, opts)
			if err != nil {
				return nil, err
			}
			if _, ok := r.(*idempotency.InProgress); !ok {
				return nil, idempotency.Final(errors.New("the key was taken over despite the heartbeat"))
			}
			time.Sleep(100 * time.Millisecond)
		}
		return "kept", ctx.Err()
	})
	if err != nil || string(done.Result) != `"kept"` {
		t.Fatalf("%#v %v", done, err)
	}
}

// A pool whose every connection the work holds: the heartbeat goes through
// ClaimOptions.Heartbeats, not behind the work in the pool, and keeps the
// lease. Through the pool (no Heartbeats) the beats wait past the lease and
// another claim takes the key over while the work runs on.
func TestHeartbeatsThroughAPoolOfTheirOwn(t *testing.T) {
	small := openDB(t)
	small.SetMaxOpenConns(2)
	beats := openDB(t)
	other := openDB(t)
	ctx := testContext(t, 30*time.Second)
	key := newKey(t)
	opts := &idempotency.ClaimOptions{Lease: time.Second, Heartbeats: beats}
	runs := 0
	done, err := idempotency.Run(ctx, small, key, nil, opts, func(ctx context.Context, job *idempotency.Claimed) (any, error) {
		runs++
		for i := 0; i < 2; i++ {
			held, err := small.Conn(ctx)
			if err != nil {
				return nil, err
			}
			defer held.Close()
		}
		time.Sleep(1500 * time.Millisecond)
		r, err := idempotency.Claim(ctx, other, key, nil, &idempotency.ClaimOptions{Lease: time.Second})
		if err != nil {
			return nil, err
		}
		time.Sleep(1000 * time.Millisecond)
		return fmt.Sprintf("%T", r), nil
	})
	if err != nil || string(done.Result) != `"*idempotency.InProgress"` || runs != 1 {
		t.Fatalf("%#v %v (runs %d)", done, err, runs)
	}
}

// A worker whose lease ran out (no heartbeat) and was taken over: its
// fenced transaction and its complete get ErrFenced, and its writes roll back.
func TestLateWorkerIsFenced(t *testing.T) {
	db := openDB(t)
	ctx := testContext(t, 30*time.Second)
	mustExec(t, db, `CREATE TABLE IF NOT EXISTS go_effects (key text, worker text)`)
	key := newKey(t)
	opts := &idempotency.ClaimOptions{Lease: 500 * time.Millisecond}
	r, err := idempotency.Claim(ctx, db, key, nil, opts)
	if err != nil {
		t.Fatal(err)
	}
	late := r.(*idempotency.Claimed)
	var taker *idempotency.Claimed
	eventually(t, 10*time.Second, "the lease ended and the key was claimed again", func() bool {
		r, err := idempotency.Claim(ctx, db, key, nil, opts)
		taker, _ = r.(*idempotency.Claimed)
		return err == nil && taker != nil
	})
	if taker.Attempt != 2 || taker.Token <= late.Token {
		t.Fatalf("takeover: %#v", taker)
	}
	_, err = late.Transaction(ctx, func(tx *sql.Tx) (any, error) {
		_, err := tx.Exec(`INSERT INTO go_effects VALUES ($1, 'late')`, key)
		return "late", err
	})
	if !errors.Is(err, idempotency.ErrFenced) {
		t.Fatalf("late transaction: %v", err)
	}
	if err := late.Complete(ctx, "late"); !errors.Is(err, idempotency.ErrFenced) {
		t.Fatalf("late complete: %v", err)
	}
	var pgErr interface{ SQLState() string }
	if !errors.As(err, &pgErr) || pgErr.SQLState() != "IK001" {
		t.Fatalf("the driver's error is still there: %v", err)
	}
	var n int
	db.QueryRow(`SELECT count(*) FROM go_effects WHERE key = $1`, key).Scan(&n)
	if n != 0 {
		t.Fatalf("the late worker's write committed")
	}
	// The heartbeat of the late worker finds the lease lost and cancels its context.
	workCtx, stop := late.KeepAlive(ctx)
	defer stop()
	select {
	case <-workCtx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the heartbeat did not find the lease lost")
	}
	if !errors.Is(late.LeaseLost(), idempotency.ErrFenced) {
		t.Fatalf("LeaseLost: %v", late.LeaseLost())
	}
	if err := taker.Complete(ctx, "taker"); err != nil {
		t.Fatal(err)
	}
}

func TestInTx(t *testing.T) {
	db := openDB(t)
	ctx := testContext(t, 30*time.Second)
	mustExec(t, db, `CREATE TABLE IF NOT EXISTS go_charges (key text PRIMARY KEY, amount int)`)
	count := func(key string) (n int) {
		db.QueryRow(`SELECT count(*) FROM go_charges WHERE key = $1`, key).Scan(&n)
		return n
	}
	charge := func(key string, fail error) (*idempotency.Completed, error) {
		return idempotency.InTx(ctx, db, key, map[string]int{"amount": 5}, nil,
			func(ctx context.Context, tx *sql.Tx, job *idempotency.Claimed) (any, error) {
				if _, err := tx.ExecContext(ctx, `INSERT INTO go_charges VALUES ($1, 5)`, job.Key); err != nil {
					return nil, err
				}
				return map[string]string{"charged": job.Key}, fail
			})
	}
	key := newKey(t)
	if done, err := charge(key, nil); err != nil || done.Replayed || count(key) != 1 {
		t.Fatalf("first: %#v %v", done, err)
	}
	if done, err := charge(key, nil); err != nil || !done.Replayed || count(key) != 1 {
		t.Fatalf("duplicate: %#v %v", done, err)
	}

	rolled := newKey(t)
	boom := errors.New("boom")
	if _, err := charge(rolled, boom); !errors.Is(err, boom) || count(rolled) != 0 {
		t.Fatalf("retryable error: %v", err)
	}
	var exists bool
	db.QueryRow(`SELECT idempotency.idem_get($1) IS NOT NULL AND (idempotency.idem_get($1)).key IS NOT NULL`, rolled).Scan(&exists)
	if exists {
		t.Fatal("a rolled back claim left its key")
	}

	final := newKey(t)
	_, err := charge(final, idempotency.Final(errors.New("refused")))
	var failed *idempotency.Failed
	if !errors.As(err, &failed) || failed.Retryable || count(final) != 0 {
		t.Fatalf("final error: %v", err)
	}
	if status, _ := keyStatus(t, db, final, "default"); status != "FAILED_FINAL" {
		t.Fatalf("final error left %s", status)
	}
}

// A duplicate of work finished so long ago that only the key's tombstone is
// left: completed (or failed) with ResultExpired, and the work never runs.
func TestDuplicateAfterTheResultExpired(t *testing.T) {
	db, admin := openDB(t), adminDB(t)
	ctx := testContext(t, 30*time.Second)
	key, refused := newKey(t), newKey(t)
	request := map[string]any{"amount": 1500}
	runs := 0
	work := func(ctx context.Context, job *idempotency.Claimed) (any, error) {
		runs++
		return map[string]int{"charge": 981}, nil
	}
	if _, err := idempotency.Run(ctx, db, key, request, nil, work); err != nil {
		t.Fatal(err)
	}
	expireResult(t, admin, key, "default")
	late, err := idempotency.Run(ctx, db, key, request, nil, work)
	if err != nil || !late.Replayed || !late.ResultExpired || string(late.Result) != "null" || runs != 1 {
		t.Fatalf("late duplicate: %#v %v, %d runs", late, err, runs)
	}
	if _, err := idempotency.Run(ctx, db, key, map[string]any{"amount": 9999}, nil, work); !errors.Is(err, idempotency.ErrMismatch) {
		t.Fatalf("another request under the tombstoned key: %v", err)
	}
	fresh, err := idempotency.Claim(ctx, db, newKey(t), nil, nil)
	if job, ok := fresh.(*idempotency.Claimed); !ok || err != nil {
		t.Fatalf("a new key: %#v %v", fresh, err)
	} else if err := job.Complete(ctx, nil); err != nil {
		t.Fatal(err)
	}

	_, err = idempotency.Run(ctx, db, refused, nil, nil, func(ctx context.Context, job *idempotency.Claimed) (any, error) {
		return nil, idempotency.Final(errors.New("card refused"))
	})
	if !errors.Is(err, idempotency.ErrFailed) {
		t.Fatalf("final failure: %v", err)
	}
	expireResult(t, admin, refused, "default")
	answer, err := idempotency.Claim(ctx, db, refused, nil, nil)
	if failed, ok := answer.(*idempotency.Failed); !ok || err != nil || !failed.ResultExpired || failed.Message != "" {
		t.Fatalf("late duplicate of a final failure: %#v %v", answer, err)
	}
}

// Work stopped by its caller (ctx cancelled: a worker shutting down) gives
// the key back without counting an attempt: five stops in a row took a key
// to its third attempt, with a growing backoff, and would fail it for good
// at max_attempts. A deadline that passes is a failure, as before.
func TestRunStoppedByItsCallerGivesTheKeyBack(t *testing.T) {
	db := openDB(t)
	ctx := testContext(t, 30*time.Second)
	key := newKey(t)
	for stop := 0; stop < 3; stop++ {
		stopping, cancel := context.WithCancel(ctx)
		started := make(chan struct{})
		go func() { <-started; cancel() }()
		_, err := idempotency.Run(stopping, db, key, nil, nil, func(work context.Context, job *idempotency.Claimed) (any, error) {
			if job.Attempt != 1 {
				t.Errorf("stop %d: attempt %d", stop, job.Attempt)
			}
			close(started)
			<-work.Done()
			return nil, work.Err()
		})
		cancel()
		if !errors.Is(err, idempotency.ErrReleased) {
			t.Fatalf("stop %d: %v", stop, err)
		}
	}
	done, err := idempotency.Run(ctx, db, key, nil, nil, func(_ context.Context, job *idempotency.Claimed) (any, error) {
		return job.Attempt, nil
	})
	var attempt int
	if err != nil || done.Decode(&attempt) != nil || attempt != 1 {
		t.Fatalf("after the stops: attempt %d, %v", attempt, err)
	}

	late := newKey(t)
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err = idempotency.Run(short, db, late, nil, nil, func(work context.Context, _ *idempotency.Claimed) (any, error) {
		<-work.Done()
		return nil, work.Err()
	})
	var failed *idempotency.Failed
	if !errors.As(err, &failed) || !failed.Retryable {
		t.Fatalf("a deadline that passed: %v", err)
	}
}

// A claim whose caller leaves while it is in flight (a client gone, a
// deadline of a few milliseconds) is given back, not left holding the key
// for its lease with an attempt counted: the next claim of each key is its
// first attempt. Before, about a third of such keys stayed PROCESSING.
func TestAClaimWhoseCallerLeftIsGivenBack(t *testing.T) {
	db := openDB(t)
	ctx := testContext(t, time.Minute)
	var left []string
	var otherErrors []error // the caller's ctx ended: its error is the answer
	for i := 0; i < 120; i++ {
		key := newKey(t)
		call, cancel := context.WithTimeout(ctx, time.Duration(i%4)*time.Millisecond)
		r, err := idempotency.Claim(call, db, key, nil, nil)
		cancel()
		if err == nil {
			if c, ok := r.(*idempotency.Claimed); ok {
				mustExec(t, db, `SELECT idempotency.idem_release($1, $2)`, key, c.Token)
			}
			continue
		}
		if call.Err() == nil {
			t.Fatalf("claim %d: %v", i, err)
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			otherErrors = append(otherErrors, err)
		}
		left = append(left, key)
	}
	if len(left) == 0 {
		t.Fatal("no claim was cut short: the deadlines are too long for this machine")
	}
	// A claim still in flight (it ends on its own, then gives the key back)
	// is waited for: the next claim of each key is then its first attempt.
	// Before, the key stayed held for its 30 s lease, an attempt counted.
	waiting := &idempotency.ClaimOptions{Wait: 15 * time.Second}
	for _, key := range left {
		r, err := idempotency.Claim(ctx, db, key, nil, waiting)
		c, ok := r.(*idempotency.Claimed)
		if err != nil || !ok || c.Attempt != 1 {
			t.Fatalf("%s claimed again: %#v, %v", key, r, err)
		}
		mustExec(t, db, `SELECT idempotency.idem_release($1, $2)`, key, c.Token)
	}
	t.Logf("%d of 120 callers left before the answer", len(left))
	if len(otherErrors) > 0 {
		t.Fatalf("%d callers whose deadline passed got another error, such as %v", len(otherErrors), otherErrors[0])
	}
}
