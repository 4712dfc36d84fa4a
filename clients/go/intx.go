package idempotency

import (
	"context"
	"database/sql"
)

// TxWork runs inside the transaction that claimed the key: its writes on tx
// commit with the stored result, or not at all.
type TxWork func(ctx context.Context, tx *sql.Tx, job *Claimed) (any, error)

// InTx is the in-transaction pattern: BEGIN, claim, fn's writes and the
// complete, COMMIT. A worker that dies before the commit did nothing, and
// the next delivery claims the key again. fn's error rolls everything back,
// the key included (as if the job never came), and is returned; an error
// marked with Final instead keeps the failure (the key fails for good, fn's
// writes are undone) and InTx returns *Failed. Keys that are not claimed
// come back as in Run. The claim's row is locked until the commit: a
// duplicate meanwhile answers *InProgress (or waits, with opts.Wait).
func InTx(ctx context.Context, db *sql.DB, key string, request any, opts *ClaimOptions, fn TxWork) (*Completed, error) {
	o := opts.normalized()
	req, err := jsonParam(request)
	if err != nil {
		return nil, err
	}
	t, err := claimWaiting(ctx, db, waitID("transaction", key, req, o), o.Wait, func(ctx context.Context) (tryResult, error) {
		return beginKey(ctx, db, false, key, req, o)
	})
	if err != nil {
		return nil, err
	}
	job, ok := t.res.(*Claimed)
	if !ok {
		return settled(t.res)
	}
	tx := t.tx
	defer tx.Rollback() //nolint:errcheck // after Commit it does nothing
	value, workErr := fn(ctx, tx, job)
	if workErr != nil {
		if !isFinal(workErr) {
			return nil, workErr
		}
		if _, err := tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT idempotency_work"); err != nil {
			return nil, err
		}
		failed, err := job.fail(ctx, tx, workErr)
		if err != nil {
			return nil, err
		}
		return nil, firstError(wrap(tx.Commit()), failed)
	}
	if err := job.CompleteTx(ctx, tx, value); err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, wrap(err)
	}
	_, result := job.state()
	return &Completed{Result: result}, nil
}
