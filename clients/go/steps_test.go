package idempotency_test

// Multi-step work: Step runs a step and records it in the step's
// transaction, returns the stored result of a step that finished before
// (an earlier attempt, which the claim resumes after), and a worker that
// lost its key is fenced at its next step, whose writes roll back.

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	idempotency "github.com/idempotency/idempotency/clients/go"
)

func TestStepKeyIsWhatTheExtensionDerives(t *testing.T) {
	db := openDB(t)
	for _, c := range [][3]string{{"default", "order-42", "charge"}, {"payment.capture", "order-42", "charge"},
		{"s", "clé-ünïcode-🔑", "email:1"}, {"a", "b", "c"}} {
		var derived string
		if err := db.QueryRow(`SELECT idempotency.idem_step_key($1, $2, $3)`, c[1], c[2], c[0]).Scan(&derived); err != nil {
			t.Fatal(err)
		}
		if got := idempotency.StepKey(c[0], c[1], c[2]); got != derived {
			t.Fatalf("StepKey%v = %s, the extension %s", c, got, derived)
		}
	}
}

func TestStepsResumeAfterAFailedAttempt(t *testing.T) {
	db := openDB(t)
	ctx := testContext(t, 30*time.Second)
	mustExec(t, db, `CREATE TABLE IF NOT EXISTS go_step_effects (key text, step text)`)
	key := newKey(t)
	charges := map[string]int{}
	work := func(mailDown bool) idempotency.Work {
		return func(ctx context.Context, job *idempotency.Claimed) (any, error) {
			finished := []string{}
			for _, s := range job.Steps() {
				finished = append(finished, s.Name)
			}
			reserve, err := job.Step(ctx, "reserve", func(ctx context.Context, tx *sql.Tx, _ string) (any, error) {
				_, err := tx.ExecContext(ctx, `INSERT INTO go_step_effects VALUES ($1, 'reserve')`, key)
				return map[string]int{"attempt": job.Attempt}, err
			})
			if err != nil {
				return nil, err
			}
			charge, err := job.Step(ctx, "charge", func(ctx context.Context, tx *sql.Tx, stepKey string) (any, error) {
				charges[stepKey]++
				return stepKey, nil
			})
			if err != nil {
				return nil, err
			}
			if mailDown {
				return nil, errors.New("mail provider timeout")
			}
			return map[string]any{"finished": finished, "reserve": reserve, "charge": charge, "resumed": job.Resumed()}, nil
		}
	}
	opts := &idempotency.ClaimOptions{}
	if _, err := idempotency.Run(ctx, db, key, nil, opts, work(true)); !errors.Is(err, idempotency.ErrFailed) {
		t.Fatalf("first attempt: %v", err)
	}
	var done *idempotency.Completed
	eventually(t, 10*time.Second, "the retry completes", func() bool {
		var err error
		done, err = idempotency.Run(ctx, db, key, nil, opts, work(false))
		return err == nil
	})
	var got struct {
		Finished []string       `json:"finished"`
		Reserve  map[string]int `json:"reserve"`
		Charge   string         `json:"charge"`
		Resumed  bool           `json:"resumed"`
	}
	if err := json.Unmarshal(done.Result, &got); err != nil {
		t.Fatal(err)
	}
	want := idempotency.StepKey("default", key, "charge")
	if !got.Resumed || len(got.Finished) != 2 || got.Finished[0] != "reserve" || got.Finished[1] != "charge" ||
		got.Reserve["attempt"] != 1 || got.Charge != want || charges[want] != 1 || len(charges) != 1 {
		t.Fatalf("resumed job: %+v, charges %v", got, charges)
	}
	var n int
	db.QueryRow(`SELECT count(*) FROM go_step_effects WHERE key = $1`, key).Scan(&n)
	if n != 1 {
		t.Fatalf("reserve wrote %d rows", n)
	}
}

func TestALateWorkerIsFencedAtItsNextStep(t *testing.T) {
	db := openDB(t)
	ctx := testContext(t, 30*time.Second)
	mustExec(t, db, `CREATE TABLE IF NOT EXISTS go_step_effects (key text, step text)`)
	key := newKey(t)
	opts := &idempotency.ClaimOptions{Lease: 500 * time.Millisecond}
	r, err := idempotency.Claim(ctx, db, key, nil, opts)
	if err != nil {
		t.Fatal(err)
	}
	late := r.(*idempotency.Claimed)
	write := func(step string) idempotency.StepFunc {
		return func(ctx context.Context, tx *sql.Tx, _ string) (any, error) {
			_, err := tx.ExecContext(ctx, `INSERT INTO go_step_effects VALUES ($1, $2)`, key, step)
			return step, err
		}
	}
	if _, err := late.Step(ctx, "reserve", write("reserve")); err != nil {
		t.Fatal(err)
	}
	var taker *idempotency.Claimed
	eventually(t, 10*time.Second, "the lease ended and the key was claimed again", func() bool {
		r, err := idempotency.Claim(ctx, db, key, nil, opts)
		taker, _ = r.(*idempotency.Claimed)
		return err == nil && taker != nil
	})
	if steps := taker.Steps(); !taker.Resumed() || len(steps) != 1 || steps[0].Name != "reserve" || steps[0].Attempt != 1 {
		t.Fatalf("the takeover's steps: %+v", steps)
	}
	lateRan := false
	if _, err := late.Step(ctx, "charge", func(ctx context.Context, tx *sql.Tx, stepKey string) (any, error) {
		lateRan = true
		return write("charge late")(ctx, tx, stepKey)
	}); !errors.Is(err, idempotency.ErrFenced) {
		t.Fatalf("late step: %v", err)
	}
	if lateRan {
		t.Fatal("the late worker ran a step before it was fenced")
	}
	var n int
	db.QueryRow(`SELECT count(*) FROM go_step_effects WHERE key = $1 AND step = 'charge late'`, key).Scan(&n)
	if n != 0 {
		t.Fatal("the late worker's step committed")
	}
	if err := taker.Complete(ctx, "taker"); err != nil {
		t.Fatal(err)
	}
}

// A step whose result can never be recorded (not JSON, a string with a NUL
// character, more than idempotency.max_step_bytes) fails its key for good
// at the first attempt, its message saying why: failed retryably, the key
// ran the step's function (a charge) again at every attempt, to the same
// end. In InTx's transaction too, which the refused idem_step aborted.
func TestAStepWhoseResultCannotBeStoredFailsItsKeyForGood(t *testing.T) {
	db := openDB(t)
	ctx := testContext(t, 30*time.Second)
	for _, c := range []struct {
		value any
		why   string
	}{
		{make(chan int), "not JSON"},
		{map[string]string{"charge_id": "ch_\x00"}, "NUL"},
		{strings.Repeat("x", 17*1024), "larger than the server stores for a step (idempotency.max_step_bytes)"},
	} {
		key := newKey(t)
		runs := 0
		work := func(ctx context.Context, job *idempotency.Claimed) (any, error) {
			if _, err := job.Step(ctx, "charge", func(context.Context, *sql.Tx, string) (any, error) {
				runs++
				return c.value, nil
			}); err != nil {
				return nil, err
			}
			return "done", nil
		}
		_, err := idempotency.Run(ctx, db, key, nil, nil, work)
		var failed *idempotency.Failed
		if !errors.As(err, &failed) || failed.Retryable || !strings.Contains(failed.Message, c.why) ||
			!strings.Contains(failed.Message, `step "charge"`) {
			t.Fatalf("a step's result (%s): %v", c.why, err)
		}
		if status, _ := keyStatus(t, db, key, "default"); status != "FAILED_FINAL" || runs != 1 {
			t.Fatalf("a step's result (%s): the key %s, the step ran %d times", c.why, status, runs)
		}
		if _, err := idempotency.Run(ctx, db, key, nil, nil, work); !errors.As(err, &failed) || !failed.Replayed || runs != 1 {
			t.Fatalf("a duplicate (%s): %v, the step ran %d times", c.why, err, runs)
		}

		key = newKey(t)
		_, err = idempotency.InTx(ctx, db, key, nil, nil, func(ctx context.Context, tx *sql.Tx, job *idempotency.Claimed) (any, error) {
			return job.StepTx(ctx, tx, "charge", func(context.Context, *sql.Tx, string) (any, error) { return c.value, nil })
		})
		if !errors.As(err, &failed) || failed.Retryable || !strings.Contains(failed.Message, c.why) {
			t.Fatalf("a step's result in InTx (%s): %v", c.why, err)
		}
		if status, _ := keyStatus(t, db, key, "default"); status != "FAILED_FINAL" {
			t.Fatalf("a step's result in InTx (%s) left the key %s", c.why, status)
		}
	}
}

// A step in the caller's transaction that rolls back is not taken as
// finished: the retry in another transaction runs it again, and a later
// call after that one committed gets its stored result. It was remembered
// before the commit, and the retry skipped it (the key completed without
// the step, its writes gone).
func TestAStepTxRolledBackRunsAgain(t *testing.T) {
	db := openDB(t)
	ctx := testContext(t, 30*time.Second)
	mustExec(t, db, `CREATE TABLE IF NOT EXISTS go_step_effects (key text, step text)`)
	key := newKey(t)
	r, err := idempotency.Claim(ctx, db, key, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	job := r.(*idempotency.Claimed)
	runs := 0
	charge := func(ctx context.Context, tx *sql.Tx, _ string) (any, error) {
		runs++
		_, err := tx.ExecContext(ctx, `INSERT INTO go_step_effects VALUES ($1, 'charge')`, key)
		return map[string]int{"try": runs}, err
	}
	inTx := func(commit bool) string {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		result, err := job.StepTx(ctx, tx, "charge", charge)
		if err != nil {
			t.Fatal(err)
		}
		if commit {
			err = tx.Commit()
		} else {
			err = tx.Rollback()
		}
		if err != nil {
			t.Fatal(err)
		}
		return string(result)
	}
	if got := inTx(false); got != `{"try":1}` {
		t.Fatalf("first try: %s", got)
	}
	if got := inTx(true); got != `{"try":2}` {
		t.Fatalf("the retry after the rollback: %s (the step ran %d times)", got, runs)
	}
	if got := inTx(true); (got != `{"try": 2}` && got != `{"try":2}`) || runs != 2 {
		t.Fatalf("after the commit: %s, the step ran %d times", got, runs)
	}
	var n int
	db.QueryRow(`SELECT count(*) FROM go_step_effects WHERE key = $1 AND step = 'charge'`, key).Scan(&n)
	if n != 1 {
		t.Fatalf("%d charges written", n)
	}
	if err := job.Complete(ctx, "done"); err != nil {
		t.Fatal(err)
	}
}

// A step past idempotency.max_steps (54000) fails its key for good: it
// would be refused at every attempt, after the step's function ran.
func TestAStepPastMaxStepsFailsItsKeyForGood(t *testing.T) {
	db := openDB(t)
	ctx := testContext(t, 30*time.Second)
	key := newKey(t)
	runs := 0
	work := func(ctx context.Context, job *idempotency.Claimed) (any, error) {
		for i := 0; i <= 32; i++ { // idempotency.max_steps is 32
			if _, err := job.Step(ctx, fmt.Sprintf("s%d", i), func(context.Context, *sql.Tx, string) (any, error) {
				runs++
				return i, nil
			}); err != nil {
				return nil, err
			}
		}
		return "done", nil
	}
	_, err := idempotency.Run(ctx, db, key, nil, nil, work)
	var failed *idempotency.Failed
	if !errors.As(err, &failed) || failed.Retryable || !strings.Contains(failed.Message, "idempotency.max_steps") {
		t.Fatalf("the step past the limit: %v", err)
	}
	if _, err := idempotency.Run(ctx, db, key, nil, nil, work); !errors.As(err, &failed) || !failed.Replayed || runs != 33 {
		t.Fatalf("a duplicate: %v, the steps ran %d times", err, runs)
	}
}

// A step's name that idem_step refuses (keys.md: 1 to 63 bytes of ASCII
// letters, digits and _ . : -) fails its key for good before the step's
// function runs, its message naming the rule: checked only by idem_step,
// after the function ran, it failed the key retryably, so that the function
// (its external call too) ran at every attempt and the key never finished.
// Names idem_step and idem_step_key refuse: empty (22023), a character that
// is not allowed (22023; a NUL byte no text holds: 22021), longer than 63
// bytes (22001).
var badStepNames = []string{"", "charge card", "chargé", "charge/1", "charge\x00", strings.Repeat("a", 64)}

// StepKey computes no key for a name idem_step_key refuses: it panics, as
// for a programmer's error (its signature is kept); CheckStepName says so
// with an error. A name of 63 bytes holding every character allowed is
// taken by both, and by the extension.
func TestStepKeyRefusesWhatTheExtensionRefuses(t *testing.T) {
	db := openDB(t)
	for _, name := range badStepNames {
		var derived string
		err := db.QueryRow(`SELECT idempotency.idem_step_key('k', $1)`, name).Scan(&derived)
		if code := idempotency.SQLState(err); code != "22023" && code != "22001" && code != "22021" {
			t.Fatalf("the extension's idem_step_key(%q): %q, %v", name, derived, err)
		}
		if err := idempotency.CheckStepName(name); err == nil || !strings.Contains(err.Error(), "ASCII letters, digits and _ . : -") {
			t.Fatalf("CheckStepName(%q): %v", name, err)
		}
		func() {
			defer func() {
				if p := recover(); p == nil || !strings.Contains(fmt.Sprint(p), "1 to 63 bytes") {
					t.Fatalf("StepKey(%q) did not panic with the rule: %v", name, p)
				}
			}()
			t.Errorf("StepKey(%q) = %s", name, idempotency.StepKey("default", "k", name))
		}()
	}
	name := "az_AZ.09:-" + strings.Repeat("x", 53)
	var derived string
	if err := db.QueryRow(`SELECT idempotency.idem_step_key('k', $1)`, name).Scan(&derived); err != nil {
		t.Fatal(err)
	}
	if err := idempotency.CheckStepName(name); err != nil || idempotency.StepKey("default", "k", name) != derived {
		t.Fatalf("a name of 63 bytes: %v, %s", err, derived)
	}
}

func TestABadStepNameFailsItsKeyBeforeTheStepRuns(t *testing.T) {
	db := openDB(t)
	ctx := testContext(t, 30*time.Second)
	for _, name := range badStepNames {
		key := newKey(t)
		runs := 0
		step := func(context.Context, *sql.Tx, string) (any, error) {
			runs++
			return "charged", nil
		}
		_, err := idempotency.Run(ctx, db, key, nil, nil, func(ctx context.Context, job *idempotency.Claimed) (any, error) {
			return job.Step(ctx, name, step)
		})
		var failed *idempotency.Failed
		if !errors.As(err, &failed) || failed.Retryable || !strings.Contains(failed.Message, "ASCII letters, digits and _ . : -") {
			t.Fatalf("step %q: %v", name, err)
		}
		if status, _ := keyStatus(t, db, key, "default"); status != "FAILED_FINAL" || runs != 0 {
			t.Fatalf("step %q: the key %s, the step ran %d times", name, status, runs)
		}
		key = newKey(t)
		_, err = idempotency.InTx(ctx, db, key, nil, nil, func(ctx context.Context, tx *sql.Tx, job *idempotency.Claimed) (any, error) {
			return job.StepTx(ctx, tx, name, step)
		})
		if !errors.As(err, &failed) || failed.Retryable || runs != 0 {
			t.Fatalf("step %q in InTx: %v, the step ran %d times", name, err, runs)
		}
	}
}

// Under the middleware a handler makes a response of a step's error,
// typically a 500, which DefaultClassify calls retryable: the key failed
// retryably, and the next request with it ran the handler and the step's
// function again, its external call (a charge) with it, at every attempt.
// A step of the request's claim whose result cannot be stored fails the key
// for good whatever the response: in claim and transaction modes the
// response is stored as the key's final failure and replayed to retries
// (in transaction mode the handler's writes undone); in claim mode a
// handler that panics after such a step fails its key for good too. The
// step's function runs once.
func TestAMiddlewareStepWhoseResultCannotBeStoredFailsItsKeyForGood(t *testing.T) {
	db := openDB(t)
	effectsTable(t, db)
	var mu sync.Mutex
	charges := map[string]int{}
	for _, value := range []struct {
		value any
		why   string
	}{
		{make(chan int), "not JSON"},
		{strings.Repeat("x", 17*1024), "larger than the server stores for a step (idempotency.max_step_bytes)"},
	} {
		for _, mode := range []idempotency.Mode{idempotency.ModeClaim, idempotency.ModeTransaction} {
			scope := "go.step-unstorable." + string(mode)
			// The body asks how the handler answers the step's error:
			// {"status": N} (500 unless set, with the error's text) or
			// {"panic": true}. In transaction mode it writes on TxOf first.
			server, runs := modeServer(t, db, &idempotency.MiddlewareOptions{Scope: scope, Mode: mode},
				func(w http.ResponseWriter, r *http.Request) {
					var ask struct {
						Status int
						Panic  bool
					}
					json.NewDecoder(r.Body).Decode(&ask) //nolint:errcheck // an empty body asks nothing
					key, ctx, job := r.Header.Get("Idempotency-Key"), r.Context(), idempotency.ClaimOf(r.Context())
					charge := func(context.Context, *sql.Tx, string) (any, error) {
						mu.Lock()
						charges[key]++
						mu.Unlock()
						return value.value, nil
					}
					var err error
					if tx := idempotency.TxOf(ctx); tx != nil {
						if _, err := tx.ExecContext(ctx, `INSERT INTO go_mode_effects VALUES ($1, 'before the step')`, key); err != nil {
							t.Error(err)
						}
						_, err = job.StepTx(ctx, tx, "charge", charge)
					} else {
						_, err = job.Step(ctx, "charge", charge)
					}
					if err == nil || !strings.Contains(err.Error(), value.why) {
						t.Errorf("%s: the step's error: %v", scope, err)
					}
					if ask.Panic {
						panic("the handler failed after the step")
					}
					if ask.Status == 0 {
						ask.Status = http.StatusInternalServerError
					}
					w.Header().Set("Content-Type", "text/plain")
					w.WriteHeader(ask.Status)
					fmt.Fprintf(w, "%d: %v", ask.Status, err)
				})
			charged := func(key string) int {
				mu.Lock()
				defer mu.Unlock()
				return charges[key]
			}
			statusOf := func(key string) string { // "" when the key has no row (rolled back)
				var status sql.NullString
				if err := db.QueryRow(`SELECT status::text FROM idempotency.idem_get($1, $2)`, key, scope).Scan(&status); err != nil {
					t.Fatal(err)
				}
				return status.String
			}
			what := func(answer string) string { return fmt.Sprintf("%s, %s, a step's result %s", mode, answer, value.why) }
			for body, status := range map[string]int{`{}`: http.StatusInternalServerError, `{"status":201}`: http.StatusCreated} {
				key := newKey(t)
				first := post(t, server.URL, key, body)
				if first.status != status || first.header.Get("Idempotent-Replayed") != "" ||
					!strings.Contains(string(first.body), value.why) {
					t.Fatalf("%s: %d %s", what(body), first.status, first.body)
				}
				if status := statusOf(key); status != "FAILED_FINAL" {
					t.Fatalf("%s: the key %q", what(body), status)
				}
				sameReplay(t, first, post(t, server.URL, key, body), what(body))
				if runs(key) != 1 || charged(key) != 1 || modeEffects(t, db, key) != 0 {
					t.Fatalf("%s: the handler ran %d times, the step %d, %d writes kept",
						what(body), runs(key), charged(key), modeEffects(t, db, key))
				}
			}
			if mode != idempotency.ModeClaim {
				continue // a panic rolls transaction mode's claim back, as if the request never came
			}
			key := newKey(t)
			req, _ := http.NewRequest(http.MethodPost, server.URL, strings.NewReader(`{"panic":true}`))
			req.Header.Set("Idempotency-Key", key)
			req.GetBody = nil // net/http's client would send it again on the broken connection
			if res, err := http.DefaultClient.Do(req); err == nil {
				res.Body.Close()
				t.Fatalf("%s: a panicking handler answered %d", what("a panic"), res.StatusCode)
			}
			if status := statusOf(key); status != "FAILED_FINAL" {
				t.Fatalf("%s: the key %q", what("a panic"), status)
			}
			again := post(t, server.URL, key, `{"panic":true}`)
			if again.status != http.StatusInternalServerError || again.header.Get("Idempotent-Replayed") != "true" ||
				runs(key) != 1 || charged(key) != 1 {
				t.Fatalf("%s: the retry %d %v %s, the handler ran %d times, the step %d",
					what("a panic"), again.status, again.header, again.body, runs(key), charged(key))
			}
		}
	}
}
