// Command testworker is a worker process for the client's takeover tests.
// It runs KEY through idempotency.Run (lease LEASE, waiting up to WAIT for
// another holder), prints {"claimed":TOKEN,"attempt":N} once it holds the
// key, waits for a line on stdin (unless FINISH=now), then, in one fenced
// transaction, inserts a row (KEY, NAME) into go_effects and completes. It
// prints {"outcome":"completed"} or {"outcome":"fenced"} and exits; any
// other error exits 1. IDEM_TEST_DRIVER names the driver as for the tests.
package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	idempotency "github.com/idempotency/idempotency/clients/go"
	_ "github.com/jackc/pgx/v4/stdlib"
	_ "github.com/lib/pq"
)

func main() {
	driver := os.Getenv("IDEM_TEST_DRIVER")
	if driver == "" {
		driver = "postgres"
	}
	db, err := sql.Open(driver, os.Getenv("IDEM_TEST_DSN"))
	if err != nil {
		fail(err)
	}
	lease, _ := time.ParseDuration(os.Getenv("LEASE"))
	wait, _ := time.ParseDuration(os.Getenv("WAIT"))
	key, name := os.Getenv("KEY"), os.Getenv("NAME")
	opts := &idempotency.ClaimOptions{Lease: lease, Wait: wait}
	_, err = idempotency.Run(context.Background(), db, key, nil, opts, func(ctx context.Context, job *idempotency.Claimed) (any, error) {
		say(map[string]any{"claimed": job.Token, "attempt": job.Attempt})
		if os.Getenv("FINISH") != "now" {
			bufio.NewReader(os.Stdin).ReadString('\n') //nolint:errcheck // EOF finishes too
		}
		return job.Transaction(context.Background(), func(tx *sql.Tx) (any, error) {
			_, err := tx.Exec(`INSERT INTO go_effects VALUES ($1, $2)`, key, name)
			return map[string]string{"worker": name}, err
		})
	})
	switch {
	case errors.Is(err, idempotency.ErrFenced):
		say(map[string]any{"outcome": "fenced"})
	case err != nil:
		fail(err)
	default:
		say(map[string]any{"outcome": "completed"})
	}
}

func say(v any) {
	line, _ := json.Marshal(v)
	fmt.Println(string(line))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "testworker:", err)
	os.Exit(1)
}
