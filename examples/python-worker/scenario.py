"""The scenario check.sh runs: a billing run enqueues ten invoice e-mails
whose sends succeed, fail for a while, fail for good, time out after
sending, or outlast a worker that is killed; a second billing run enqueues
three of them again. Workers (worker.py, separate processes) drain the
queue against a scripted provider (provider.py). Then the final states are
checked: keys, invoices, the provider's sends, the dead letters.

  scenario.py --dsn DSN --ops-dsn DSN --admin-dsn DSN --workdir DIR

Prints one line per check; exits 1 if one fails.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psycopg2

from provider import Provider
from worker import SCOPE, TOPIC

HERE = Path(__file__).resolve().parent

# invoice id -> recipient (the provider's behaviour, see provider.py)
INVOICES = {f"inv-{n}": f"ok{n}@example.com" for n in range(1, 6)}
INVOICES.update({"inv-6": "flaky@example.com", "inv-7": "bounce@example.com", "inv-8": "down@example.com",
                 "inv-9": "lost@example.com", "inv-10": "slow@example.com"})
# invoice id -> (final key status, attempts)
EXPECTED = {f"inv-{n}": ("COMPLETED", 1) for n in range(1, 6)}
EXPECTED.update({"inv-6": ("COMPLETED", 3),      # 503, 503, sent: retried after backoff
                 "inv-7": ("FAILED_FINAL", 1),   # 422: final at once
                 "inv-8": ("FAILED_FINAL", 3),   # 503 until idempotency.max_attempts (3)
                 "inv-9": ("COMPLETED", 2),      # timed out after sending; the retry is deduplicated
                 "inv-10": ("COMPLETED", 2)})    # its worker was killed; taken over after the lease


def key_of(invoice_id):
    return f"{invoice_id}/email"


def job(invoice_id):
    return {"idempotency_key": key_of(invoice_id), "invoice_id": invoice_id, "to": INVOICES[invoice_id],
            "amount_cents": 1000 + int(invoice_id.split("-")[1])}


def billing_run(conn, run, invoice_ids, create):
    """Each invoice and its e-mail job in one transaction."""
    for invoice_id in invoice_ids:
        payload = job(invoice_id)
        with conn, conn.cursor() as cur:
            if create:
                cur.execute("INSERT INTO invoices (id, email, amount_cents) VALUES (%s, %s, %s)",
                            (invoice_id, payload["to"], payload["amount_cents"]))
            cur.execute("SELECT idempotency.outbox_enqueue(%s, %s, dedup_key => %s)",
                        (TOPIC, json.dumps(payload), f"{run}/{invoice_id}"))


class Checks:
    def __init__(self):
        self.failed = 0

    def __call__(self, name, ok, detail=""):
        print(f"{'ok' if ok else 'not ok'} - {name}" + (f"\n    {detail}" if not ok and detail else ""), flush=True)
        self.failed += 0 if ok else 1


def wait_for(what, predicate, timeout):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--ops-dsn", required=True)
    parser.add_argument("--admin-dsn", required=True)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()
    # On SIGTERM, unwind (the finally below stops the workers) and exit.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    workdir = Path(args.workdir)
    check = Checks()

    provider = Provider(log_path=workdir / "provider.jsonl").start()
    conn = psycopg2.connect(args.dsn)
    oncall = psycopg2.connect(args.ops_dsn)
    workers = {}

    def start_worker(name):
        log = open(workdir / f"{name}.log", "w")
        workers[name] = subprocess.Popen(
            [sys.executable, str(HERE / "worker.py"), "--dsn", args.dsn, "--provider-url", provider.url,
             "--name", name, "--key-lease", "3", "--job-lease", "4", "--http-timeout", "1", "--poll", "0.5"],
            stdout=log, stderr=subprocess.STDOUT)

    def live_jobs():
        with oncall, oncall.cursor() as cur:
            cur.execute("""SELECT count(*) FROM idempotency.outbox_lag WHERE topic = %s
                            AND pending + in_flight + retrying > 0""", (TOPIC,))
            return cur.fetchone()[0]

    try:
        billing_run(conn, "billing-run-1", INVOICES, create=True)

        # One worker first; kill it (SIGKILL) while it waits on the slow send.
        start_worker("worker-1")
        wait_for("the slow send", lambda: any(c["to"].startswith("slow@") for c in provider.calls), 60)
        workers["worker-1"].kill()
        workers["worker-1"].wait()
        print("killed worker-1 during the slow send", flush=True)

        # A second billing run enqueues three of the e-mails again (new
        # dedup keys, same jobs): duplicates for the workers to answer.
        billing_run(conn, "billing-run-2", ["inv-1", "inv-2", "inv-3"], create=False)

        start_worker("worker-2")
        start_worker("worker-3")
        wait_for("the queue to drain", lambda: live_jobs() == 0, 60)

        for name in ("worker-2", "worker-3"):
            workers[name].send_signal(signal.SIGTERM)
        for name in ("worker-2", "worker-3"):
            try:
                status = workers[name].wait(timeout=15)
            except subprocess.TimeoutExpired:
                status = "timeout"
            check(f"{name} exits 0 on SIGTERM", status == 0, f"status {status}")
    finally:
        for child in workers.values():
            if child.poll() is None:
                child.kill()
                child.wait()

    # ------------------------------------------------------------ final states
    admin = psycopg2.connect(args.admin_dsn)
    with admin, admin.cursor() as cur:
        cur.execute("""SELECT key, status::text, attempts, result, last_error
                         FROM idempotency.idempotency_keys WHERE scope = %s""", (SCOPE,))
        keys = {row[0]: row[1:] for row in cur.fetchall()}
        cur.execute("SELECT id, email_message_id FROM invoices")
        emailed = dict(cur.fetchall())
        cur.execute("SELECT state::text, count(*) FROM idempotency.outbox WHERE topic = %s GROUP BY 1", (TOPIC,))
        outbox = dict(cur.fetchall())
        cur.execute("SELECT replays FROM idempotency.idem_metrics")
        replays = cur.fetchone()[0]

    states = {i: keys.get(key_of(i), (None, None))[:2] for i in INVOICES}
    wrong = {i: states[i] for i in INVOICES if states[i] != EXPECTED[i]}
    check("each key's final state and attempts: 5 sent at once, flaky sent after 3 attempts, bounce failed "
          "at once, down failed after 3, lost and slow sent on their 2nd attempt", not wrong,
          f"got {wrong}, want { {i: EXPECTED[i] for i in wrong} }")

    sends = Counter(c["key"] for c in provider.calls if c["new"])
    should_send = [key_of(i) for i in INVOICES if EXPECTED[i][0] == "COMPLETED"]
    check(f"the provider sent each completed invoice exactly once ({len(should_send)}), the failed ones never",
          sorted(sends) == sorted(should_send) and set(sends.values()) == {1}, f"sends: {dict(sends)}")

    results = {i: (keys[key_of(i)][2] or {}).get("message_id") for i in INVOICES if key_of(i) in keys}
    provider_ids = {i: provider.messages.get(key_of(i)) for i in INVOICES}
    check("stored results, invoices and the provider agree on every message id",
          all(results.get(i) == provider_ids[i] == emailed[i] for i in INVOICES),
          f"results {results}, provider {provider_ids}, invoices {emailed}")

    calls = Counter(c["key"] for c in provider.calls)
    check("the second billing run's duplicates were replayed, not sent again (1 call each for inv-1..3)",
          all(calls[key_of(i)] == 1 for i in ("inv-1", "inv-2", "inv-3")) and replays >= 3,
          f"calls {dict(calls)}, replays {replays}")
    logs = "".join((workdir / f"worker-{n}.log").read_text() for n in (2, 3))
    check("the workers answered the 3 duplicates from the stored results",
          logs.count("(replayed)") == 3, logs[-2000:])

    flaky = [c["t"] for c in provider.calls if c["key"] == key_of("inv-6")]
    gaps = [b - a for a, b in zip(flaky, flaky[1:])]
    # retry_base_delay 300ms: the n-th backoff is drawn from [150, 300] ms * 2^(n-1).
    check("retries waited for their backoff (flaky: 3 calls, gaps >= 0.15 s and >= 0.3 s)",
          len(gaps) == 2 and gaps[0] >= 0.14 and gaps[1] >= 0.29, f"gaps {gaps}")
    check("down was tried idempotency.max_attempts (3) times", calls[key_of("inv-8")] == 3, f"{calls}")
    check("lost: the retry after the timeout got the first send's message back",
          calls[key_of("inv-9")] == 2 and sends[key_of("inv-9")] == 1)
    check("bounce's error is recorded on its key", "422" in (keys[key_of("inv-7")][3] or ""), str(keys[key_of("inv-7")]))

    check("outbox: 13 jobs, 11 delivered, 2 dead", outbox == {"delivered": 11, "dead": 2}, str(outbox))
    report = subprocess.run([sys.executable, str(HERE / "deadletters.py"), "--dsn", args.ops_dsn, "--json"],
                            capture_output=True, text=True, timeout=30)
    found = json.loads(report.stdout) if report.returncode == 0 else {"dead_letters": [], "stuck": [report.stderr]}
    dead = {d["key"]: (d["key_status"], d["key_attempts"]) for d in found["dead_letters"]}
    check("deadletters.py (as a pg_monitor member) lists bounce and down, their keys FAILED_FINAL",
          dead == {key_of("inv-7"): ("FAILED_FINAL", 1), key_of("inv-8"): ("FAILED_FINAL", 3)}, str(found))
    check("no stuck key", found["stuck"] == [], str(found["stuck"]))
    text = subprocess.run([sys.executable, str(HERE / "deadletters.py"), "--dsn", args.ops_dsn],
                          capture_output=True, text=True, timeout=30).stdout
    print(text, end="")

    provider.stop()
    return 0 if check.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
