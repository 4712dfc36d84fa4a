package idempotency_test

import (
	"fmt"
	"strings"
	"testing"
)

// The suite runs under the driver IDEM_TEST_DRIVER names: this proves the
// connection really goes through it (a typo would silently test lib/pq).
func TestDriverIsTheOneAskedFor(t *testing.T) {
	db := openDB(t)
	want := map[string]string{"postgres": "*pq.Driver", "pgx": "*stdlib.Driver"}[driverName()]
	if want == "" {
		t.Fatalf("unknown IDEM_TEST_DRIVER %q: postgres or pgx", driverName())
	}
	if got := fmt.Sprintf("%T", db.Driver()); !strings.EqualFold(got, want) {
		t.Fatalf("driver %s, want %s", got, want)
	}
	var version string
	if err := db.QueryRow(`SELECT extversion FROM pg_extension WHERE extname IN ('idempotency', 'idempotency_sql')`).Scan(&version); err != nil || version == "" {
		t.Fatalf("the extension through %s: %q %v", want, version, err)
	}
}
