package idempotency

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Kind is how a handler's response is recorded.
type Kind int

const (
	KindComplete  Kind = iota // stored and replayed to every retry
	KindRetryable             // not stored: the next request with the key runs the handler again
	KindFinal                 // stored as the key's final failure, replayed too
)

// DefaultClassify: 408, 425, 429 and 5xx are retryable, other 4xx final,
// the rest complete.
func DefaultClassify(status int) Kind {
	switch {
	case status >= 500 || status == 408 || status == 425 || status == 429:
		return KindRetryable
	case status >= 400:
		return KindFinal
	}
	return KindComplete
}

// Mode is how the middleware holds a key while the handler runs.
type Mode string

const (
	// ModeClaim: the key is claimed (committed) before the handler runs, a
	// heartbeat keeps its lease, the response is recorded once it answers.
	ModeClaim Mode = "claim"
	// ModeTransaction: the key is claimed in a transaction that stays open
	// while the handler runs (TxOf); the handler's writes on it and the
	// stored response commit together.
	ModeTransaction Mode = "transaction"
	// ModeRegister: the key is registered (idem_register) in a transaction
	// with the handler, which enqueues a job on TxOf and answers 202; a
	// worker claims the key with RequestOf and completes it later.
	ModeRegister Mode = "register"
)

// Event is what the hooks hear.
type Event struct {
	Key        string
	Scope      string
	Mode       Mode
	Outcome    Outcome
	Status     int    // the status sent
	RetryAfter int    // seconds, on a 409
	During     string // OnFenced: "heartbeat" or "record"
	Err        error  // OnFenced: the error
	// OnReplay: the key's tombstone answered (its stored response expired)
	ResultExpired bool
}

// MiddlewareOptions: all optional.
type MiddlewareOptions struct {
	Scope        string        // "default"
	Mode         Mode          // ModeClaim
	Optional     bool          // let requests without the header through untouched (default: 400)
	Methods      []string      // the methods covered: POST and PATCH
	Header       string        // "Idempotency-Key"
	ReplayHeader string        // "Idempotent-Replayed"
	Lease        time.Duration // 30 s, renewed by a heartbeat while the handler runs; at most idempotency.max_lease
	Wait         time.Duration // how long a duplicate waits for the running one before its 409
	RetryIn      time.Duration // when a retryable failure may run again (0: at once; at most 36,000 days)
	Fingerprint  Fingerprint
	Classify     func(status int) Kind
	// The answers for keys a worker completed or failed (no stored response).
	CompletedResponse func(result json.RawMessage) Response
	FailedResponse    func(message string) Response
	// The answer to a duplicate of a key whose stored response has expired
	// (only its tombstone is left; the handler never runs again):
	// ExpiredProblem, a 410, unless set.
	ExpiredResponse                            func(key string) Response
	OnReplay, OnConflict, OnMismatch, OnFenced func(Event)
	// Heartbeats: the pool the claim mode's heartbeats go through (nil:
	// the middleware's); see ClaimOptions.Heartbeats.
	Heartbeats *sql.DB
	// OnError hears each error the middleware keeps from the client: a
	// claim or a record that failed (answered with a 500), a heartbeat that
	// failed; wrapped with the key and what was being done. nil: log.Print.
	OnError func(error)
}

func (o *MiddlewareOptions) normalized() MiddlewareOptions {
	var n MiddlewareOptions
	if o != nil {
		n = *o
	}
	if n.Scope == "" {
		n.Scope = "default"
	}
	if n.Mode == "" {
		n.Mode = ModeClaim
	}
	if len(n.Methods) == 0 {
		n.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	if n.Header == "" {
		n.Header = "Idempotency-Key"
	}
	if n.ReplayHeader == "" {
		n.ReplayHeader = "Idempotent-Replayed"
	}
	if n.Lease == 0 {
		n.Lease = defaultLease
	}
	if n.Fingerprint == nil {
		n.Fingerprint = DefaultFingerprint
	}
	if n.Classify == nil {
		n.Classify = DefaultClassify
	}
	if n.CompletedResponse == nil {
		n.CompletedResponse = func(result json.RawMessage) Response { return JSONResponse(http.StatusOK, result) }
	}
	if n.ExpiredResponse == nil {
		n.ExpiredResponse = ExpiredProblem
	}
	if n.FailedResponse == nil {
		n.FailedResponse = func(message string) Response {
			return Problem(http.StatusInternalServerError, "Request failed", message)
		}
	}
	if n.OnError == nil {
		n.OnError = func(err error) { log.Print(err) }
	}
	return n
}

type stateKey struct{}

// requestState is what a handler under Middleware can learn of its key.
type requestState struct {
	claim   *Claimed
	tx      *sql.Tx
	request json.RawMessage
}

func stateOf(ctx context.Context) *requestState {
	st, _ := ctx.Value(stateKey{}).(*requestState)
	if st == nil {
		return &requestState{}
	}
	return st
}

// ClaimOf is the claim of the request a handler under Middleware serves
// (claim and transaction modes): Key, Token, Attempt, and AssertOwner to
// fence a transaction of its own; for a multi-step handler Steps, Step (in
// claim mode: a transaction of its own per step, so that a retry of a
// failed request resumes after the steps that finished) and StepTx (in
// transaction mode, on TxOf). nil otherwise.
func ClaimOf(ctx context.Context) *Claimed { return stateOf(ctx).claim }

// TxOf is the request's transaction in transaction and register modes: the
// handler's writes on it commit with the key, or not at all. Do not commit
// or roll it back: the middleware does, by the response. nil otherwise.
func TxOf(ctx context.Context) *sql.Tx { return stateOf(ctx).tx }

// RequestOf is the fingerprint the key stands for, as JSON. In register
// mode, pass it in the job: the worker claims the key with it (another
// request would be a mismatch). nil outside the middleware.
func RequestOf(ctx context.Context) json.RawMessage { return stateOf(ctx).request }

// Middleware handles the Idempotency-Key header with the rules and the
// stored-response format of the Node and Python clients, so that services
// in any of the three can share keys:
//
//	no key (required)            400
//	in progress / retry later    409 with Retry-After (after waiting up to Wait)
//	key reused, another request  422
//	completed or failed          the stored response, byte for byte, with Idempotent-Replayed: true
//	... and its response expired 410 (only the key's tombstone is left; the handler does not run)
//	new                          the handler runs; its response is recorded, then sent
//
// How the key is held while the handler runs depends on opts.Mode (claim,
// transaction, register). In claim mode the handler's context is cancelled
// when its lease is lost or the client goes away. The body is read whole
// (for the fingerprint) and handed on. It panics for an unknown Mode, and
// for a Lease, Wait or RetryIn that the extension would refuse whatever its
// settings (options.go).
func Middleware(db *sql.DB, opts *MiddlewareOptions) func(http.Handler) http.Handler {
	o := opts.normalized()
	if err := o.check(); err != nil {
		panic(err)
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !o.covers(r.Method) {
				next.ServeHTTP(w, r)
				return
			}
			key := r.Header.Get(o.Header)
			switch {
			case key == "" && o.Optional:
				next.ServeHTTP(w, r)
				return
			case key == "":
				Problem(http.StatusBadRequest, "Idempotency-Key is missing", "This request requires an "+o.Header+" header.").write(w)
				return
			case len(key) > 255:
				Problem(http.StatusBadRequest, "Idempotency-Key is too long", "At most 255 bytes.").write(w)
				return
			case !utf8.ValidString(key):
				Problem(http.StatusBadRequest, "Idempotency-Key is not UTF-8", "A key is UTF-8 text.").write(w)
				return
			}
			body, err := io.ReadAll(r.Body)
			if err != nil {
				Problem(http.StatusBadRequest, "Unreadable body", "The request body could not be read.").write(w)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			req, err := jsonParam(o.Fingerprint(r, body))
			if err != nil {
				o.report("fingerprinting the request", key, err)
				Problem(http.StatusInternalServerError, "Internal error", "The request could not be fingerprinted.").write(w)
				return
			}
			t, err := o.begin(r.Context(), db, key, req)
			if err != nil {
				if r.Context().Err() == nil { // a client that went away is no error of the database
					o.report("claiming", key, err)
				}
				Problem(http.StatusInternalServerError, "Internal error", "The key could not be claimed.").write(w)
				return
			}
			if !held(t.res) {
				o.answer(key, t.res).write(w)
				return
			}
			st := &requestState{tx: t.tx}
			if text, ok := req.(string); ok {
				st.request = json.RawMessage(text)
			}
			st.claim, _ = t.res.(*Claimed)
			if o.Mode == ModeClaim {
				o.serve(w, r, next, st)
				return
			}
			o.serveTx(w, r, next, key, st)
		})
	}
}

// check: a mistake in the options panics when the middleware is made, as
// it would fail every request.
func (o *MiddlewareOptions) check() error {
	if o.Mode != ModeClaim && o.Mode != ModeTransaction && o.Mode != ModeRegister {
		return fmt.Errorf("idempotency: unknown middleware mode %q", o.Mode)
	}
	return firstError(checkLease("MiddlewareOptions.Lease", o.Lease),
		checkNotNegative("MiddlewareOptions.Wait", o.Wait),
		checkRetryIn("MiddlewareOptions.RetryIn", o.RetryIn),
		checkScope("MiddlewareOptions.Scope", o.Scope),
		checkHeaderName("MiddlewareOptions.Header", o.Header),
		checkHeaderName("MiddlewareOptions.ReplayHeader", o.ReplayHeader))
}

// begin claims (or registers) the key as the mode says. Register mode does
// not wait: its key waits for a worker, not for another request.
func (o *MiddlewareOptions) begin(ctx context.Context, db *sql.DB, key string, req any) (tryResult, error) {
	claim := ClaimOptions{Scope: o.Scope, Lease: o.Lease, Heartbeats: o.Heartbeats}
	switch o.Mode {
	case ModeTransaction:
		return claimWaiting(ctx, db, waitID("transaction", key, req, claim), o.Wait, func(ctx context.Context) (tryResult, error) {
			return beginKey(ctx, db, false, key, req, claim)
		})
	case ModeRegister:
		return beginKey(ctx, db, true, key, req, claim)
	}
	return claimWaiting(ctx, db, waitID("claim", key, req, claim), o.Wait, func(ctx context.Context) (tryResult, error) {
		return claimTry(ctx, db, key, req, claim)
	})
}

func (o *MiddlewareOptions) covers(method string) bool {
	for _, m := range o.Methods {
		if strings.EqualFold(m, method) {
			return true
		}
	}
	return false
}

// serve runs the handler for a key claimed in claim mode, records its
// response, sends it.
func (o *MiddlewareOptions) serve(w http.ResponseWriter, r *http.Request, next http.Handler, st *requestState) {
	job := st.claim
	ctx, stop := job.keepAlive(r.Context(), func(err error) { o.report("renewing the lease", job.Key, err) })
	// The heartbeat goes on while the response is recorded: a record that
	// waits for a busy pool must not let the lease end, or a duplicate
	// takes the key over and runs the handler again.
	defer stop()
	finished := false
	defer func() {
		if finished {
			return
		}
		// The handler panicked: the key fails retryably (for good after a
		// step whose result could not be stored), the panic goes on.
		job.startRecording()
		record, cancel := job.recordingContext(r.Context())
		defer cancel()
		cause := Retry(errors.New("the handler panicked"), o.RetryIn)
		if job.hadUnstorableStep() {
			cause = Final(errors.New("the handler panicked"))
		}
		if _, err := job.Fail(record, cause); err != nil {
			o.report("failing it after the handler panicked", job.Key, err)
		}
	}()
	rec := newRecorder()
	next.ServeHTTP(rec, r.WithContext(context.WithValue(ctx, stateKey{}, st)))
	finished = true
	if lost := job.LeaseLost(); lost != nil {
		o.hook(o.OnFenced, Event{Key: job.Key, Scope: o.Scope, Mode: o.Mode, During: "heartbeat", Err: lost})
	}
	job.startRecording()
	resp := rec.response()
	if err := o.record(r.Context(), job, resp); err != nil {
		if errors.Is(err, errTooLarge) {
			// Failed for good instead: this client gets what a retry will.
			o.FailedResponse(tooLargeMessage).write(w)
			return
		}
		if !errors.Is(err, ErrFenced) {
			o.report("recording the response", job.Key, err)
			Problem(http.StatusInternalServerError, "Internal error", "The response could not be recorded.").write(w)
			return
		}
		// Another request holds the key now; this response is still the
		// truth about the work this request did.
		o.hook(o.OnFenced, Event{Key: job.Key, Scope: o.Scope, Mode: o.Mode, During: "record", Err: err})
	}
	resp.write(w)
}

// A response larger than the server stores (idempotency.max_value_bytes)
// can never be recorded: left held, its key would run the handler again at
// each lease's end. It fails the key for good instead (errTooLarge).
const tooLargeMessage = "the response is larger than the server stores (idempotency.max_value_bytes)"

var errTooLarge = errors.New("idempotency: " + tooLargeMessage)

func (o *MiddlewareOptions) record(ctx context.Context, job *Claimed, resp Response) error {
	record, cancel := job.recordingContext(ctx)
	defer cancel()
	doc, err := encodeResponse(resp)
	if err != nil {
		return err
	}
	switch o.classify(job, resp) {
	case KindComplete:
		err = job.Complete(record, json.RawMessage(doc))
	case KindFinal:
		_, err = job.Fail(record, Final(errors.New(string(doc))))
	default:
		_, err = job.Fail(record, Retry(errors.New("HTTP "+strconv.Itoa(resp.Status)), o.RetryIn))
	}
	if SQLState(err) == "22001" {
		if _, failed := job.Fail(record, Final(errors.New(tooLargeMessage))); failed != nil {
			return failed
		}
		return errTooLarge
	}
	return err
}

// classify is how resp is recorded on job's key: final whatever the
// response once a step of the claim could not be stored (it would be so
// at every attempt, after the step's function ran), else by Classify.
func (o *MiddlewareOptions) classify(job *Claimed, resp Response) Kind {
	if job != nil && job.hadUnstorableStep() {
		return KindFinal
	}
	return o.Classify(resp.Status)
}

// answer is the response to a key that was not claimed.
func (o *MiddlewareOptions) answer(key string, res Result) Response {
	event := Event{Key: key, Scope: o.Scope, Mode: o.Mode, Outcome: res.Outcome()}
	var resp Response
	if expired(res) {
		resp = o.ExpiredResponse(key)
		event.ResultExpired = true
		o.hook(o.OnReplay, withStatus(event, resp.Status))
		return resp
	}
	switch r := res.(type) {
	case *Completed:
		stored, ok := decodeResponse(r.Result)
		if !ok {
			stored = o.CompletedResponse(r.Result)
		}
		resp = o.replay(stored)
		o.hook(o.OnReplay, withStatus(event, resp.Status))
	case *Failed:
		stored, ok := decodeResponse([]byte(r.Message))
		if !ok {
			stored = o.FailedResponse(r.Message)
		}
		resp = o.replay(stored)
		o.hook(o.OnReplay, withStatus(event, resp.Status))
	case *Mismatch:
		resp = Problem(http.StatusUnprocessableEntity, "Idempotency-Key reused",
			"This Idempotency-Key was already used with a different request.")
		o.hook(o.OnMismatch, withStatus(event, resp.Status))
	default: // *InProgress, *RetryLater
		seconds := retryAfterSeconds(res)
		resp = Problem(http.StatusConflict, "Request in progress",
			"A request with this Idempotency-Key is being processed; retry later.")
		resp.Header.Set("Retry-After", strconv.Itoa(seconds))
		event.RetryAfter = seconds
		o.hook(o.OnConflict, withStatus(event, resp.Status))
	}
	return resp
}

// expired: a duplicate answered from the key's tombstone.
func expired(res Result) bool {
	switch r := res.(type) {
	case *Completed:
		return r.ResultExpired
	case *Failed:
		return r.ResultExpired
	}
	return false
}

func (o *MiddlewareOptions) replay(resp Response) Response {
	header := resp.Header.Clone()
	if header == nil {
		header = http.Header{}
	}
	header.Set(o.ReplayHeader, "true")
	return Response{Status: resp.Status, Header: header, Body: resp.Body}
}

// retryAfterSeconds: what idem_claim said, rounded up, at least 1.
func retryAfterSeconds(res Result) int {
	var d time.Duration
	switch r := res.(type) {
	case *InProgress:
		d = r.RetryAfter
	case *RetryLater:
		d = r.RetryAfter
	}
	if s := int(math.Ceil(d.Seconds())); s > 1 {
		return s
	}
	return 1
}

func withStatus(e Event, status int) Event {
	e.Status = status
	return e
}

// report tells OnError of an error the middleware answers for, naming the
// key and what was being done; a hook that panics changes nothing.
func (o *MiddlewareOptions) report(doing, key string, err error) {
	defer func() { recover() }() //nolint:errcheck
	o.OnError(fmt.Errorf("idempotency: key %q (scope %q), %s: %w", key, o.Scope, doing, err))
}

// hook calls a logging hook; one that panics changes nothing.
func (o *MiddlewareOptions) hook(fn func(Event), e Event) {
	if fn == nil {
		return
	}
	defer func() { recover() }() //nolint:errcheck
	fn(e)
}
