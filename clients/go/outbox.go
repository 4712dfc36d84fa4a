package idempotency

import (
	"context"
	"database/sql"
	"encoding/json"
)

// EnqueueOptions: all optional.
type EnqueueOptions struct {
	Key      string // events of one (topic, key) are delivered in order, one at a time
	DedupKey string // enqueue at most once per dedup key
	Headers  any    // a JSON object
}

// Enqueue adds an event to the outbox on q: pass the transaction of the
// business change and the event exists if and only if it commits. It
// returns the event's id.
func Enqueue(ctx context.Context, q Queryer, topic string, payload any, opts *EnqueueOptions) (int64, error) {
	var o EnqueueOptions
	if opts != nil {
		o = *opts
	}
	body, err := jsonParam(payload)
	if err != nil {
		return 0, err
	}
	headers, err := jsonParam(o.Headers)
	if err != nil {
		return 0, err
	}
	var id int64
	err = q.QueryRowContext(ctx, sqlEnqueue, topic, body, nullable(o.Key), headers, nullable(o.DedupKey)).Scan(&id)
	return id, wrap(err)
}

// Delivery is an event handed to a consumer.
type Delivery struct {
	ID       int64
	Topic    string
	Key      string // "" for an event without a key
	Payload  json.RawMessage
	Headers  json.RawMessage // null when none
	DedupKey string
	Attempt  int // 1 the first time
}

// claimDeliveries runs outbox_claim once for the relay name.
func claimDeliveries(ctx context.Context, db *sql.DB, relay string, batch int, o ConsumeOptions, topics any) ([]Delivery, error) {
	rows, err := db.QueryContext(ctx, sqlOutboxClaim, relay, batch, o.Lease.Seconds(), topics)
	if err != nil {
		return nil, wrap(err)
	}
	defer rows.Close()
	var out []Delivery
	for rows.Next() {
		var d Delivery
		var key, headers, dedup sql.NullString
		var payload string
		if err := rows.Scan(&d.ID, &d.Topic, &key, &payload, &headers, &dedup, &d.Attempt); err != nil {
			return nil, err
		}
		d.Key, d.Payload, d.Headers, d.DedupKey = key.String, json.RawMessage(payload), rawJSON(headers), dedup.String
		out = append(out, d)
	}
	return out, wrap(rows.Err())
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}
