// go-worker charges jobs once each, however many workers run them and
// however often a job is delivered: the idempotency extension's key, lease,
// heartbeat and fencing token take the place of a Redis SET NX lock.
//
//	go-worker -name worker-1 -jobs 1-20 -work 200ms
//
// The connection comes from the PG* environment.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	idempotency "github.com/idempotency/idempotency/clients/go"
	_ "github.com/lib/pq"
)

func main() {
	name := flag.String("name", "worker", "this worker's name, recorded with each charge")
	jobs := flag.String("jobs", "1-10", "the job ids to run, as FIRST-LAST")
	work := flag.Duration("work", 200*time.Millisecond, "how long the payment provider takes")
	lease := flag.Duration("lease", 2*time.Second, "the lease on a job; the heartbeat renews it")
	flag.Parse()

	db, err := sql.Open("postgres", "")
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	first, last := jobRange(*jobs)
	for id := first; id <= last && ctx.Err() == nil; id++ {
		done, err := charge(ctx, db, *name, id, *work, *lease)
		switch {
		case err == nil:
			fmt.Printf("job %d: %s (replayed %v)\n", id, done.Result, done.Replayed)
		case errors.Is(err, idempotency.ErrFenced):
			fmt.Printf("job %d: fenced, another worker took it over\n", id)
		default:
			log.Fatalf("job %d: %v", id, err)
		}
	}
}

// charge runs one job: the key is claimed (or the stored result replayed),
// the provider is called with the key as its own idempotency key, and the
// charge is recorded in a transaction fenced by the token.
func charge(ctx context.Context, db *sql.DB, worker string, id int, work, lease time.Duration) (*idempotency.Completed, error) {
	key := fmt.Sprintf("charge-%d", id)
	request := map[string]int{"job": id, "amount": 100 * id}
	opts := &idempotency.ClaimOptions{Scope: "example.charge", Lease: lease, Wait: 30 * time.Second}
	return idempotency.Run(ctx, db, key, request, opts, func(ctx context.Context, job *idempotency.Claimed) (any, error) {
		select { // the payment provider's call
		case <-time.After(work):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return job.Transaction(ctx, func(tx *sql.Tx) (any, error) {
			_, err := tx.ExecContext(ctx, `INSERT INTO charges (job_id, worker) VALUES ($1, $2)`, id, worker)
			return map[string]any{"charged": 100 * id, "by": worker}, err
		})
	})
}

func jobRange(s string) (int, int) {
	a, b, _ := strings.Cut(s, "-")
	first, err1 := strconv.Atoi(a)
	last, err2 := strconv.Atoi(b)
	if err1 != nil || err2 != nil {
		fmt.Fprintln(os.Stderr, "-jobs: FIRST-LAST")
		os.Exit(2)
	}
	return first, last
}
