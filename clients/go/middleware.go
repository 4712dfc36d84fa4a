package idempotency

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
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

// Event is what the hooks hear.
type Event struct {
	Key        string
	Scope      string
	Outcome    Outcome
	Status     int    // the status sent
	RetryAfter int    // seconds, on a 409
	During     string // OnFenced: "heartbeat" or "record"
	Err        error  // OnFenced: the error
}

// MiddlewareOptions: all optional.
type MiddlewareOptions struct {
	Scope        string        // "default"
	Optional     bool          // let requests without the header through untouched (default: 400)
	Methods      []string      // the methods covered: POST and PATCH
	Header       string        // "Idempotency-Key"
	ReplayHeader string        // "Idempotent-Replayed"
	Lease        time.Duration // 30 s, renewed by a heartbeat while the handler runs
	Wait         time.Duration // how long a duplicate waits for the running one before its 409
	RetryIn      time.Duration // when a retryable failure may run again (0: at once)
	Fingerprint  Fingerprint
	Classify     func(status int) Kind
	// The answers for keys a worker completed or failed (no stored response).
	CompletedResponse                          func(result json.RawMessage) Response
	FailedResponse                             func(message string) Response
	OnReplay, OnConflict, OnMismatch, OnFenced func(Event)
}

func (o *MiddlewareOptions) normalized() MiddlewareOptions {
	var n MiddlewareOptions
	if o != nil {
		n = *o
	}
	if n.Scope == "" {
		n.Scope = "default"
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
	if n.Lease <= 0 {
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
	if n.FailedResponse == nil {
		n.FailedResponse = func(message string) Response {
			return Problem(http.StatusInternalServerError, "Request failed", message)
		}
	}
	return n
}

type claimContextKey struct{}

// ClaimOf is the claim of the request a handler under Middleware serves:
// Key, Token, Attempt, and AssertOwner to fence a transaction of its own.
// nil outside the middleware.
func ClaimOf(ctx context.Context) *Claimed {
	job, _ := ctx.Value(claimContextKey{}).(*Claimed)
	return job
}

// Middleware handles the Idempotency-Key header with the rules and the
// stored-response format of the Node and Python clients, so that services
// in any of the three can share keys:
//
//	no key (required)            400
//	in progress / retry later    409 with Retry-After (after waiting up to Wait)
//	key reused, another request  422
//	completed or failed          the stored response, byte for byte, with Idempotent-Replayed: true
//	new                          the handler runs under a heartbeat; its response is
//	                             recorded, then sent
//
// The handler's context is cancelled when its lease is lost or the client
// goes away. The body is read whole (for the fingerprint) and handed on.
func Middleware(db *sql.DB, opts *MiddlewareOptions) func(http.Handler) http.Handler {
	o := opts.normalized()
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
			}
			body, err := io.ReadAll(r.Body)
			if err != nil {
				Problem(http.StatusBadRequest, "Unreadable body", "The request body could not be read.").write(w)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			claim := ClaimOptions{Scope: o.Scope, Lease: o.Lease, Wait: o.Wait}
			res, err := Claim(r.Context(), db, key, o.Fingerprint(r, body), &claim)
			if err != nil {
				Problem(http.StatusInternalServerError, "Internal error", "The key could not be claimed.").write(w)
				return
			}
			if job, ok := res.(*Claimed); ok {
				o.serve(w, r, next, job)
				return
			}
			o.answer(key, res).write(w)
		})
	}
}

func (o *MiddlewareOptions) covers(method string) bool {
	for _, m := range o.Methods {
		if strings.EqualFold(m, method) {
			return true
		}
	}
	return false
}

// serve runs the handler for a claimed key, records its response, sends it.
func (o *MiddlewareOptions) serve(w http.ResponseWriter, r *http.Request, next http.Handler, job *Claimed) {
	ctx, stop := job.KeepAlive(r.Context())
	finished := false
	defer func() {
		if finished {
			return
		}
		// The handler panicked: the key fails retryably, the panic goes on.
		stop()
		record, cancel := recordingContext(r.Context())
		defer cancel()
		job.Fail(record, Retry(errors.New("the handler panicked"), o.RetryIn)) //nolint:errcheck
	}()
	rec := newRecorder()
	next.ServeHTTP(rec, r.WithContext(context.WithValue(ctx, claimContextKey{}, job)))
	finished = true
	stop()
	if lost := job.LeaseLost(); lost != nil {
		o.hook(o.OnFenced, Event{Key: job.Key, Scope: o.Scope, During: "heartbeat", Err: lost})
	}
	resp := rec.response()
	if err := o.record(r.Context(), job, resp); err != nil {
		if !errors.Is(err, ErrFenced) {
			Problem(http.StatusInternalServerError, "Internal error", "The response could not be recorded.").write(w)
			return
		}
		// Another request holds the key now; this response is still the
		// truth about the work this request did.
		o.hook(o.OnFenced, Event{Key: job.Key, Scope: o.Scope, During: "record", Err: err})
	}
	resp.write(w)
}

func (o *MiddlewareOptions) record(ctx context.Context, job *Claimed, resp Response) error {
	record, cancel := recordingContext(ctx)
	defer cancel()
	doc, err := encodeResponse(resp)
	if err != nil {
		return err
	}
	switch o.Classify(resp.Status) {
	case KindComplete:
		return job.Complete(record, json.RawMessage(doc))
	case KindFinal:
		_, err = job.Fail(record, Final(errors.New(string(doc))))
	default:
		_, err = job.Fail(record, Retry(errors.New("HTTP "+strconv.Itoa(resp.Status)), o.RetryIn))
	}
	return err
}

// answer is the response to a key that was not claimed.
func (o *MiddlewareOptions) answer(key string, res Result) Response {
	event := Event{Key: key, Scope: o.Scope, Outcome: res.Outcome()}
	var resp Response
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

// hook calls a logging hook; one that panics changes nothing.
func (o *MiddlewareOptions) hook(fn func(Event), e Event) {
	if fn == nil {
		return
	}
	defer func() { recover() }() //nolint:errcheck
	fn(e)
}
