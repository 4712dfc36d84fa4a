#!/usr/bin/python3
"""The broker side of the broker tests and benchmark (brokers.sh,
broker_bench.py): a small NATS client (the text protocol, enough for
JetStream's API and a subscription) and RabbitMQ through pika.

  brokers.py nats-stream PORT STREAM SUBJECT...   create a file stream
  brokers.py nats-stream-window PORT STREAM SECONDS SUBJECT...
                                                  ... with that duplicate window
  brokers.py nats-stream-max-msg-size PORT STREAM BYTES SUBJECT...
                                                  ... refusing larger messages
  brokers.py nats-dump PORT STREAM OUT            every message, as JSON lines
  brokers.py nats-count PORT STREAM               how many messages it holds
  brokers.py nats-up PORT                         exit 0 once JetStream answers
  brokers.py amqp-queue PORT QUEUE [MAX]          declare a durable queue (that
                                                  refuses publishes past MAX messages)
  brokers.py amqp-dump PORT QUEUE OUT             take every message, as JSON lines
  brokers.py amqp-count PORT QUEUE                how many messages it holds
  brokers.py amqp-up PORT                         exit 0 once RabbitMQ answers
  brokers.py check DUMP IDS [--once]              every id arrived (exactly once
                                                  with --once), per-key order, and
                                                  repeats carry the same message id;
                                                  IDS: lines "id [message-id]", the
                                                  message id each must carry

IDEM_NATS_TLS=FOLDER: the NATS server wants TLS, with FOLDER/ca.pem and a
client certificate FOLDER/client.pem and FOLDER/client.key.

A dump line: {"id", "topic", "key", "msg_id", "payload", "t"} (t: arrival
time for subscriptions, absent for stored messages).
"""
import json
import os
import socket
import ssl
import sys


class Nats:
    """Just enough of the NATS protocol: PUB with a reply inbox, SUB, MSG/HMSG."""

    def __init__(self, port, host="127.0.0.1", timeout=5.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.buf = b""
        self.sid = 0
        self.inbox_n = 0
        self.held = []  # messages that came in while a request awaited its reply
        self._line()  # INFO
        # A server that wants TLS (IDEM_NATS_TLS: the folder of ca.pem and
        # client.pem/client.key): the connection is upgraded after INFO.
        tls = os.environ.get("IDEM_NATS_TLS")
        if tls:
            context = ssl.create_default_context(cafile=tls + "/ca.pem")
            context.load_cert_chain(tls + "/client.pem", tls + "/client.key")
            self.sock = context.wrap_socket(self.sock, server_hostname=host)
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
        if self.held:
            return self.held.pop(0)
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
        sid = self.sid
        held = []
        while True:
            subject, headers, data = self.next_message()
            if subject == inbox:
                break
            held.append((subject, headers, data))
        self.held = held + self.held
        self.sock.sendall(b"UNSUB %d\r\n" % sid)
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


def nats_stream(port, stream, subjects, window=120.0, max_msg_size=None):
    config = {"name": stream, "subjects": subjects, "storage": "file", "duplicate_window": int(window * 10**9)}
    if max_msg_size is not None:
        config["max_msg_size"] = max_msg_size
    js(port, "STREAM.CREATE." + stream, config)


def nats_up(port):
    try:
        js(port, "INFO")
        return 0
    except Exception:
        return 1


def nats_count(port, stream):
    return js(port, "STREAM.INFO." + stream)["state"]["messages"]


def decode_value(text):
    """The relay's header values are percent-encoded."""
    from urllib.parse import unquote_to_bytes
    return unquote_to_bytes(text).decode("utf-8", "replace")


def nats_dump(port, stream, out):
    """Every message of the stream, through an ephemeral push consumer."""
    count = js(port, "STREAM.INFO." + stream)["state"]["messages"]
    nats = Nats(port, timeout=30)
    inbox = "_INBOX.dump.%s" % stream
    nats.subscribe(inbox)
    nats.request("$JS.API.CONSUMER.CREATE." + stream, json.dumps({
        "stream_name": stream,
        "config": {"deliver_subject": inbox, "deliver_policy": "all", "ack_policy": "none"}}).encode())
    with open(out, "w") as f:
        for _ in range(count):
            subject, headers, data = nats.next_message()
            f.write(json.dumps({
                "id": int(headers["X-Outbox-Id"]), "topic": decode_value(headers["X-Outbox-Topic"]),
                "key": decode_value(headers["X-Outbox-Key"]) if "X-Outbox-Key" in headers else None,
                "msg_id": decode_value(headers.get("Nats-Msg-Id", "")), "subject": subject,
                "headers": headers, "payload": json.loads(data or b"null")}) + "\n")
    nats.sock.close()


def amqp_channel(port):
    import pika
    params = pika.ConnectionParameters("127.0.0.1", port, connection_attempts=1, socket_timeout=5,
                                       blocked_connection_timeout=5)
    connection = pika.BlockingConnection(params)
    return connection, connection.channel()


def amqp_queue(port, queue, max_length=None):
    connection, channel = amqp_channel(port)
    arguments = None
    if max_length is not None:
        arguments = {"x-max-length": max_length, "x-overflow": "reject-publish"}
    channel.queue_declare(queue=queue, durable=True, arguments=arguments)
    connection.close()


def amqp_purge(port, queue):
    connection, channel = amqp_channel(port)
    channel.queue_purge(queue)
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
    lines = [line.split() for line in open(ids_file) if line.strip()]
    expected = [int(fields[0]) for fields in lines]
    wanted_msg_id = {int(fields[0]): fields[1] for fields in lines if len(fields) > 1}
    # On NATS the message id names the subject first (a stream may take
    # several topics): "subject key".
    def msg_id_of(arrival, key):
        return arrival["subject"] + " " + key if "subject" in arrival else key
    arrivals = [json.loads(line) for line in open(dump)]
    seen, msg_ids, problems = {}, {}, []
    for a in arrivals:
        seen[a["id"]] = seen.get(a["id"], 0) + 1
        if msg_ids.setdefault(a["id"], a["msg_id"]) != a["msg_id"]:
            problems.append("event %d arrived with two message ids" % a["id"])
        if a["id"] in wanted_msg_id and a["msg_id"] != msg_id_of(a, wanted_msg_id[a["id"]]):
            problems.append("event %d arrived with message id %r, not %r"
                            % (a["id"], a["msg_id"], msg_id_of(a, wanted_msg_id[a["id"]])))
            break
    missing = [i for i in expected if i not in seen]
    if missing:
        problems.append("%d event(s) never arrived, e.g. %s" % (len(missing), missing[:5]))
    if once:
        repeated = [i for i, n in seen.items() if n > 1]
        if repeated:
            problems.append("%d event(s) held more than once, e.g. %s" % (len(repeated), repeated[:5]))
    last = {}
    first = set()
    for a in arrivals:
        if a["key"] is None or seen.get(a["id"], 0) == 0 or a["id"] in first:
            continue
        first.add(a["id"])
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
    print("%d events, %d arrivals, %d keys, %d repeated" % (
        len(expected), len(arrivals), len(last), sum(1 for n in seen.values() if n > 1)))
    return 0


def main(argv):
    command = argv[1]
    if command == "nats-stream":
        nats_stream(int(argv[2]), argv[3], argv[4:])
    elif command == "nats-stream-window":
        nats_stream(int(argv[2]), argv[3], argv[5:], float(argv[4]))
    elif command == "nats-stream-max-msg-size":
        nats_stream(int(argv[2]), argv[3], argv[5:], max_msg_size=int(argv[4]))
    elif command == "nats-dump":
        nats_dump(int(argv[2]), argv[3], argv[4])
    elif command == "nats-up":
        return nats_up(int(argv[2]))
    elif command == "nats-count":
        print(nats_count(int(argv[2]), argv[3]))
    elif command == "amqp-queue":
        amqp_queue(int(argv[2]), argv[3], int(argv[4]) if len(argv) > 4 else None)
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
