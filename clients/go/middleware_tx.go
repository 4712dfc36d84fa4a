package idempotency

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
)

// serveTx runs the handler of the transaction and register modes on the
// request's open transaction, then settles it by the response:
//
//	                     transaction mode                      register mode
//	complete (1xx-3xx)   idem_complete with the response,      COMMIT: the key stays
//	                     COMMIT with the handler's writes      RECEIVED for the worker
//	final (other 4xx)    the writes undone, the failure and    ROLLBACK: nothing
//	                     its response kept (replayed)          registered
//	retryable (5xx...)   ROLLBACK: as if the request never     ROLLBACK
//	                     came; the retry runs anew
//
// After a step whose result could not be stored (StepTx), the response is
// final whatever its status: the step's function would otherwise run again
// at every attempt. The response is sent only once that is done; if the
// commit fails, the client gets a 500 (the writes are gone, the response
// would not be true).
// A handler that panics rolls everything back; the panic goes on. The
// transaction belongs to the request's context: a client that goes away
// rolls it back.
func (o *MiddlewareOptions) serveTx(w http.ResponseWriter, r *http.Request, next http.Handler, key string, st *requestState) {
	tx := st.tx
	defer tx.Rollback() //nolint:errcheck // after Commit it does nothing
	rec := newRecorder()
	next.ServeHTTP(rec, r.WithContext(context.WithValue(r.Context(), stateKey{}, st)))
	resp := rec.response()
	if err := o.settleTx(r.Context(), st, resp); err != nil {
		if errors.Is(err, ErrFenced) {
			o.hook(o.OnFenced, Event{Key: key, Scope: o.Scope, Mode: o.Mode, During: "record", Err: err})
		} else if r.Context().Err() == nil { // a client that went away rolls back on purpose
			o.report("recording the response", key, err)
		}
		Problem(http.StatusInternalServerError, "Internal error", "The response could not be recorded.").write(w)
		return
	}
	resp.write(w)
}

func (o *MiddlewareOptions) settleTx(ctx context.Context, st *requestState, resp Response) error {
	tx, job := st.tx, st.claim
	kind := o.classify(job, resp)
	if kind == KindRetryable || (job == nil && kind != KindComplete) {
		tx.Rollback() //nolint:errcheck // undone either way: an error means the server already did it
		return nil
	}
	if job == nil { // register mode: the key and the handler's job
		return wrap(tx.Commit())
	}
	doc, err := encodeResponse(resp)
	if err != nil {
		return err
	}
	if kind == KindComplete {
		err = job.CompleteTx(ctx, tx, json.RawMessage(doc))
	} else {
		if _, err = tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT idempotency_work"); err == nil {
			_, err = job.fail(ctx, tx, Final(errors.New(string(doc))))
		}
	}
	if err != nil {
		return err
	}
	return wrap(tx.Commit())
}
