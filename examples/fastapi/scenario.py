"""The checks run by check.sh: starts the API (uvicorn on a Unix socket,
with the fault of LEDGER_FAULTS on, and off after the restart), sends requests with and without
Idempotency-Key, concurrent duplicates, a key reused with another body,
refused transfers, a request that kills the server before its commit (then
the server is started again and the request retried), and checks in the
database that each transfer was applied exactly once. Prints one line per
check ("ok ..." / "not ok ...") and exits 1 if any failed.

  scenario.py --admin-dsn DSN --workdir DIR      (the API's database: PG*)
"""
import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg

HERE = Path(__file__).resolve().parent
OPENING = {"acct-a": 100000, "acct-b": 100000, "acct-c": 100000, "acct-poor": 100}


class Checks:
    failed = 0

    def __call__(self, name, ok, detail=""):
        print(f"{'ok' if ok else 'not ok'} - {name}" + (f"\n    {detail}" if not ok and detail else ""), flush=True)
        self.failed += 0 if ok else 1


class Server:
    """uvicorn app:app on a Unix socket; start() waits until it answers."""

    def __init__(self, workdir):
        self.socket = str(workdir / "api.sock")
        self.log = open(workdir / "api.log", "a")
        self.process = None

    def start(self, faults):
        env = {**os.environ, "LEDGER_FAULTS": "1" if faults else ""}
        self.process = subprocess.Popen([sys.executable, "-m", "uvicorn", "app:app", "--uds", self.socket,
                                         "--log-level", "warning"], cwd=HERE, env=env, stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if self.client().get("/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError("the API did not start")

    def client(self):
        return httpx.Client(transport=httpx.HTTPTransport(uds=self.socket), base_url="http://ledger", timeout=30)

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--admin-dsn", required=True)
    parser.add_argument("--workdir", type=Path, required=True)
    args = parser.parse_args()
    check = Checks()
    server = Server(args.workdir)
    server.start(faults=True)
    http = server.client()
    applied = {}     # key: the transfer that must be applied once

    def post(key, body, raw=None):
        headers = {"content-type": "application/json", **({"idempotency-key": key} if key else {})}
        answer = http.post("/transfers", headers=headers, content=raw if raw is not None else json.dumps(body))
        answer.replayed = answer.headers.get("idempotent-replayed") == "true"
        return answer

    try:
        missing = post(None, {"source": "acct-a", "target": "acct-b", "amount": 1})
        check("no Idempotency-Key: 400 with a problem document",
              missing.status_code == 400 and missing.headers["content-type"] == "application/problem+json")

        key = f"t-{uuid.uuid4()}"
        applied[key] = ("acct-a", "acct-b", 500)
        first = post(key, {"source": "acct-a", "target": "acct-b", "amount": 500})
        again = post(key, None, raw='{"amount": 500, "target": "acct-b", "source": "acct-a"}')
        check("a transfer: 201; its retry (the same JSON, other key order) replays it byte for byte",
              first.status_code == 201 and not first.replayed and again.replayed and again.content == first.content,
              f"{first.status_code} {again.status_code} {again.headers}")
        reused = post(key, {"source": "acct-a", "target": "acct-b", "amount": 501})
        check("the key reused with another body: 422", reused.status_code == 422, reused.text)

        key = f"t-{uuid.uuid4()}"
        applied[key] = ("acct-b", "acct-c", 700)
        with ThreadPoolExecutor(10) as pool:
            answers = list(pool.map(lambda _: post(key, {"source": "acct-b", "target": "acct-c", "amount": 700}), range(10)))
        statuses = Counter((a.status_code, a.replayed) for a in answers)
        check("10 concurrent duplicates: one transfer, the others replayed or 409",
              statuses[(201, False)] == 1 and statuses[(201, True)] + statuses[(409, False)] == 9, str(statuses))

        moves = [(f"t-{uuid.uuid4()}", src, dst, 10 + n) for n, (src, dst) in
                 enumerate([("acct-a", "acct-b"), ("acct-b", "acct-a"), ("acct-c", "acct-a"), ("acct-b", "acct-c")] * 5)]
        with ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(lambda m: (m[0], post(m[0], {"source": m[1], "target": m[2], "amount": m[3]})),
                                    [m for m in moves for _ in range(3)]))
        applied.update({k: (s, t, a) for k, s, t, a in moves})
        per_key = {k: [a.status_code for key_, a in answers if key_ == k] for k, *_ in moves}
        check("20 transfers (both directions) sent 3 times each at once: 201 or 409 only",
              all(set(s) <= {201, 409} and 201 in s for s in per_key.values()), str(per_key))

        poor, unknown = f"t-{uuid.uuid4()}", f"t-{uuid.uuid4()}"
        refused = [post(poor, {"source": "acct-poor", "target": "acct-a", "amount": 1000}) for _ in range(2)]
        check("insufficient funds: 402, replayed", [(r.status_code, r.replayed) for r in refused] == [(402, False), (402, True)])
        lost = post(unknown, {"source": "acct-a", "target": "acct-nobody", "amount": 5})
        check("an unknown account: 404", lost.status_code == 404, lost.text)

        crash = f"t-{uuid.uuid4()}"
        body = {"source": "acct-c", "target": "acct-b", "amount": 900, "memo": "crash"}
        try:
            post(crash, body)
            died = False
        except httpx.TransportError:
            died = server.process.wait(10) == 3
        check("the server dies during a transfer, before its commit", died)
        server.start(faults=False)
        http = server.client()
        retried = post(crash, body)
        applied[crash] = ("acct-c", "acct-b", 900)
        check("its retry after the restart runs the transfer (nothing of the first attempt was left)",
              retried.status_code == 201 and not retried.replayed, f"{retried.status_code} {retried.text}")
    finally:
        server.stop()

    with psycopg.connect(args.admin_dsn) as db:
        rows = db.execute("SELECT idempotency_key, source, target, amount FROM transfers").fetchall()
        balances = dict(db.execute("SELECT id, balance FROM accounts").fetchall())
        keys = dict(db.execute("SELECT status::text, count(*) FROM idempotency.idempotency_keys "
                               "WHERE scope = 'ledger.transfer' GROUP BY 1").fetchall())
    counts = Counter(r[0] for r in rows)
    check(f"each transfer applied exactly once ({len(applied)}), the refused ones not at all",
          counts == Counter({k: 1 for k in applied}) and all((s, t, a) == applied[k] for k, s, t, a in rows),
          str(counts))
    expected = dict(OPENING)
    for source, target, amount in applied.values():
        expected[source] -= amount
        expected[target] += amount
    check("balances: the opening balances moved by each transfer once", balances == expected,
          f"got {balances}, want {expected}")
    check("the keys: every transfer completed, the two refusals failed for good",
          keys == {"COMPLETED": len(applied), "FAILED_FINAL": 2}, str(keys))
    print("all checks passed" if check.failed == 0 else f"{check.failed} check(s) failed", flush=True)
    return 0 if check.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
