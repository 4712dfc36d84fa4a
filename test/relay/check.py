#!/usr/bin/python3
"""Checks of idem-relay's test run over the receiver's log (JSON lines, see
receiver.py) and a dump of idempotency.outbox (psql -At -F'|' of: id, topic,
key, state, attempts, expect, dedup_key, last_error). Standard library only.
Each command prints what it found, and exits 1 when a property does not hold.

  check.py order [--every] LOG [TOPIC...]
      per (topic, key): first arrivals never go back in seq (a repeat of an
      event already delivered, after a relay died before its ack, may
      follow later events of its run); with --every, no arrival does
  check.py dups LOG [TOPIC...]         every request of an event had one Idempotency-Key
  check.py complete LOG DUMP [--discarded ID,...] [TOPIC...]
      every event in the dump is delivered (or dead when its payload expects
      it), each delivered one was accepted by the receiver, every event the
      receiver saw exists (or was discarded as a dead letter), and no
      rolled-back event ever arrived
  check.py stdout FILE                 the stdout sink's lines (see run.sh)
"""
import json
import sys

# What delivers an event (409 means "still in progress": retried).
ACCEPTED = set(range(200, 300))


def load_log(path, topics):
    entries = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                entry = json.loads(line)
                if not topics or entry.get("topic") in topics:
                    entries.append(entry)
    entries.sort(key=lambda e: e["t"])
    return entries


def load_dump(path, topics):
    rows = {}
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            parts = line.split("|", 7)
            row = dict(zip(["id", "topic", "key", "state", "attempts", "expect", "dedup_key",
                            "last_error"], parts))
            if not topics or row["topic"] in topics:
                rows[int(row["id"])] = row
    return rows


def fail(message):
    print("  " + message, file=sys.stderr)


def cmd_order(args):
    every = args[0] == "--every"
    if every:
        args = args[1:]
    entries = load_log(args[0], set(args[1:]))
    last = {}
    arrived = set()
    bad = 0
    for e in entries:
        if e.get("key") is None or e.get("seq") is None:
            continue
        k = (e["topic"], e["key"])
        if not every and (k, e["seq"]) in arrived:
            continue
        arrived.add((k, e["seq"]))
        if k in last and e["seq"] < last[k][0]:
            bad += 1
            if bad <= 5:
                fail("key %s: seq %s (id %s) arrived after seq %s (id %s)"
                     % (k, e["seq"], e["id"], last[k][0], last[k][1]))
        if k not in last or e["seq"] >= last[k][0]:
            last[k] = (e["seq"], e["id"])
    print("order: %d requests over %d keys, %d out of order" % (len(entries), len(last), bad))
    return 1 if bad else 0


def cmd_dups(args):
    entries = load_log(args[0], set(args[1:]))
    keys, accepted = {}, {}
    for e in entries:
        keys.setdefault(e["id"], set()).add(e.get("ikey"))
        if e.get("status") in ACCEPTED:
            accepted[e["id"]] = accepted.get(e["id"], 0) + 1
    bad = [i for i, k in keys.items() if len(k) != 1 or None in k]
    for i in bad[:5]:
        fail("event %d arrived with Idempotency-Keys %s" % (i, sorted(map(str, keys[i]))))
    dups = sum(1 for n in accepted.values() if n > 1)
    print("dups: %d events, %d accepted more than once, %d with differing Idempotency-Keys"
          % (len(keys), dups, len(bad)))
    return 1 if bad else 0


def cmd_complete(args):
    discarded = set()
    if len(args) > 3 and args[2] == "--discarded":
        discarded = {int(i) for i in args[3].split(",") if i}
        args = args[:2] + args[4:]
    topics = set(args[2:])
    entries = load_log(args[0], topics)
    rows = load_dump(args[1], topics)
    accepted = {e["id"] for e in entries if e.get("status") in ACCEPTED}
    seen = {e["id"] for e in entries}
    problems = 0

    def problem(message):
        nonlocal problems
        problems += 1
        if problems <= 8:
            fail(message)

    for e in entries:
        if e.get("rolled_back"):
            problem("rolled-back event %s arrived (seq %s)" % (e["id"], e.get("seq")))
    for i in sorted(seen - set(rows) - discarded):
        problem("event %d arrived but is not in the outbox" % i)
    dead = 0
    for i, row in sorted(rows.items()):
        expected = row["expect"] or "delivered"
        if row["state"] != expected:
            problem("event %d (topic %s) is %s, expected %s (attempts %s, error %s)"
                    % (i, row["topic"], row["state"], expected, row["attempts"], row["last_error"]))
        if row["state"] == "delivered" and i not in accepted:
            problem("event %d is delivered but the receiver never accepted it" % i)
        dead += row["state"] == "dead"
    print("complete: %d events in the outbox, %d accepted by the receiver, %d dead as scripted, "
          "%d requests, %d problems" % (len(rows), len(accepted & set(rows)), dead, len(entries),
                                        problems))
    return 1 if problems else 0


def cmd_stdout(args):
    expected_keys = {"id", "topic", "key", "headers", "payload", "attempt"}
    lines = [l for l in open(args[0]).read().split("\n") if l]
    objects = []
    for line in lines:
        try:
            objects.append(json.loads(line))
        except ValueError:
            fail("not JSON: %r" % line)
            return 1
    by_name = {}
    for o in objects:
        if set(o) != expected_keys:
            fail("fields %s, expected %s" % (sorted(o), sorted(expected_keys)))
            return 1
        by_name[o["payload"].get("name")] = o
    want = {
        "plain": {"topic": "s_stdout", "key": "k1", "headers": {"h": "v", "n": 5}, "attempt": 1,
                  "payload": {"name": "plain", "text": "line1\nline2 \"quoted\" \u00e9"}},
        "nokey": {"topic": "s_stdout", "key": None, "headers": None, "attempt": 1,
                  "payload": {"name": "nokey", "list": [1, 2, {"a": None}]}},
        "odd key": {"topic": "s_stdout", "key": "tab\there \"q\"", "headers": None, "attempt": 1,
                    "payload": {"name": "odd key"}},
    }
    ok = len(objects) == len(want)
    if not ok:
        fail("%d lines, expected %d" % (len(objects), len(want)))
    for name, fields in want.items():
        got = by_name.get(name)
        if got is None:
            fail("no line for %s" % name)
            ok = False
            continue
        for field, value in fields.items():
            if got[field] != value:
                fail("%s: %s is %r, expected %r" % (name, field, got[field], value))
                ok = False
        if not isinstance(got["id"], int):
            fail("%s: id is not a number" % name)
            ok = False
    print("stdout: %d lines" % len(objects))
    return 0 if ok else 1


def main():
    commands = {"order": cmd_order, "dups": cmd_dups, "complete": cmd_complete,
                "stdout": cmd_stdout}
    if len(sys.argv) < 3 or sys.argv[1] not in commands:
        print(__doc__, file=sys.stderr)
        return 2
    return commands[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
