#!/usr/bin/python3
"""A mock provider for the chaos test, on 127.0.0.1 only: the payment API
(POST /charges) or, in a second instance, the mail API (POST /emails).

A POST with an `Idempotency-Key` header and a JSON body that names its
"job" ({"amount_cents": N, "job": KEY} for a charge, {"to": ADDRESS, "job":
KEY, ...} for an email) takes effect once per idempotency key (a charge
applied, an email sent) and stores its response; a repeated request with
the same key replays the stored response (status 200, header
`Idempotent-Replayed: true`) and does nothing. A request that reuses a key
with another body gets 422, like real providers.

Faults, decided per key by an RNG seeded with --seed, the resource and the
key (so a run is repeatable and the test can tell which keys were meant to
fail):
  - with probability --error-rate the key's first request answers 503
    without taking effect (a transient failure the worker reports with
    idem_fail);
  - with probability --timeout-rate the key's first request takes effect
    and is stored, and then the answer is held --timeout-sleep seconds, past
    the worker's client timeout: the worker sees a timeout after the effect
    happened and must retry with the same key, which replays.

GET /stats returns what the provider did, per idempotency key: the effects
applied (`applied`, which must end at 1), the id it issued (`ids`), the job
the request named (`jobs`) and the raw requests received (`requests_by_key`);
and the counts of requests, effects, replays, timeouts and errors. The port
is written to --port-file once the server listens.
"""

import argparse
import json
import os
import random
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


# What each resource issues, and what its body must carry besides "job".
RESOURCES = {"charges": ("ch", "amount_cents"), "emails": ("msg", "to")}


class Ledger:
    """The provider's own books, guarded by one lock."""

    def __init__(self, resource, seed, error_rate, timeout_rate):
        self.resource = resource
        self.id_prefix = RESOURCES[resource][0]
        # The payment API's faults are drawn as they were before the mail
        # API existed, so that a seed repeats the same run.
        self.fault_label = "api" if resource == "charges" else resource
        self.seed, self.error_rate, self.timeout_rate = seed, error_rate, timeout_rate
        self.lock = threading.Lock()
        self.applied = {}      # key -> number of effects applied (must end at 1)
        self.responses = {}    # key -> stored response body
        self.bodies = {}       # key -> the request that took effect
        self.jobs = {}         # key -> the job its first request named
        self.requests_seen = {}  # key -> requests received
        self.counts = {"requests": 0, "effects": 0, "replays": 0, "timeouts": 0, "errors": 0,
                       "mismatches": 0}
        self.next_id = 1

    def fault_of(self, key):
        u = random.Random(f"{self.seed}/{self.fault_label}/{key}").random()
        if u < self.error_rate:
            return "error"
        if u < self.error_rate + self.timeout_rate:
            return "timeout"
        return None

    def apply(self, key, body):
        """Returns (status, body, replayed, hold_seconds_flag)."""
        with self.lock:
            self.counts["requests"] += 1
            seen = self.requests_seen.get(key, 0)
            self.requests_seen[key] = seen + 1
            self.jobs.setdefault(key, body["job"])
            fault = self.fault_of(key)
            if key in self.responses:
                if self.bodies[key] != body:
                    self.counts["mismatches"] += 1
                    return 422, {"error": "idempotency key reused with another request"}, False, False
                self.counts["replays"] += 1
                return 200, self.responses[key], True, False
            if fault == "error" and seen == 0:
                self.counts["errors"] += 1
                return 503, {"error": "service unavailable (injected)"}, False, False
            answer = dict(body, id=f"{self.id_prefix}_{self.next_id:06d}")
            self.next_id += 1
            self.applied[key] = self.applied.get(key, 0) + 1
            self.responses[key] = answer
            self.bodies[key] = body
            self.counts["effects"] += 1
            hold = fault == "timeout" and self.applied[key] == 1
            if hold:
                self.counts["timeouts"] += 1
            return 201, answer, False, hold

    def stats(self):
        with self.lock:
            return {"applied": dict(self.applied),
                    "ids": {k: v["id"] for k, v in self.responses.items()},
                    "jobs": dict(self.jobs),
                    "requests_by_key": dict(self.requests_seen),
                    **self.counts}


def read_body(raw, resource):
    """The request's JSON object, or None when it lacks what the resource
    needs (the job, and an integer amount or an address)."""
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        return None
    field = RESOURCES[resource][1]
    if not isinstance(body, dict) or not isinstance(body.get("job"), str) or field not in body:
        return None
    if resource == "charges" and not isinstance(body[field], int):
        return None
    return body


def make_handler(ledger, timeout_sleep):
    path = "/" + ledger.resource

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
            if self.path != path:
                self.reply(404, {"error": "not found"})
                return
            key = self.headers.get("Idempotency-Key")
            body = read_body(raw, ledger.resource)
            if body is None:
                self.reply(400, {"error": "bad request body"})
                return
            if not key:
                self.reply(400, {"error": "Idempotency-Key is required"})
                return
            status, answer, replayed, hold = ledger.apply(key, body)
            if hold:
                # The effect is applied and stored; the answer comes too late.
                time.sleep(timeout_sleep)
            try:
                self.reply(status, answer, replayed)
            except OSError:
                pass  # the client gave up waiting: that is the point

    return Handler


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resource", choices=sorted(RESOURCES), default="charges")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--error-rate", type=float, default=0.04)
    parser.add_argument("--timeout-rate", type=float, default=0.05)
    parser.add_argument("--timeout-sleep", type=float, default=1.0)
    args = parser.parse_args()

    ledger = Ledger(args.resource, args.seed, args.error_rate, args.timeout_rate)
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
