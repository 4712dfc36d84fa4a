"""A worker process for the takeover tests: claims KEY (lease LEASE
seconds, heartbeat on), prints "claimed", waits for a line on stdin, then in
one fenced transaction inserts a row into `effects` and completes; prints
its outcome and exits."""

import os
import sys

import psycopg

import pg_idempotency as idem

with psycopg.connect() as conn:
    with idem.claim(conn, os.environ["KEY"], lease=float(os.environ["LEASE"])) as job:
        print("claimed", flush=True)
        sys.stdin.readline()
        with job.transaction():
            conn.execute("INSERT INTO effects (key, worker) VALUES (%s, 'late')", (job.key,))
            job.complete({"worker": "late"})
    print(job.outcome, job.error or "", flush=True)
