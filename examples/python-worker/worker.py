"""The invoice e-mail worker: takes jobs from the outbox (topic
invoice.email) and sends each invoice once, although jobs are handed out at
least once (a job whose worker died comes back when its lease ends; a
producer may enqueue the same job twice). The Python client does the rest:
``Consumer`` claims, acks and nacks the jobs; ``claim`` holds the job's key
(scope invoice.email) under a heartbeat, and a duplicate of finished work
gets the stored result (replayed, nothing sent). A claimed job is sent with
the key as the provider's own Idempotency-Key (a retry of a call whose
response was lost does not send twice); then, in one transaction, the fence,
the invoice marked e-mailed and the result. Timeouts, 5xx, 408/425/429 and
connection errors are retried after the key's backoff (FAILED_FINAL and a
dead letter after idempotency.max_attempts); other 4xx fail for good at once.

  worker.py --dsn DSN --provider-url URL [--name NAME] [--key-lease 30]
            [--job-lease 60] [--http-timeout 5] [--poll 1]
Stops after the job in hand on SIGTERM or SIGINT (exit 0).
"""
import argparse
import json
import os
import signal
import socket
import sys
import urllib.error
import urllib.request

import psycopg

import pg_idempotency as idem

SCOPE = "invoice.email"
TOPIC = "invoice.email"


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
            raise idem.RetryableError(detail) from err
        raise idem.FinalError(detail) from err
    except (urllib.error.URLError, socket.timeout, ConnectionError) as err:
        # Also a timeout: the e-mail may have been sent. The retry carries the
        # same Idempotency-Key, so the provider will not send it twice.
        raise idem.RetryableError(f"no answer from the provider: {getattr(err, 'reason', err)}") from err


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
    conn = psycopg.connect(args.dsn, autocommit=True, application_name=args.name)

    def log(message):
        print(f"[{args.name}] {message}", flush=True)

    def handle(event):
        payload = event["payload"]
        key = payload["idempotency_key"]
        try:
            with idem.claim(conn, key, payload, scope=SCOPE, lease=args.key_lease) as job:
                message_id = send_email(args.provider_url, key, payload, args.http_timeout)
                with job.transaction():
                    conn.execute("UPDATE invoices SET emailed_at = now(), email_message_id = %s WHERE id = %s",
                                 (message_id, payload["invoice_id"]))
                    job.complete({"message_id": message_id})
        except idem.NotClaimed as answer:      # a duplicate: nothing is sent, the answer is the claim's
            job = answer.job
        if job.outcome == "failed":
            log(f"{key}: {job.error}; " + (f"retry in {job.retry_after:.2f} s" if job.retryable else "failed for good"))
        else:
            log(f"{key}: {job.outcome}" + (f" as {job.result['message_id']}" if job.outcome == "completed" else "")
                + (" (replayed)" if job.replayed else ""))
        return job

    consumer = idem.Consumer(args.dsn, [TOPIC], name=args.name, lease=args.job_lease, poll=args.poll, log=log)
    signal.signal(signal.SIGTERM, lambda signum, frame: consumer.stop())
    signal.signal(signal.SIGINT, lambda signum, frame: consumer.stop())
    log("started")
    consumer.run(handle)
    conn.close()
    log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
