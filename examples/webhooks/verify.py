"""The checks of check.sh, once the scenario has run: what the shop attempted
(app.py's log), what the database holds, what the partner received and
applied (its GET endpoints), and what the two idem-relay runs logged.

  verify.py --dsn DSN --partner http://127.0.0.1:PORT --workdir DIR

Prints one line per check; exits 1 if one fails.
"""
import argparse
import json
import re
import sys
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path

import psycopg2

from app import POISON, SHIPPED_TWICE, TOPIC

LOST = ("drop", "hang", "slow")        # the partner applied (or had applied) but the answer never came


class Checks:
    def __init__(self):
        self.failed = 0

    def __call__(self, name, ok, detail=""):
        print(f"{'ok' if ok else 'not ok'} - {name}" + (f"\n    {detail}" if not ok and detail else ""), flush=True)
        self.failed += 0 if ok else 1


def get(url, path, name):
    with urllib.request.urlopen(url.rstrip("/") + path, timeout=10) as response:
        return json.load(response)[name]


def stopped_line(path):
    """The relay's last progress line, "stopped: delivered=N retried=N dead=N ..."."""
    found = re.findall(r"stopped: delivered=(\d+) retried=(\d+) dead=(\d+)", Path(path).read_text())
    return tuple(map(int, found[-1])) if found else None


def failed_attempts(work):
    """(outbox id, attempt) -> the error the relay runs logged for that failed attempt, as
    "event 89 (topic T, key K) attempt 5 failed, retry in 1000 ms: HTTP 503: ..."."""
    logged = {}
    for name in ("relay-1.log", "relay-2.log"):
        for m in re.finditer(r"event (\d+) \(topic [^)]*\) attempt (\d+) failed, [^:]*: (.*)",
                             (work / name).read_text()):
            logged[(int(m[1]), int(m[2]))] = m[3]
    return logged


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--partner", required=True)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()
    work = Path(args.workdir)
    check = Checks()

    attempts = [json.loads(line) for line in (work / "events.jsonl").read_text().splitlines()]
    committed = {a["event_id"]: a for a in attempts if a.get("committed") is True}
    rolled_back = {a["event_id"]: a for a in attempts if a.get("committed") is False}
    twice = [a for a in attempts if a.get("reported_twice")]

    conn = psycopg2.connect(args.dsn)
    with conn, conn.cursor() as cur:
        cur.execute("SELECT event_id, outbox_id FROM order_events")
        business = dict(cur.fetchall())
        cur.execute("""SELECT id, dedup_key, state::text, attempts FROM idempotency.outbox WHERE topic = %s""", (TOPIC,))
        outbox = {row[0]: row[1:] for row in cur.fetchall()}
        cur.execute("SELECT count(*) FROM idempotency.outbox WHERE id = ANY(%s) OR dedup_key = ANY(%s)",
                    ([a["outbox_id"] for a in rolled_back.values() if a["outbox_id"]], list(rolled_back)))
        rolled_back_in_outbox = cur.fetchone()[0]

    applied = get(args.partner, "/events", "events")
    requests = get(args.partner, "/requests", "requests")
    partner_orders = get(args.partner, "/orders", "orders")

    # -------------------------------------------------------------- the shop
    check(f"the shop committed {len(committed)} events and rolled back {len(rolled_back)} "
          "(2 orders out of stock, 6 declined cards, 1 cancelled refund)",
          len(rolled_back) == 9 and len(committed) > 100, f"{len(committed)} committed, {len(rolled_back)} rolled back")
    check("order_events holds exactly the committed events, each with its outbox id",
          business == {e: a["outbox_id"] for e, a in committed.items()},
          f"only in the table: {set(business) - set(committed)}, only in the log: {set(committed) - set(business)}")
    dedup = Counter(row[0] for row in outbox.values())
    check(f"the {len(SHIPPED_TWICE)} shipments reported twice were enqueued once (dedup_key): same outbox id, "
          "one outbox event per dedup_key",
          len(twice) == len(SHIPPED_TWICE) and all(t["same_outbox_id"] for t in twice)
          and max(dedup.values()) == 1 and len(outbox) == len(committed),
          f"{twice}, {len(outbox)} outbox events for {len(committed)} committed")

    # ------------------------------------------------- exactly once, in order
    times = Counter(row["event_id"] for row in applied)
    check(f"every committed event was applied exactly once at the partner ({len(committed)})",
          times == Counter({e: 1 for e in committed}),
          f"twice: {[e for e, n in times.items() if n > 1]}, never: {set(committed) - set(times)}, "
          f"unknown: {set(times) - set(committed)}")
    check("each was applied under its business event id as Idempotency-Key",
          all(row["idempotency_key"] == row["event_id"] for row in applied))
    sent_keys = {r["idempotency_key"] for r in requests}
    leaked = sorted(set(rolled_back) & (sent_keys | set(times)))
    check(f"no rolled-back event was ever sent ({len(rolled_back)} rolled back; none in the outbox, "
          "none among the partner's requests)", not leaked and rolled_back_in_outbox == 0,
          f"sent: {leaked}, in the outbox: {rolled_back_in_outbox}")

    per_order = defaultdict(list)
    for row in applied:                                     # already in order of first application
        per_order[row["order_id"]].append(row["seq"])
    disordered = {o: s for o, s in per_order.items() if s != sorted(s) or s != list(range(1, len(s) + 1))}
    check(f"per-order order kept: each of the {len(per_order)} orders' events were first applied "
          "in the order they were committed (created, paid, shipped, refunded)",
          not disordered and all(o["gaps"] == 0 for o in partner_orders), f"{disordered}")

    # The relay's side of the order: an order's next event goes out only after
    # the previous one was acknowledged, so only after the partner answered it 200.
    by_event = defaultdict(list)
    for r in requests:
        by_event[(r["order_id"], r["idempotency_key"])].append(r)
    timeline = defaultdict(list)           # order -> [(seq, first request, first 200 answer)]
    seq_of = {row["event_id"]: row["seq"] for row in applied}
    for (order, key), rs in by_event.items():
        if key in seq_of:
            answers = [r["t_answer"] for r in rs if r["t_answer"] is not None]
            timeline[order].append((seq_of[key], min(r["t"] for r in rs), min(answers) if answers else None))
    early = []
    for order, events in timeline.items():
        events.sort()
        for (seq, _, answered), (next_seq, next_sent, _) in zip(events, events[1:]):
            if answered is None or next_sent < answered:
                early.append((order, seq, next_seq))
    check("no order's next event was sent before the partner had answered the previous one 200",
          not early, f"{early}")

    # ------------------------------------------------ the lost responses
    by_key = defaultdict(list)
    for r in requests:
        by_key[r["idempotency_key"]].append(r)
    lost = [r for r in requests if r["behaviour"] in LOST and r["result"] in ("applied", "duplicate")]
    kinds = Counter(r["behaviour"] for r in lost)
    unresolved = []
    resent_at_once = 0
    for r in lost:
        later = [x for x in by_key[r["idempotency_key"]] if x["n"] > r["n"]]
        if not any(x["status"] == "200" and x["result"] == "duplicate" and x["outbox_id"] == r["outbox_id"]
                   for x in later):
            unresolved.append(r)
        # libcurl sends a request again, at once and with the same X-Outbox-Attempt, when a
        # reused keep-alive connection closes without an answer (see README.md).
        resent_at_once += bool(later and later[0]["attempt"] == r["attempt"] and later[0]["t"] - r["t_end"] < 0.5)
    check(f"accepted-but-lost responses happened: applied, then no answer in time ({dict(kinds)})",
          all(kinds[k] >= 1 for k in LOST), f"{lost}")
    check(f"each of the {len(lost)} was delivered again with the same Idempotency-Key and X-Outbox-Id and "
          "deduplicated: answered 200 from the partner's store (Idempotent-Replayed), nothing applied again "
          f"({resent_at_once} resent at once by libcurl within the same attempt, the others retried by the outbox)",
          not unresolved, f"{unresolved}")
    seen = defaultdict(int)
    for r in requests:
        if r["outbox_id"] and r["attempt"] and r["idempotency_key"] != f"evt_refunded_ref-{POISON:03d}":
            seen[r["outbox_id"]] = max(seen[r["outbox_id"]], r["attempt"])
    behind = {i: (outbox[i][2], n) for i, n in seen.items() if i in outbox and outbox[i][2] < n}
    retried = [i for i in {r["outbox_id"] for r in lost} if i in outbox and outbox[i][2] >= 2]
    check(f"the outbox counted every attempt the partner saw (attempts >= the highest X-Outbox-Attempt); "
          f"{len(retried)} of the lost-response events took more than one", not behind, f"{behind}")
    # --------------------------------------------------- the other failures
    def next_request(r):
        later = [x for x in by_key[r["idempotency_key"]] if x["n"] > r["n"]]
        return later[0] if later else None
    logged = failed_attempts(work)

    def come_back_later(answers, status):
        """Splits answers with Retry-After: 1 into those the relay read (it logged that attempt as failed with
        this status) and those it never read: written after its --http-timeout, when it had given up on the
        attempt (a busy machine answers late). Returns (gaps of the read ones to the next request, unread)."""
        read = [r for r in answers if r["status"] == status
                and logged.get((r["outbox_id"], r["attempt"]), "").startswith(f"HTTP {status}")]
        gaps = [(r["n"], round(nxt["t"] - r["t_end"], 3)) if (nxt := next_request(r)) else (r["n"], None)
                for r in read]
        return gaps, len(answers) - len(read)

    def retried_after_a_second(gaps):
        return gaps and all(g is not None and g >= 0.95 for _, g in gaps)

    in_progress = [r for r in requests if r["result"] == "in_progress"]
    gaps, unread = come_back_later(in_progress, "409")
    check(f"a retry that arrived while the partner was still applying the first request was told to come back "
          f"(409 with Retry-After: 1, {len(in_progress)} time(s), {unread} of them answered after the relay had "
          f"given up), and came back no sooner than 1 s later", retried_after_a_second(gaps), f"gaps {gaps}")
    unavailable = [r for r in requests if r["behaviour"] == "503"]
    gaps, unread = come_back_later(unavailable, "503")
    check(f"503 with Retry-After: 1 ({len(unavailable)} times, {unread} of them answered after the relay had "
          f"given up): every one retried, none sooner than 1 s later", retried_after_a_second(gaps), f"gaps {gaps}")
    errors = [r for r in requests if r["behaviour"] == "500"]
    check(f"500 ({len(errors)} times): every one retried", len(errors) >= 1 and all(next_request(r) for r in errors))

    # --------------------------------------------------------- the poison
    poison = f"evt_refunded_ref-{POISON:03d}"
    mine = by_key[poison]
    poison_id = committed[poison]["outbox_id"]
    rejected = [r for r in mine if r["status"] == "400"]
    check("the poison event was rejected with 400, then, after the partner's fix and the redrive, applied once "
          "(delivered)", rejected and any(r["result"] == "applied" for r in mine if r["n"] > rejected[-1]["n"])
          and times[poison] == 1
          and outbox[poison_id][1] == "delivered",
          f"requests {[(r['attempt'], r['status'], r['result']) for r in mine]}, outbox {outbox.get(poison_id)}")
    before = [r for r in mine if r["n"] < rejected[-1]["n"]] if rejected else []
    check("it was not retried after the 400 until the redrive (a final failure), and the redrive started its "
          "attempts again at 1", rejected and mine[mine.index(rejected[-1]) + 1]["attempt"] == 1
          and all(r["behaviour"] in ("500", "503") for r in before),
          f"{[(r['attempt'], r['status'], r['result']) for r in mine]}")

    # ------------------------------------------------------- the outbox
    states = Counter(row[1] for row in outbox.values())
    check(f"the outbox ends with every event delivered ({dict(states)})", states == Counter({"delivered": len(committed)}))

    # ------------------------------------------------------- the relays
    first, second = stopped_line(work / "relay-1.log"), stopped_line(work / "relay-2.log")
    check(f"both relay runs delivered (before the restart {first and first[0]}, after {second and second[0]}), "
          f"acks adding up to the events ({len(committed)})",
          first and second and first[0] > 0 and second[0] > 0 and first[0] + second[0] == len(committed),
          f"{first} {second}")
    drain = (work / "relay-1.log").read_text()
    check("the first run drained on SIGTERM (stopped claiming, finished its deliveries)",
          "stopping: no more claims" in drain and "stopped: " in drain)
    answered = [r for r in requests if r["status"] != "none"]
    check(f"the partner saw {len(requests)} requests for {len(committed)} events, {len(requests) - len(answered)} "
          "of them without an answer", len(requests) > len(committed))
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
