-- Created by the application role (`app`, which owns the database).

CREATE TABLE accounts (
    id      text PRIMARY KEY,
    balance bigint NOT NULL CHECK (balance >= 0)     -- in cents
);

-- One row per transfer applied. In production you would add UNIQUE
-- (idempotency_key) as a second line of defence; it is left out here so
-- that check.sh would see a transfer applied twice if that ever happened.
CREATE TABLE transfers (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    idempotency_key text NOT NULL,
    source          text NOT NULL REFERENCES accounts,
    target          text NOT NULL REFERENCES accounts,
    amount          bigint NOT NULL CHECK (amount > 0),
    created_at      timestamptz NOT NULL DEFAULT now()
);

INSERT INTO accounts (id, balance) VALUES
    ('acct-a', 100000), ('acct-b', 100000), ('acct-c', 100000), ('acct-poor', 100);
