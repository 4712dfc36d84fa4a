// Package idempotency is the Go client of the idempotency PostgreSQL
// extension: idempotency keys with leases and fencing tokens, stored
// results replayed to duplicates, net/http middleware for the
// Idempotency-Key header, and an outbox consumer. It runs on database/sql
// and imports no driver: use pgx's stdlib, lib/pq or any other.
//
//   - Claim, and the *Claimed it returns: KeepAlive (the heartbeat),
//     AssertOwner, Complete, Fail, Release, Transaction; all fenced by the
//     token.
//   - Run (the worker pattern) and InTx (the in-transaction pattern).
//   - Middleware, for net/http (and what adapts it: Fiber's adaptor, chi,
//     echo's WrapMiddleware), in claim, transaction or register mode;
//     ClaimOf, TxOf and RequestOf in the handler.
//   - Enqueue and Consume, for the outbox used as a job queue.
//   - StartMaintenance, the SQL edition's sweeps (idem_maintenance) on an
//     interval.
//
// Errors are values that errors.Is recognises: ErrFenced (SQLSTATE IK001),
// ErrNotFound (IK002), ErrWrongState (IK003), ErrMismatch, ErrInProgress,
// ErrRetryLater, ErrFailed, ErrReleased.
package idempotency
