-- Created by the application role (`app`, which owns the database).

CREATE TABLE invoices (
    id               text   PRIMARY KEY,
    email            text   NOT NULL,
    amount_cents     bigint NOT NULL,
    emailed_at       timestamptz,        -- set by the worker, with the provider's message id
    email_message_id text
);
