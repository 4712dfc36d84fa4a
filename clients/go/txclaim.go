package idempotency

import (
	"context"
	"database/sql"
)

// outcomeRegistered: idem_register took a new key (register mode); a worker
// claims it later.
const outcomeRegistered Outcome = "registered"

// registered is register mode's own answer: the key is new and this
// request's transaction holds it.
type registered struct{}

func (*registered) Outcome() Outcome { return outcomeRegistered }

// beginKey is one try of the transaction and register modes (and InTx):
// BEGIN and the claim (or register) on one connection. When the key is
// ours the transaction stays open, after a savepoint that a final failure
// rolls back to; otherwise it commits (nothing was written) and the
// connection goes back to the pool.
func beginKey(ctx context.Context, db *sql.DB, register bool, key string, req any, o ClaimOptions) (tryResult, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return tryResult{}, err
	}
	var r Result
	if register {
		r, err = registerOnce(ctx, tx, key, req, o)
	} else {
		r, err = claimOnce(ctx, tx, key, req, o)
	}
	if err == nil && held(r) {
		if _, err = tx.ExecContext(ctx, "SAVEPOINT idempotency_work"); err == nil {
			if c, ok := r.(*Claimed); ok {
				c.db = db
			}
			return tryResult{res: r, tx: tx, abandon: func() { tx.Rollback() }}, nil //nolint:errcheck
		}
	}
	if err == nil {
		err = tx.Commit()
	}
	tx.Rollback() //nolint:errcheck // after Commit it does nothing
	if err != nil {
		return tryResult{}, wrap(err)
	}
	return tryResult{res: r}, nil
}
