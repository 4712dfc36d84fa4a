"""A stand-in for an e-mail provider's HTTP API, on 127.0.0.1, for the
scenario. Like real providers it honours an Idempotency-Key header: a
request whose key already produced a message returns that message again
instead of sending a second one.

POST /v1/messages {"to": ..., "subject": ..., "text": ...}. What happens
depends on the recipient's local part:

  flaky@    503 on the first two calls of a key, then sent
  bounce@   422, the mailbox does not exist (a final failure)
  down@     503, always
  lost@     sent, but the response comes after LOST_DELAY s (the worker has
            given up by then: a timeout whose effect did happen)
  slow@     sent, the response comes after SLOW_DELAY s (long enough to
            kill the worker in between)
  other     sent

Every call is recorded in `calls` (and in a JSON-lines log when given).
"""
import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOST_DELAY = 3.0
SLOW_DELAY = 2.0


class Provider:
    def __init__(self, log_path=None):
        self.calls = []                 # dicts: t, key, to, status, message_id, new
        self.messages = {}              # idempotency key -> message id
        self.attempts = {}              # idempotency key -> calls so far
        self.ids = itertools.count(1)
        self.lock = threading.Lock()
        self.log_path = log_path
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                status, answer, delay = provider.handle(self.headers.get("Idempotency-Key"), body)
                time.sleep(delay)
                data = json.dumps(answer).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass                # the client gave up, or died

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/messages"

    def handle(self, key, body):
        """Returns (status, body, delay before answering) and records the call."""
        to = body.get("to", "")
        kind = to.split("@")[0]
        with self.lock:
            calls = self.attempts[key] = self.attempts.get(key, 0) + 1
            new = False
            if key in self.messages:
                status, delay = 200, 0.0
            elif not key:
                status, delay = 400, 0.0
            elif kind == "bounce":
                status, delay = 422, 0.0
            elif kind == "down" or (kind == "flaky" and calls <= 2):
                status, delay = 503, 0.0
            else:
                self.messages[key] = f"msg-{next(self.ids):04d}"
                status, new = 200, True
                delay = {"lost": LOST_DELAY, "slow": SLOW_DELAY}.get(kind, 0.0)
            message_id = self.messages.get(key)
            call = {"t": time.time(), "key": key, "to": to, "status": status, "message_id": message_id, "new": new}
            self.calls.append(call)
            if self.log_path:
                with open(self.log_path, "a") as log:
                    log.write(json.dumps(call) + "\n")
        if status == 200:
            return status, {"id": message_id}, delay
        errors = {400: "Idempotency-Key required", 422: "mailbox does not exist", 503: "try again later"}
        return status, {"error": errors[status]}, delay

    def start(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self):
        self.server.shutdown()
