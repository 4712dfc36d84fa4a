"""The invoice e-mail worker: takes jobs from the outbox (topic
invoice.email) and sends each invoice once, although jobs are handed out at
least once (a job whose worker died comes back when its lease ends; a
producer may enqueue the same job twice).

For each job, with the job's idempotency key (scope invoice.email):

  idem_claim   `claimed`: send it. `completed`: a duplicate of finished work;
               the stored result is the answer (replayed, nothing sent, the
               job acked). `failed`: the job is already dead; acked.
               `in_progress`/`retry_later`: back to the queue until then.
  send         through the provider's API with the same key as ITS
               Idempotency-Key, so that a retry of a call whose response was
               lost does not send twice.
  success      one transaction: idem_assert_owner (fence), the invoice marked
               e-mailed, idem_complete with the result; then the job is acked.
  retryable    timeouts, 5xx, 408/425/429, connection errors: idem_fail
               (retryable) and the job comes back when the key's backoff has
               passed; after idempotency.max_attempts the key is FAILED_FINAL
               and the job goes to the dead letters.
  final        other 4xx: idem_fail(retryable => false): FAILED_FINAL, dead letter.

  worker.py --dsn DSN --provider-url URL [--name NAME] [--key-lease 30]
            [--job-lease 60] [--http-timeout 5] [--poll 1]
Stops after the job in hand on SIGTERM or SIGINT (exit 0).
"""
import argparse
import json
import os
import select
import signal
import socket
import sys
import urllib.error
import urllib.request

import psycopg2
import psycopg2.errors

SCOPE = "invoice.email"
TOPIC = "invoice.email"


class RetryableError(Exception):
    pass


class FinalError(Exception):
    pass


def send_email(provider_url, key, job, timeout):
    """Sends the invoice through the provider; returns its message id."""
    request = urllib.request.Request(
        provider_url, method="POST",
        data=json.dumps({"to": job["to"], "subject": f"Invoice {job['invoice_id']}",
                         "text": f"Amount due: {job['amount_cents'] / 100:.2f}"}).encode(),
        headers={"Content-Type": "application/json", "Idempotency-Key": key})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.load(response)["id"]
    except urllib.error.HTTPError as err:
        detail = f"provider answered {err.code}: {err.read().decode(errors='replace')[:200]}"
        if err.code >= 500 or err.code in (408, 425, 429):
            raise RetryableError(detail) from err
        raise FinalError(detail) from err
    except (urllib.error.URLError, socket.timeout, ConnectionError) as err:
        # Also a timeout: the e-mail may have been sent. The retry carries the
        # same Idempotency-Key, so the provider will not send it twice.
        raise RetryableError(f"no answer from the provider: {getattr(err, 'reason', err)}") from err


class Worker:
    def __init__(self, args):
        self.args = args
        self.name = args.name
        self.conn = psycopg2.connect(args.dsn, application_name=self.name)
        self.stopping = False

    def log(self, message):
        print(f"[{self.name}] {message}", flush=True)

    def query(self, sql, params=()):
        """One statement in its own transaction; returns the first row."""
        with self.conn, self.conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchone() if cur.description else None

    def ack(self, job_id):
        self.query("SELECT idempotency.outbox_ack(ARRAY[%s]::bigint[])", (job_id,))

    def nack(self, job_id, error, retryable, retry_in_seconds=None):
        self.query(
            """SELECT idempotency.outbox_nack(%s, %s, retryable => %s,
                                             retry_in => make_interval(secs => %s))""",
            (job_id, error, retryable, retry_in_seconds))

    def handle(self, job_id, job):
        key = job["idempotency_key"]
        outcome, token, result, error, retry_after = self.query(
            """SELECT outcome, token, result, error, extract(epoch FROM retry_after)::float8
                 FROM idempotency.idem_claim(%s, %s, lease => make_interval(secs => %s), scope => %s)""",
            (key, json.dumps(job), self.args.key_lease, SCOPE))

        if outcome == "completed":
            self.log(f"{key}: duplicate, already sent as {result['message_id']} (replayed)")
            return self.ack(job_id)
        if outcome == "failed":
            self.log(f"{key}: duplicate of a failed job ({error})")
            return self.ack(job_id)
        if outcome in ("in_progress", "retry_later"):
            return self.nack(job_id, f"key {outcome}", True, retry_after)
        if outcome == "mismatch":
            return self.nack(job_id, "the job does not match the request its key was claimed with", False)

        try:
            message_id = send_email(self.args.provider_url, key, job, self.args.http_timeout)
        except (RetryableError, FinalError) as err:
            return self.fail(job_id, key, token, err)

        try:
            with self.conn, self.conn.cursor() as cur:
                # The fence: IK001, and a rollback, if our lease ran out and
                # someone claimed the key since.
                cur.execute("SELECT idempotency.idem_assert_owner(%s, %s, scope => %s)", (key, token, SCOPE))
                cur.execute(
                    "UPDATE invoices SET emailed_at = now(), email_message_id = %s WHERE id = %s",
                    (message_id, job["invoice_id"]))
                cur.execute(
                    "SELECT idempotency.idem_complete(%s, %s, %s, scope => %s)",
                    (key, token, json.dumps({"message_id": message_id}), SCOPE))
        except psycopg2.Error as err:
            if err.pgcode != "IK001":
                raise
            # Stale token: our lease ran out and another worker claimed the
            # key. It holds the job's redelivered event and completes it
            # (sending with the same key returns the same message).
            self.log(f"{key}: fenced; the key was claimed by another worker")
            return
        self.ack(job_id)
        self.log(f"{key}: sent as {message_id}")

    def fail(self, job_id, key, token, err):
        retryable = isinstance(err, RetryableError)
        with self.conn, self.conn.cursor() as cur:
            cur.execute("SELECT idempotency.idem_fail(%s, %s, %s, retryable => %s, scope => %s)",
                        (key, token, str(err), retryable, SCOPE))
            status = cur.fetchone()[0]
            cur.execute(
                """SELECT extract(epoch FROM next_attempt_at - clock_timestamp())::float8
                     FROM idempotency.idem_get(%s, %s)""", (key, SCOPE))
            retry_in = cur.fetchone()[0]
        if status == "FAILED_RETRYABLE":
            # The job comes back when the key may be claimed again.
            self.nack(job_id, str(err), True, max(0.0, retry_in))
            self.log(f"{key}: {err}; retry in {retry_in:.2f} s")
        else:
            self.nack(job_id, str(err), False)  # FAILED_FINAL: to the dead letters
            self.log(f"{key}: {err}; failed for good")

    def run(self):
        listener = psycopg2.connect(self.args.dsn, application_name=f"{self.name} listener")
        listener.autocommit = True
        listener.cursor().execute("LISTEN idempotency_outbox")
        self.log("started")
        while not self.stopping:
            row = self.query(
                """SELECT id, payload FROM idempotency.outbox_claim(
                       %s, batch => 1, lease => make_interval(secs => %s), topics => ARRAY[%s])""",
                (self.name, self.args.job_lease, TOPIC))
            if row:
                # One job at a time: a bigger batch would hold jobs in flight
                # that another worker could be running.
                self.handle(*row)
                continue
            # Nothing due: wait for a notification of a new job, or poll.
            if select.select([listener], [], [], self.args.poll)[0]:
                listener.poll()
                listener.notifies.clear()
        listener.close()
        self.conn.close()
        self.log("stopped")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", default="", help="libpq connection string (default: the PG* environment)")
    parser.add_argument("--provider-url", required=True)
    parser.add_argument("--name", default=f"worker-{os.getpid()}")
    parser.add_argument("--key-lease", type=float, default=30, help="seconds")
    parser.add_argument("--job-lease", type=float, default=60, help="seconds")
    parser.add_argument("--http-timeout", type=float, default=5, help="seconds")
    parser.add_argument("--poll", type=float, default=1, help="seconds between polls without notification")
    args = parser.parse_args()
    if args.http_timeout >= args.key_lease:
        parser.error("--http-timeout must be shorter than --key-lease")

    worker = Worker(args)

    def stop(signum, frame):
        worker.stopping = True
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    worker.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
