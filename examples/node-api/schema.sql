-- The application's own tables, created by the application role (`app`,
-- which owns the database). The idempotency keys and the job queue are the
-- extension's (schema idempotency); the application never touches them
-- except through its functions.

CREATE TABLE accounts (
    id      text PRIMARY KEY,
    balance bigint NOT NULL CHECK (balance >= 0)          -- in cents
);

-- One row per payment applied to an account. In production you would add
-- UNIQUE (idempotency_key) as a second line of defence; it is left out here
-- so that check.sh would see a payment applied twice if that ever happened.
CREATE TABLE payments (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    idempotency_key text NOT NULL,
    account         text NOT NULL REFERENCES accounts,
    amount          bigint NOT NULL CHECK (amount > 0),
    worker          text NOT NULL,
    started_at      timestamptz NOT NULL,                 -- the worker took the account's lock
    finished_at     timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Demo accounts. `slow-*` accounts live at a slow core bank (see bank.js).
INSERT INTO accounts (id, balance) VALUES
    ('acct-a', 1000000),
    ('acct-b', 1000000),
    ('slow-c', 1000000),
    ('acct-poor', 500);
