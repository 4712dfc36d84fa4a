#!/usr/bin/python3
"""The broker side of the broker tests and benchmark (brokers.sh,
broker_bench.py): a small NATS client (the text protocol, enough for
JetStream's API and a subscription) and RabbitMQ through pika.

  brokers.py nats-stream PORT STREAM SUBJECT...   create a file stream
  brokers.py nats-dump PORT STREAM OUT            every message, as JSON lines
  brokers.py nats-count PORT STREAM               how many messages it holds
  brokers.py amqp-queue PORT QUEUE                declare a durable queue
  brokers.py amqp-dump PORT QUEUE OUT             take every message, as JSON lines
  brokers.py amqp-count PORT QUEUE                how many messages it holds
  brokers.py amqp-up PORT                         exit 0 once RabbitMQ answers
  brokers.py check DUMP IDS [--once]              every id arrived (exactly once
                                                  with --once), per-key order, and
                                                  repeats carry the same message id

A dump line: {"id", "topic", "key", "msg_id", "payload", "t"} (t: arrival
time for subscriptions, absent for stored messages).
"""
import base64
import json
import socket
import sys


class Nats:
    """Just enough of the NATS protocol: PUB with a reply inbox, SUB, MSG/HMSG."""

    def __init__(self, port, host="127.0.0.1", timeout=5.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buf = b""
        self.sid = 0
        self.inbox_n = 0
        self._line()  # INFO
        self.sock.sendall(b'CONNECT {"verbose":false,"pedantic":false,"headers":true,'
                          b'"no_responders":true,"lang":"python","version":"0"}\r\nPING\r\n')
        while self._line() != b"PONG":
            pass

    def _fill(self):
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("NATS closed the connection")
        self.buf += data

    def _line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _take(self, n):
        while len(self.buf) < n + 2:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def subscribe(self, subject):
        self.sid += 1
        self.sock.sendall(b"SUB %s %d\r\n" % (subject.encode(), self.sid))
        return self.sid

    def next_message(self):
        """(subject, headers dict, payload bytes) of the next MSG or HMSG."""
        while True:
            line = self._line()
            if line == b"PING":
                self.sock.sendall(b"PONG\r\n")
                continue
            parts = line.split()
            if not parts or parts[0] in (b"PONG", b"+OK", b"INFO"):
                continue
            if parts[0] == b"-ERR":
                raise RuntimeError(line.decode())
            if parts[0] == b"MSG":
                size = int(parts[-1])
                return parts[1].decode(), {}, self._take(size)
            if parts[0] == b"HMSG":
                header_size, total = int(parts[-2]), int(parts[-1])
                data = self._take(total)
                return parts[1].decode(), parse_headers(data[:header_size]), data[header_size:]

    def request(self, subject, payload=b""):
        self.inbox_n += 1
        inbox = "_INBOX.brokers.%d" % self.inbox_n
        self.subscribe(inbox)
        self.sock.sendall(b"PUB %s %s %d\r\n%s\r\n" % (subject.encode(), inbox.encode(),
                                                      len(payload), payload))
        subject, headers, data = self.next_message()
        self.sock.sendall(b"UNSUB %d\r\n" % self.sid)
        return json.loads(data) if data else {}


def parse_headers(block):
    headers = {}
    for line in block.decode("utf-8", "replace").split("\r\n")[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip()] = value.strip()
    return headers


def js(port, api, body=None):
    nats = Nats(port)
    reply = nats.request("$JS.API." + api, json.dumps(body).encode() if body is not None else b"")
    nats.sock.close()
    if "error" in reply:
        raise RuntimeError("JetStream %s: %s" % (api, reply["error"]))
    return reply


def nats_stream(port, stream, subjects):
    js(port, "STREAM.CREATE." + stream, {"name": stream, "subjects": subjects, "storage": "file",
                                         "duplicate_window": 120 * 10**9})


def nats_count(port, stream):
    return js(port, "STREAM.INFO." + stream)["state"]["messages"]


def decode_value(text):
    """The relay's header values are percent-encoded."""
    from urllib.parse import unquote_to_bytes
    return unquote_to_bytes(text).decode("utf-8", "replace")


def nats_dump(port, stream, out):
    info = js(port, "STREAM.INFO." + stream)["state"]
    nats = Nats(port)
    with open(out, "w") as f:
        for seq in range(info["first_seq"], info["last_seq"] + 1):
            reply = nats.request("$JS.API.STREAM.MSG.GET." + stream, json.dumps({"seq": seq}).encode())
            if "message" not in reply:
                continue
            m = reply["message"]
            headers = parse_headers(base64.b64decode(m.get("hdrs", ""))) if m.get("hdrs") else {}
            f.write(json.dumps({
                "id": int(headers["X-Outbox-Id"]), "topic": decode_value(headers["X-Outbox-Topic"]),
                "key": decode_value(headers["X-Outbox-Key"]) if "X-Outbox-Key" in headers else None,
                "msg_id": decode_value(headers.get("Nats-Msg-Id", "")), "subject": m["subject"],
                "headers": headers,
                "payload": json.loads(base64.b64decode(m.get("data", "")) or b"null")}) + "\n")
    nats.sock.close()


def amqp_channel(port):
    import pika
    params = pika.ConnectionParameters("127.0.0.1", port, connection_attempts=1, socket_timeout=5,
                                       blocked_connection_timeout=5)
    connection = pika.BlockingConnection(params)
    return connection, connection.channel()


def amqp_queue(port, queue):
    connection, channel = amqp_channel(port)
    channel.queue_declare(queue=queue, durable=True)
    connection.close()


def amqp_count(port, queue):
    connection, channel = amqp_channel(port)
    n = channel.queue_declare(queue=queue, durable=True, passive=True).method.message_count
    connection.close()
    return n


def amqp_line(properties, body):
    headers = properties.headers or {}
    def text(v):
        return v.decode("utf-8", "replace") if isinstance(v, bytes) else v
    return {"id": int(headers["X-Outbox-Id"]), "topic": text(headers["X-Outbox-Topic"]),
            "key": text(headers.get("X-Outbox-Key")), "msg_id": properties.message_id,
            "persistent": properties.delivery_mode == 2, "content_type": properties.content_type,
            "headers": {k: text(v) for k, v in headers.items()}, "payload": json.loads(body)}


def amqp_dump(port, queue, out):
    connection, channel = amqp_channel(port)
    with open(out, "w") as f:
        while True:
            method, properties, body = channel.basic_get(queue=queue, auto_ack=True)
            if method is None:
                break
            f.write(json.dumps(amqp_line(properties, body)) + "\n")
    connection.close()


def amqp_up(port):
    try:
        connection, _ = amqp_channel(port)
        connection.close()
        return 0
    except Exception:
        return 1


def check(dump, ids_file, once):
    """Every expected id arrived; per key, first arrivals in id order; a
    repeat of an event carries the same message id."""
    expected = [int(x) for x in open(ids_file).read().split()]
    arrivals = [json.loads(line) for line in open(dump)]
    seen, msg_ids, problems = {}, {}, []
    for a in arrivals:
        seen[a["id"]] = seen.get(a["id"], 0) + 1
        if msg_ids.setdefault(a["id"], a["msg_id"]) != a["msg_id"]:
            problems.append("event %d arrived with two message ids" % a["id"])
    missing = [i for i in expected if i not in seen]
    if missing:
        problems.append("%d event(s) never arrived, e.g. %s" % (len(missing), missing[:5]))
    if once:
        repeated = [i for i, n in seen.items() if n > 1]
        if repeated:
            problems.append("%d event(s) held more than once, e.g. %s" % (len(repeated), repeated[:5]))
    last = {}
    for a in arrivals:
        if a["key"] is None or seen.get(a["id"], 0) == 0:
            continue
        k = (a["topic"], a["key"])
        if a["id"] < last.get(k, 0):
            problems.append("key %s: event %d after %d" % (a["key"], a["id"], last[k]))
            break
        last[k] = max(last.get(k, 0), a["id"])
    extra = set(seen) - set(expected)
    if extra:
        problems.append("%d unexpected event(s), e.g. %s" % (len(extra), sorted(extra)[:5]))
    if problems:
        print("; ".join(problems))
        return 1
    print("%d events, %d arrivals, %d keys" % (len(expected), len(arrivals), len(last)))
    return 0


def main(argv):
    command = argv[1]
    if command == "nats-stream":
        nats_stream(int(argv[2]), argv[3], argv[4:])
    elif command == "nats-dump":
        nats_dump(int(argv[2]), argv[3], argv[4])
    elif command == "nats-count":
        print(nats_count(int(argv[2]), argv[3]))
    elif command == "amqp-queue":
        amqp_queue(int(argv[2]), argv[3])
    elif command == "amqp-dump":
        amqp_dump(int(argv[2]), argv[3], argv[4])
    elif command == "amqp-count":
        print(amqp_count(int(argv[2]), argv[3]))
    elif command == "amqp-up":
        return amqp_up(int(argv[2]))
    elif command == "check":
        return check(argv[2], argv[3], "--once" in argv[4:])
    else:
        sys.exit("unknown command " + command)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
