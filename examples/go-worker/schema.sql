-- The business table of the go-worker example: one row per charge made.
CREATE TABLE IF NOT EXISTS charges (
    job_id int NOT NULL,
    worker text NOT NULL,
    charged_at timestamptz NOT NULL DEFAULT now()
);
