"""The partner: a fulfilment company's webhook endpoint on 127.0.0.1
(Python standard library only), with its own store (SQLite).

  partner.py serve --store FILE --port-file FILE [--seed N] [--lost-delay S]
  partner.py fix --url http://127.0.0.1:PORT      (deploys support for "chargeback")

It receives POST /webhooks and behaves as a well-behaved receiver should:
it deduplicates on the Idempotency-Key header. The key is stored in the same
SQLite transaction as the event's effect (the partner's copy of the order),
so an event is applied at most once; a repeat of a key already applied
answers 200 with the first answer (header Idempotent-Replayed: true) and
applies nothing; a repeat that arrives while the first request with that key
is still being processed answers 409 with Retry-After: the first request
might still fail, so the sender must try again later (and does).

And it misbehaves on purpose, chosen per request (seeded, plus a fixed
schedule so that every case happens in every run):
  drop   applies the event, then closes the connection without answering
  hang   applies the event, then answers only after --lost-delay seconds,
         longer than the relay's --http-timeout: the relay has given up
  slow   waits --lost-delay seconds and until a retry of the key was told
         409 in time (at most 30 s more), then applies the event: the
         relay gave up, and its retry found the key in progress
  503    answers 503 with Retry-After: 1, applies nothing
  500    answers 500, applies nothing
The first three are "accepted but the response was lost": the relay retries
with the same Idempotency-Key and the partner answers from its store.

A refund whose reason the partner's API does not know ("chargeback", until
`partner.py fix`) is a poison event: 400, applied never.

GET /events   the applied events, in the order they were applied
GET /orders   the partner's copy of each order
GET /requests every request received, with what was done and answered
GET /healthz  ok
POST /admin/refund-reasons {"add": "chargeback"}   the fix
"""
import argparse
import json
import os
import random
import signal
import socket
import sqlite3
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STATUS_BY_TYPE = {"order.created": "created", "order.paid": "paid", "order.shipped": "shipped",
                  "order.refunded": "refunded"}
# Request number -> forced behaviour, so that each case happens in every run.
SCHEDULE = {3: "drop", 6: "hang", 9: "slow", 12: "503", 15: "500", 40: "drop", 60: "hang"}
# A slow request is applied once a retry of its key was answered 409 within TOLD_IN_TIME seconds of its
# arrival (well within the relay's --http-timeout, so the relay read it), or after RETRY_TOLD_WITHIN seconds:
# on a busy machine the retry may come after --lost-delay, and every run must see the 409.
TOLD_IN_TIME = 0.5
RETRY_TOLD_WITHIN = 30.0
# Otherwise, per request: (behaviour, probability).
RATES = [("drop", 0.05), ("hang", 0.05), ("slow", 0.03), ("503", 0.06), ("500", 0.06)]

SCHEMA = """
CREATE TABLE IF NOT EXISTS applied (          -- one row per Idempotency-Key ever applied
    idempotency_key TEXT PRIMARY KEY,
    position        INTEGER NOT NULL UNIQUE,  -- order of application
    event_id        TEXT NOT NULL,
    type            TEXT NOT NULL,
    order_id        TEXT NOT NULL,
    seq             INTEGER NOT NULL,
    outbox_id       INTEGER,
    attempt         INTEGER,
    applied_at      REAL NOT NULL,
    response        TEXT NOT NULL             -- replayed to repeats
);
CREATE TABLE IF NOT EXISTS orders (           -- the effect: the partner's copy of the order
    order_id   TEXT PRIMARY KEY,
    status     TEXT NOT NULL,
    last_seq   INTEGER NOT NULL,
    gaps       INTEGER NOT NULL DEFAULT 0     -- events that were not the order's next one
);
CREATE TABLE IF NOT EXISTS requests (         -- every request, for the checks
    n               INTEGER PRIMARY KEY,
    t               REAL NOT NULL,
    t_answer        REAL,                     -- when a 200 answer started to go out
    t_end           REAL,
    idempotency_key TEXT,
    outbox_id       INTEGER,
    attempt         INTEGER,
    type            TEXT,
    order_id        TEXT,
    behaviour       TEXT NOT NULL,
    result          TEXT,                     -- applied, duplicate, in_progress, rejected, failed
    status          TEXT                      -- the HTTP status sent, or "none" when the answer was lost
);
CREATE TABLE IF NOT EXISTS config (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class Store:
    """The partner's SQLite store; one connection, one lock: check-and-apply is atomic."""

    def __init__(self, path, seed):
        self.db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self.db.executescript(SCHEMA)
        self.lock = threading.Lock()
        self.rng = random.Random(seed)
        self.in_progress = {}   # key of a slow request being applied -> set once a retry was told 409 in time
        self.requests = self.db.execute("SELECT coalesce(max(n), 0) FROM requests").fetchone()[0]

    def refund_reasons(self):
        row = self.db.execute("SELECT value FROM config WHERE name = 'refund_reasons'").fetchone()
        return set(json.loads(row[0])) if row else {"customer_request", "damaged"}

    def add_refund_reason(self, reason):
        with self.lock:
            reasons = sorted(self.refund_reasons() | {reason})
            self.db.execute("INSERT OR REPLACE INTO config VALUES ('refund_reasons', ?)", (json.dumps(reasons),))
        return reasons

    def begin_request(self, key, headers, event):
        """Numbers the request, picks its behaviour, logs it. Returns (n, behaviour)."""
        with self.lock:
            self.requests += 1
            n = self.requests
            behaviour = SCHEDULE.get(n)
            if behaviour is None:
                draw = self.rng.random()
                behaviour = "ok"
                for name, rate in RATES:
                    if draw < rate:
                        behaviour = name
                        break
                    draw -= rate
            self.db.execute("""INSERT INTO requests (n, t, idempotency_key, outbox_id, attempt, type, order_id,
                                                     behaviour) VALUES (?, ?, ?, ?, ?, ?, ?, ?)""",
                            (n, time.time(), key, int(headers.get("X-Outbox-Id") or 0) or None,
                             int(headers.get("X-Outbox-Attempt") or 0) or None,
                             event.get("type"), event.get("order_id"), behaviour))
        return n, behaviour

    def end_request(self, n, result, status, answered_at=None):
        """answered_at: when the answer was written, taken before this waits for the lock."""
        t_end = answered_at or time.time()
        with self.lock:
            self.db.execute("UPDATE requests SET t_end = ?, result = coalesce(result, ?), status = ? WHERE n = ?",
                            (t_end, result, str(status), n))

    def answering(self, n):
        with self.lock:
            self.db.execute("UPDATE requests SET t_answer = ? WHERE n = ?", (time.time(), n))

    def set_result(self, n, result):
        with self.lock:
            self.db.execute("UPDATE requests SET result = ? WHERE n = ?", (result, n))

    def replay(self, key):
        row = self.db.execute("SELECT response FROM applied WHERE idempotency_key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def validate(self, event):
        if event.get("type") not in STATUS_BY_TYPE or not event.get("order_id") or not event.get("id"):
            return "not an order event"
        if not isinstance(event.get("seq"), int):
            return "seq missing"
        if event["type"] == "order.refunded" and event.get("data", {}).get("reason") not in self.refund_reasons():
            return f"unknown refund reason '{event.get('data', {}).get('reason')}'"
        return None

    def apply(self, key, event, headers):
        """The receiver's core: in ONE transaction, record the key and apply the
        effect, unless the key was applied before. Returns (result, response)."""
        with self.lock:
            previous = self.replay(key)
            if previous is not None:
                return "duplicate", previous
            position = self.db.execute("SELECT coalesce(max(position), 0) + 1 FROM applied").fetchone()[0]
            response = {"received": event["id"], "position": position}
            self.db.execute("BEGIN IMMEDIATE")
            try:
                self.db.execute("""INSERT INTO applied VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                                (key, position, event["id"], event["type"], event["order_id"], event["seq"],
                                 int(headers.get("X-Outbox-Id") or 0) or None,
                                 int(headers.get("X-Outbox-Attempt") or 0) or None, time.time(),
                                 json.dumps(response)))
                row = self.db.execute("SELECT last_seq FROM orders WHERE order_id = ?",
                                      (event["order_id"],)).fetchone()
                last = row[0] if row else 0
                gap = 0 if event["seq"] == last + 1 else 1  # not the order's next event
                self.db.execute("""INSERT INTO orders (order_id, status, last_seq, gaps) VALUES (?, ?, ?, ?)
                                   ON CONFLICT (order_id) DO UPDATE
                                   SET status = CASE WHEN excluded.last_seq > orders.last_seq
                                                     THEN excluded.status ELSE orders.status END,
                                       last_seq = max(orders.last_seq, excluded.last_seq),
                                       gaps = orders.gaps + excluded.gaps""",
                                (event["order_id"], STATUS_BY_TYPE[event["type"]], event["seq"], gap))
                self.db.execute("COMMIT")
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            return "applied", response

    def dump(self, query):
        cur = self.db.execute(query)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, row)) for row in cur.fetchall()]


class Partner:
    def __init__(self, store, lost_delay):
        self.store = store
        self.lost_delay = lost_delay

    def handler(self):
        partner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"           # keep-alive, like real endpoints

            def setup(self):
                super().setup()
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def log_message(self, *args):
                pass

            def answer(self, status, body, headers=()):
                data = json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for name, value in headers:
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                    self.wfile.flush()
                    return True
                except OSError:                     # the sender gave up: the answer is lost
                    self.close_connection = True
                    return False

            def drop(self):
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

            def do_GET(self):
                store = partner.store
                with store.lock:
                    if self.path == "/events":
                        body = {"events": store.dump("SELECT * FROM applied ORDER BY position")}
                    elif self.path == "/orders":
                        body = {"orders": store.dump("SELECT * FROM orders ORDER BY order_id")}
                    elif self.path == "/requests":
                        body = {"requests": store.dump("SELECT * FROM requests ORDER BY n")}
                    elif self.path == "/healthz":
                        body = {"ok": True}
                    else:
                        body = None
                self.answer(200, body) if body is not None else self.answer(404, {"error": "not found"})

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length > 0 else b""
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = None
                if self.path == "/admin/refund-reasons":
                    reasons = partner.store.add_refund_reason(str((body or {}).get("add")))
                    self.answer(200, {"refund_reasons": reasons})
                elif self.path == "/webhooks":
                    partner.webhook(self, body if isinstance(body, dict) else {})
                else:
                    self.answer(404, {"error": "not found"})

        return Handler

    def webhook(self, http, event):
        store = self.store
        key = http.headers.get("Idempotency-Key")
        arrived = time.time()
        n, behaviour = store.begin_request(key, http.headers, event)
        if not key:
            http.answer(400, {"error": "Idempotency-Key required"})
            return store.end_request(n, "rejected", 400)
        if behaviour in ("503", "500"):             # down for a moment: nothing applied
            status = int(behaviour)
            sent = http.answer(status, {"error": "service unavailable" if status == 503 else "internal error"},
                               [("Retry-After", "1")] if status == 503 else [])
            return store.end_request(n, "failed", status if sent else "none", time.time())

        error = None
        retry_told = None                           # a slow request's: set once a retry was told 409 in time
        with store.lock:
            previous = store.replay(key)
            busy = previous is None and key in store.in_progress
            if previous is None and not busy:
                error = store.validate(event)
                if error is None and behaviour == "slow":
                    retry_told = store.in_progress[key] = threading.Event()
            told = store.in_progress.get(key) if busy else None
        if busy:
            # Another request with this key is being applied right now: come back later.
            sent = http.answer(409, {"error": "a request with this Idempotency-Key is in progress"},
                               [("Retry-After", "1")])
            answered = time.time()
            if sent and answered - arrived < TOLD_IN_TIME:
                told.set()
            return store.end_request(n, "in_progress", 409 if sent else "none", answered)
        if previous is None and error is not None:
            http.answer(400, {"error": error})
            return store.end_request(n, "rejected", 400)

        if behaviour == "slow":
            time.sleep(self.lost_delay)             # the sender gives up meanwhile
            if retry_told is not None:
                retry_told.wait(RETRY_TOLD_WITHIN)
        try:
            result, response = store.apply(key, event, http.headers)
        finally:
            if retry_told is not None:
                with store.lock:
                    store.in_progress.pop(key, None)
        store.set_result(n, result)
        if behaviour == "drop":
            http.drop()
            return store.end_request(n, result, "none")
        if behaviour == "hang":
            time.sleep(self.lost_delay)
        headers = [("Idempotent-Replayed", "true")] if result == "duplicate" else []
        store.answering(n)
        sent = http.answer(200, response, headers)
        store.end_request(n, result, 200 if sent else "none", time.time())


def serve(args):
    store = Store(args.store, args.seed)
    partner = Partner(store, args.lost_delay)
    server = ThreadingHTTPServer(("127.0.0.1", 0), partner.handler())
    server.daemon_threads = True
    with open(args.port_file + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    os.replace(args.port_file + ".tmp", args.port_file)
    print(f"partner: listening on http://127.0.0.1:{server.server_address[1]}/webhooks", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever()
    print("partner: stopped", flush=True)


def fix(args):
    request = urllib.request.Request(args.url.rstrip("/") + "/admin/refund-reasons",
                                     data=json.dumps({"add": "chargeback"}).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        print(f"partner: refund reasons now {json.load(response)['refund_reasons']}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("serve")
    p.add_argument("--store", required=True, help="SQLite file")
    p.add_argument("--port-file", required=True, help="where to write the port chosen")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--lost-delay", type=float, default=2.5,
                   help="seconds of hang and slow; longer than the relay's --http-timeout")
    p = commands.add_parser("fix")
    p.add_argument("--url", required=True, help="http://127.0.0.1:PORT")
    args = parser.parse_args()
    serve(args) if args.command == "serve" else fix(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
