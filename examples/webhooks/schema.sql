-- The shop's business tables. Created by the application role (`app`,
-- which owns the database); the webhooks themselves live in the extension's
-- outbox, enqueued in the same transactions as these rows.

CREATE TABLE orders (
    id           text        PRIMARY KEY,
    customer     text        NOT NULL,
    amount_cents bigint      NOT NULL CHECK (amount_cents > 0),
    currency     text        NOT NULL DEFAULT 'EUR',
    status       text        NOT NULL CHECK (status IN ('created', 'paid', 'shipped', 'refunded')),
    updated_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE payments (
    id           text        PRIMARY KEY,
    order_id     text        NOT NULL REFERENCES orders,
    amount_cents bigint      NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE refunds (
    id           text        PRIMARY KEY,
    order_id     text        NOT NULL REFERENCES orders,
    reason       text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- The application's own record of the business events it committed, one row
-- per webhook, written in the transaction that enqueues it. It outlives the
-- outbox (delivered events are purged after idempotency.outbox_retention),
-- so reconciliation starts from here.
CREATE TABLE order_events (
    event_id   text        PRIMARY KEY,          -- the webhook's dedup_key and Idempotency-Key
    order_id   text        NOT NULL REFERENCES orders,
    type       text        NOT NULL,             -- order.created, order.paid, order.shipped, order.refunded
    seq        int         NOT NULL,             -- the event's place in its order's life: 1, 2, 3, 4
    outbox_id  bigint      NOT NULL,             -- what outbox_enqueue returned
    created_at timestamptz NOT NULL DEFAULT now(),
    UNIQUE (order_id, seq)
);
