-- The example's table: one row per order the route handler wrote.
CREATE TABLE IF NOT EXISTS orders (
    id bigserial PRIMARY KEY,
    idempotency_key text NOT NULL,
    item text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
