#!/usr/bin/python3
"""A mock payment API for the chaos test, on 127.0.0.1 only.

POST /charges with an `Idempotency-Key` header and a JSON body
{"amount_cents": N, "job": KEY} applies a charge once per key and stores its
response; a repeated request with the same key replays the stored response
(status 200, header `Idempotent-Replayed: true`) and charges nothing. A
request that reuses a key with another amount gets 422, like real providers.

Faults, decided per key by an RNG seeded with --seed and the key (so a run is
repeatable and the test can tell which keys were meant to fail):
  - with probability --error-rate the key's first request answers 503 without
    charging (a transient failure the worker reports with idem_fail);
  - with probability --timeout-rate the key's first charge is applied and
    stored, and then the answer is held --timeout-sleep seconds, past the
    worker's client timeout: the worker sees a timeout after the charge
    happened and must retry with the same key, which replays.

GET /stats returns what the API did: per key the number of charges applied
and the charge id, and the counts of requests, replays, timeouts and errors.
The port is written to --port-file once the server listens.
"""

import argparse
import json
import os
import random
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Ledger:
    """The provider's own books, guarded by one lock."""

    def __init__(self, seed, error_rate, timeout_rate):
        self.seed, self.error_rate, self.timeout_rate = seed, error_rate, timeout_rate
        self.lock = threading.Lock()
        self.applied = {}      # key -> number of charges applied (must end at 1)
        self.responses = {}    # key -> stored response body
        self.amounts = {}      # key -> amount of the stored charge
        self.requests_seen = {}  # key -> requests received
        self.counts = {"requests": 0, "charges": 0, "replays": 0, "timeouts": 0, "errors": 0,
                       "mismatches": 0}
        self.next_id = 1

    def fault_of(self, key):
        u = random.Random(f"{self.seed}/api/{key}").random()
        if u < self.error_rate:
            return "error"
        if u < self.error_rate + self.timeout_rate:
            return "timeout"
        return None

    def charge(self, key, amount):
        """Returns (status, body, replayed, hold_seconds_flag)."""
        with self.lock:
            self.counts["requests"] += 1
            seen = self.requests_seen.get(key, 0)
            self.requests_seen[key] = seen + 1
            fault = self.fault_of(key)
            if key in self.responses:
                if self.amounts[key] != amount:
                    self.counts["mismatches"] += 1
                    return 422, {"error": "idempotency key reused with another request"}, False, False
                self.counts["replays"] += 1
                return 200, self.responses[key], True, False
            if fault == "error" and seen == 0:
                self.counts["errors"] += 1
                return 503, {"error": "service unavailable (injected)"}, False, False
            charge_id = f"ch_{self.next_id:06d}"
            self.next_id += 1
            body = {"id": charge_id, "amount_cents": amount, "job": key}
            self.applied[key] = self.applied.get(key, 0) + 1
            self.responses[key] = body
            self.amounts[key] = amount
            self.counts["charges"] += 1
            hold = fault == "timeout" and self.applied[key] == 1
            if hold:
                self.counts["timeouts"] += 1
            return 201, body, False, hold

    def stats(self):
        with self.lock:
            return {"applied": dict(self.applied),
                    "charge_ids": {k: v["id"] for k, v in self.responses.items()},
                    **self.counts}


def make_handler(ledger, timeout_sleep):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def reply(self, status, body, replayed=False):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if replayed:
                self.send_header("Idempotent-Replayed", "true")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/stats":
                self.reply(200, ledger.stats())
            elif self.path == "/healthz":
                self.reply(200, {"ok": True})
            else:
                self.reply(404, {"error": "not found"})

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if self.path != "/charges":
                self.reply(404, {"error": "not found"})
                return
            key = self.headers.get("Idempotency-Key")
            try:
                body = json.loads(raw or b"{}")
                amount = int(body["amount_cents"])
            except (ValueError, KeyError, TypeError):
                self.reply(400, {"error": "bad request body"})
                return
            if not key:
                self.reply(400, {"error": "Idempotency-Key is required"})
                return
            status, answer, replayed, hold = ledger.charge(key, amount)
            if hold:
                # The charge is applied and stored; the answer comes too late.
                time.sleep(timeout_sleep)
            try:
                self.reply(status, answer, replayed)
            except OSError:
                pass  # the client gave up waiting: that is the point

    return Handler


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--error-rate", type=float, default=0.04)
    parser.add_argument("--timeout-rate", type=float, default=0.05)
    parser.add_argument("--timeout-sleep", type=float, default=1.0)
    args = parser.parse_args()

    ledger = Ledger(args.seed, args.error_rate, args.timeout_rate)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), make_handler(ledger, args.timeout_sleep))
    server.daemon_threads = True
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(server.server_address[1]))
    os.rename(tmp, args.port_file)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
