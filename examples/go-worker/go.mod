module example.com/go-worker

go 1.19

require (
	github.com/idempotency/idempotency/clients/go v0.0.0
	github.com/lib/pq v1.10.7
)

// The client from this repository's checkout.
replace github.com/idempotency/idempotency/clients/go => ../../clients/go
