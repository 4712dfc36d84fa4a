#!/usr/bin/python3
"""A scripted HTTP receiver for idem-relay's tests and benchmark (loopback only,
standard library only).

Every POST is answered according to the event's payload: {"script": [A1, A2, ...]}
gives the action for attempt 1, 2, ... (X-Outbox-Attempt; the last action
repeats); without a script the answer is 200. Actions:
  "200", "409", "500", ...   that status
  "429:N", "503:N"           that status with Retry-After: N (seconds)
  "delay:S"                  200 after S seconds (a slow but good answer; logged
                             on arrival, as a consumer that has taken the event)
  "sleep:S"                  wait S seconds, then 200 (meant to outlast the
                             relay's --http-timeout: the relay gives up first)
  "hang200:S"                200 and its headers at once, then a body that
                             stops after 10 of its 100 bytes for S seconds
  "reset"                    close the connection without answering
A POST to a path other than /events is answered 404 (a mistyped sink URL).
Each request is one JSON line in --log: arrival and end times, the event's id,
topic, key, attempt, Idempotency-Key, the payload's seq and rolled_back fields,
the action, the status sent ("reset" when none, "timeout" for sleep:), how
many requests were being served at once, the header names as sent, every
Idempotency-Key value and the X-Ctl header. The chosen port is written to --port-file.
"""
import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class State:
    lock = threading.Lock()
    active = 0
    log = None
    buffered = False


def record(entry):
    line = json.dumps(entry, separators=(",", ":")) + "\n"
    with State.lock:
        State.log.write(line)
        if not State.buffered:
            State.log.flush()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the relay's libcurl expects

    def setup(self):
        super().setup()
        # Headers and body go out in two writes: without this, Nagle's
        # algorithm and delayed ACKs add 40 ms to every answer.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, *args):
        pass

    def do_GET(self):
        body = b"receiver\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        start = time.time()
        with State.lock:
            State.active += 1
            concurrent = State.active
        try:
            self.handle_event(start, concurrent)
        finally:
            with State.lock:
                State.active -= 1

    def handle_event(self, start, concurrent):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        try:
            payload = json.loads(raw.decode("utf-8"))
        except ValueError:
            payload = None
        attempt = int(self.headers.get("X-Outbox-Attempt") or 1)
        script = payload.get("script") if isinstance(payload, dict) else None
        if not isinstance(script, list) or not script:
            script = ["200"]
        action = str(script[min(attempt, len(script)) - 1])
        entry = {
            "t": start,
            "id": int(self.headers.get("X-Outbox-Id") or 0),
            "topic": self.headers.get("X-Outbox-Topic"),
            "key": self.headers.get("X-Outbox-Key"),
            "attempt": attempt,
            "ikey": self.headers.get("Idempotency-Key"),
            "ctype": self.headers.get("Content-Type"),
            "agent": self.headers.get("User-Agent"),
            "custom": self.headers.get("X-Custom"),
            "seq": payload.get("seq") if isinstance(payload, dict) else None,
            "rolled_back": bool(payload.get("rolled_back")) if isinstance(payload, dict) else False,
            "action": action,
            "concurrent": concurrent,
            "path": self.path,
            "names": list(self.headers.keys()),
            "ikeys": self.headers.get_all("Idempotency-Key") or [],
            "ctl": self.headers.get("X-Ctl"),
        }
        if not self.path.startswith("/events"):
            action = entry["action"] = "404"
        retry_after = None
        if action == "reset":
            entry["status"] = "reset"
            entry["t_end"] = time.time()
            record(entry)
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        if action.startswith("hang200:"):
            entry["status"] = 200
            entry["t_end"] = start
            record(entry)
            try:
                self.send_response(200)
                self.send_header("Content-Length", "100")
                self.end_headers()
                self.wfile.write(b"0123456789")
                self.wfile.flush()
                time.sleep(float(action.split(":", 1)[1]))
            except OSError:
                pass
            self.close_connection = True
            return
        if action.startswith("delay:"):
            # Accepted on arrival (logged now), answered later: a relay that
            # dies meanwhile never learns it, and delivers the event again.
            entry["status"] = status = 200
            entry["t_end"] = start
            record(entry)
            time.sleep(float(action.split(":", 1)[1]))
        elif action.startswith("sleep:"):
            time.sleep(float(action.split(":", 1)[1]))
            status = 200
            # The relay gave up before this answer: not an acceptance.
            entry["status"] = "timeout"
        elif ":" in action:
            code, seconds = action.split(":", 1)
            status, retry_after = int(code), seconds
        else:
            status = int(action)
        if "status" not in entry or entry["status"] == "timeout":
            entry.setdefault("status", status)
            entry["t_end"] = time.time()
            record(entry)
        # 204 and 304 answers have no body (one would spoil the kept-alive connection).
        body = b"" if status in (204, 304) else ("status %d\n" % status).encode()
        try:
            self.send_response(status)
            if retry_after is not None:
                self.send_header("Retry-After", retry_after)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            self.close_connection = True  # the relay gave up waiting


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--buffered", action="store_true",
                        help="flush the log only at exit (benchmarks)")
    args = parser.parse_args()
    State.log = open(args.log, "a", buffering=1 << 20)
    State.buffered = args.buffered
    server = Server(("127.0.0.1", args.port), Handler)

    def stop(signum, frame):
        with State.lock:
            State.log.flush()
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    tmp = args.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d\n" % server.server_address[1])
    os.rename(tmp, args.port_file)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
