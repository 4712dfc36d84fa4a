import threading
import time

import pg_idempotency as idem
from conftest import connect, wait_for


def state(admin, event_id):
    return admin.execute("SELECT state::text, attempts, last_error FROM idempotency.outbox WHERE id = %s",
                         (event_id,)).fetchone()


def test_enqueue_joins_the_callers_transaction(conn, admin, new_key):
    topic = new_key("topic")
    with conn.transaction():
        kept = idem.enqueue(conn, topic, [1, 2, 3])
    try:
        with conn.transaction():
            dropped = idem.enqueue(conn, topic, {"n": 2})
            raise RuntimeError("roll back")
    except RuntimeError:
        pass
    assert state(admin, kept)[0] == "pending"
    assert state(admin, dropped) is None
    rows = admin.execute("SELECT payload FROM idempotency.outbox WHERE topic = %s", (topic,)).fetchall()
    assert rows == [([1, 2, 3],)]


def test_a_dedup_key_enqueues_at_most_once(conn, admin, new_key):
    topic = new_key("topic")
    with conn.transaction():
        first = idem.enqueue(conn, topic, {"n": 1}, dedup_key="d-1", key="k", headers={"tenant": "acme"})
        second = idem.enqueue(conn, topic, {"n": 1}, dedup_key="d-1")
    assert first == second
    assert admin.execute("SELECT key, headers FROM idempotency.outbox WHERE id = %s", (first,)).fetchone() == \
        ("k", {"tenant": "acme"})


def test_settlement_maps_outcomes_and_errors():
    def job(**fields):
        j = idem.Job.__new__(idem.Job)
        j.__dict__.update({"replayed": False, "retryable": None, "retry_after": None, "error": None, **fields})
        return j
    assert idem.settlement(None, None) == ("ack",)
    assert idem.settlement(job(outcome="completed"), None) == ("ack",)
    assert idem.settlement(job(outcome="failed", error="e", retryable=True, retry_after=2), None) == ("nack", "e", True, 2)
    assert idem.settlement(job(outcome="failed", error="e", retryable=False), None) == ("nack", "e", False, None)
    assert idem.settlement(job(outcome="failed", error="e", replayed=True), None) == ("ack",)
    assert idem.settlement(job(outcome="in_progress", retry_after=4), None) == ("release", 4)
    assert idem.settlement(job(outcome="retry_later", retry_after=0.2), None) == ("release", 0.2)
    assert idem.settlement(job(outcome="mismatch"), None)[2] is False
    assert idem.settlement(job(outcome="fenced"), None) == ("leave",)
    assert idem.settlement(None, idem.RetryableError("slow", retry_in=3)) == ("nack", "slow", True, 3)
    assert idem.settlement(None, idem.FinalError("bad")) == ("nack", "bad", False, None)


def test_settlement_of_a_bad_retry_in_or_a_classify_that_raises(caplog):
    class Odd(Exception):
        retry_in = -1
    assert idem.settlement(None, Odd("odd")) == ("nack", "odd", True, None), "the extension's backoff instead"

    def broken(exc):
        raise RuntimeError("classify is broken")
    assert idem.settlement(None, idem.FinalError("bad"), broken) == ("nack", "bad", False, None)
    assert any("classify raised" in r.getMessage() for r in caplog.records)
    assert idem.settlement(None, RuntimeError("bad\x00byte")) == ("nack", "bad\ufffdbyte", True, None)


def run_consumer(consumer, handler):
    thread = threading.Thread(target=consumer.run, args=(handler,), daemon=True)
    thread.start()
    return thread


def test_the_consumer_acks_retries_and_buries(conn, admin, new_key):
    topic = new_key("topic")
    with conn.transaction():
        ok, flaky, poison = (idem.enqueue(conn, topic, {"kind": k}) for k in ("ok", "flaky", "poison"))
    seen = []

    def handle(event):
        seen.append(f"{event['payload']['kind']}#{event['attempt']}")
        if event["payload"]["kind"] == "flaky" and event["attempt"] == 1:
            raise idem.RetryableError("not yet", retry_in=0)
        if event["payload"]["kind"] == "poison":
            raise idem.FinalError("cannot parse")

    consumer = idem.Consumer("", [topic], name="test", poll=0.2, log=lambda message: None)
    thread = run_consumer(consumer, handle)
    wait_for("the events to settle", lambda: state(admin, flaky)[0] == "delivered" and state(admin, poison)[0] == "dead")
    consumer.stop()
    thread.join(10)
    assert not thread.is_alive()
    assert state(admin, ok)[0] == "delivered"
    assert state(admin, poison)[2] == "cannot parse"
    assert sorted(seen) == ["flaky#1", "flaky#2", "ok#1", "poison#1"]


def test_the_consumer_wakes_on_a_notification(conn, new_key):
    topic = new_key("topic")
    delivered = []
    consumer = idem.Consumer("", [topic], poll=30)
    thread = run_consumer(consumer, lambda event: delivered.append(event["id"]))
    time.sleep(0.3)     # idle, listening
    with conn.transaction():
        event_id = idem.enqueue(conn, topic, {"n": 1})
    wait_for("the delivery", lambda: event_id in delivered, 10)
    consumer.stop()
    thread.join(10)


def test_as_a_job_queue_duplicates_of_a_key_run_once(conn, admin, new_key):
    topic, key = new_key("topic"), new_key()
    with conn.transaction():
        ids = [idem.enqueue(conn, topic, {"key": key, "amount": 5}, dedup_key=f"{key}/{run}") for run in (1, 2, 3)]
    runs = []
    work = connect(autocommit=True)

    def handle(event):
        with idem.claim(work, event["payload"]["key"], event["payload"], scope="jobs", wait=10) as job:
            runs.append(event["id"])          # a duplicate raises NotClaimed: the consumer settles by it
            job.result = {"paid": event["payload"]["amount"]}
        return job

    consumer = idem.Consumer("", [topic], poll=0.2)
    thread = run_consumer(consumer, handle)
    wait_for("every job delivered", lambda: all(state(admin, i)[0] == "delivered" for i in ids))
    consumer.stop()
    thread.join(10)
    work.close()
    assert len(runs) == 1


class Stale(Exception):
    sqlstate = "IK001"


def test_a_fenced_handler_leaves_its_event_and_calls_on_fenced(conn, admin, new_key):
    topic = new_key("topic")
    with conn.transaction():
        event_id = idem.enqueue(conn, topic, {"n": 1}, key="k-1")
    fenced = []
    consumer = idem.Consumer("", [topic], poll=0.2, lease=30, log=lambda message: None, on_fenced=fenced.append)

    def handle(event):
        consumer.stop()
        raise Stale("stale token: the key was claimed again")
    thread = run_consumer(consumer, handle)
    thread.join(10)
    assert not thread.is_alive()
    assert state(admin, event_id)[0] == "in_flight", "left for the worker that took the key over"
    assert [(f["outcome"], f["event_id"], f["key"]) for f in fenced] == [("fenced", event_id, "k-1")]


def test_an_event_whose_key_another_worker_holds_waits_for_it(conn, admin, new_key):
    """An event whose key another worker holds (a claim whose worker died,
    its lease 3 s) did not fail: it comes back without an attempt counted
    until the key is free, then the work runs once and the event is acked.
    The scope's quick completions make in_progress answer a retry_after of
    milliseconds: nacked after it, the event used up its attempts at once
    and died without the work ever running."""
    topic, scope = new_key("topic"), new_key("held")
    work = connect(autocommit=True)
    for i in range(10):
        with idem.claim(work, f"quick-{i}", scope=scope, lease=3) as job:
            job.result = "ok"
    work.execute("SELECT idempotency.idem_claim('held', lease => interval '3 seconds', scope => %s)", (scope,))
    with conn.transaction():
        event_id = idem.enqueue(conn, topic, {"n": 1}, key="held")
    runs, deliveries = [], []

    def handle(event):
        deliveries.append(event["id"])
        with idem.claim(work, "held", scope=scope, lease=3) as job:
            runs.append(event["id"])
            job.result = "done"
        return job

    consumer = idem.Consumer("", [topic], poll=0.1, lease=10, log=lambda message: None)
    thread = run_consumer(consumer, handle)
    wait_for("the event delivered or dead", lambda: state(admin, event_id)[0] in ("delivered", "dead"), 40)
    consumer.stop()
    thread.join(10)
    work.close()
    assert not thread.is_alive()
    assert state(admin, event_id)[0] == "delivered"
    assert len(runs) == 1 and len(deliveries) >= 2, (runs, deliveries)
