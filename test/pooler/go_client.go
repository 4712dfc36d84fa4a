// The Go client through a pooler in transaction mode: Run over 40 keys,
// each three times from concurrent goroutines, on a *sql.DB whose
// connections reach the server through PgBouncer while another application
// shares its pool. Built inside a copy of clients/go (package main of its
// own folder). Arguments: the driver ("postgres": lib/pq, "pgx": pgx's
// stdlib), the data source name and a label for the keys of this run. Prints one line, "ok ..." or
// "not ok ...", and exits 1 on a failure.
package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"sync"

	idempotency "github.com/idempotency/idempotency/clients/go"
	_ "github.com/jackc/pgx/v4/stdlib"
	_ "github.com/lib/pq"
)

func main() {
	driver, dsn, label := os.Args[1], os.Args[2], os.Args[3]
	db, err := sql.Open(driver, dsn)
	if err != nil {
		fmt.Printf("not ok go (%s): open: %v\n", label, err)
		os.Exit(1)
	}
	db.SetMaxOpenConns(4)
	defer db.Close()
	ctx := context.Background()
	var mu sync.Mutex
	runs := map[string]int{}
	var failures []string
	var wg sync.WaitGroup
	for worker := 0; worker < 4; worker++ {
		wg.Add(1)
		go func(worker int) {
			defer wg.Done()
			for round := 0; round < 30; round++ {
				key := fmt.Sprintf("go-%s-%d", label, (worker*30+round)%40)
				_, err := idempotency.Run(ctx, db, key, nil, &idempotency.ClaimOptions{Scope: "pooler", Wait: 10e9},
					func(ctx context.Context, job *idempotency.Claimed) (any, error) {
						mu.Lock()
						runs[key]++
						mu.Unlock()
						return map[string]bool{"ok": true}, nil
					})
				if err != nil {
					mu.Lock()
					failures = append(failures, err.Error())
					mu.Unlock()
				}
			}
		}(worker)
	}
	wg.Wait()
	once := len(runs) == 40
	for _, n := range runs {
		once = once && n == 1
	}
	if len(failures) > 0 || !once {
		first := ""
		if len(failures) > 0 {
			first = failures[0]
		}
		fmt.Printf("not ok go (%s): 120 runs over 40 keys, each key's work once (%d keys run, %d errors: %s)\n",
			label, len(runs), len(failures), first)
		os.Exit(1)
	}
	fmt.Printf("ok go (%s): 120 runs over 40 keys, each key's work once, no error\n", label)
}
