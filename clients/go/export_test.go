package idempotency

import "time"

// SetRecordPatience sets how long a record tries at least, for a test that
// cannot wait for the default; the function it returns restores it.
func SetRecordPatience(d time.Duration) (restore func()) {
	old := recordPatience
	recordPatience = d
	return func() { recordPatience = old }
}
