"""Multi-step work: job.step() runs a step and records it with idem_step in
the step's transaction, returns the stored result of a step that finished
before (an earlier attempt, which the claim resumes after), in both forms
(a function, a with block) and asynchronously; a worker that lost its key
is fenced at its next step; the Flask middleware resumes a failed request."""

import asyncio
import uuid
from collections import Counter

import psycopg
import pytest
from psycopg_pool import ConnectionPool

import pg_idempotency as idem
from conftest import SETTINGS, connect, effects, key_row, wait_for


def steps_of(admin, key, scope="default"):
    row = admin.execute("SELECT steps FROM idempotency.idempotency_keys WHERE scope = %s AND key = %s",
                        (scope, key)).fetchone()
    steps = (row and row[0]) or {}
    return [(name, s["n"], s["attempt"]) for name, s in sorted(steps.items(), key=lambda i: i[1]["n"])]


def three_steps(worker, charges, stop_after=None):
    """reserve (a write here), charge (a provider counting calls by the
    step's key, in the with-block form), email; raises after `stop_after`."""
    def work(job):
        out = {"resumed": job.resumed, "finished": list(job.steps)}

        def reserve(step):
            step.conn.execute("INSERT INTO effects (key, worker) VALUES (%s, %s)", (job.key, f"reserve {worker}"))
            return {"by": worker}
        out["reserve"] = job.step("reserve", reserve)
        if stop_after == "reserve":
            raise idem.RetryableError("stopped after reserve", retry_in=0)
        with job.step("charge") as s:
            if not s.done:
                charges[s.key] += 1
                s.result = {"charge": s.key, "by": worker}
        out["charge"] = s.result
        if stop_after == "charge":
            raise idem.RetryableError("stopped after charge", retry_in=0)
        out["email"] = job.step("email", lambda step: {"by": worker})
        return out
    return work


def test_step_key_is_what_idem_step_key_derives(conn):
    for scope, key, step in [("default", "order-42", "charge"), ("payment.capture", "order-42", "charge"),
                             ("s", "clé-ünïcode-🔑", "email:1"), ("a", "b", "c")]:
        derived = conn.execute("SELECT idempotency.idem_step_key(%s, %s, %s)", (key, step, scope)).fetchone()[0]
        assert idem.step_key(scope, key, step) == derived


def test_a_retry_resumes_after_the_finished_steps(conn, admin, new_key):
    key, charges = new_key(), Counter()
    first = idem.run_once(conn, key, three_steps("one", charges, stop_after="charge"))
    assert (first.outcome, first.retryable) == ("failed", True)
    done = wait_for("the retry", lambda: (lambda j: j if j.outcome == "completed" else None)(
        idem.run_once(conn, key, three_steps("two", charges))))
    assert done.resumed and done.result["finished"] == ["reserve", "charge"]
    assert done.result["reserve"] == {"by": "one"} and done.result["charge"]["by"] == "one"
    assert done.result["email"] == {"by": "two"}
    assert charges == Counter({idem.step_key("default", key, "charge"): 1})
    assert effects(admin, key) == ["reserve one"]
    assert steps_of(admin, key) == [("reserve", 1, 1), ("charge", 2, 1), ("email", 3, 2)]


def test_a_step_that_raises_records_nothing_and_rolls_back(conn, admin, new_key):
    key = new_key()

    def work(job):
        with job.step("reserve") as s:
            s.conn.execute("INSERT INTO effects (key, worker) VALUES (%s, 'reserve')", (key,))
            raise idem.RetryableError("stock service down", retry_in=0)
    job = idem.run_once(conn, key, work)
    assert job.outcome == "failed"
    assert effects(admin, key) == [] and steps_of(admin, key) == []


def test_a_step_finished_in_this_attempt_is_not_run_again(conn, new_key):
    runs = []

    def work(job):
        a = job.step("once", lambda s: runs.append(1) or len(runs))
        b = job.step("once", lambda s: runs.append(1) or len(runs))
        return [a, b, len(job.steps)]
    assert idem.run_once(conn, new_key(), work).result == [1, 1, 1]


def test_a_worker_that_lost_its_key_is_fenced_at_its_next_step(conn, other, admin, new_key):
    key, charges = new_key(), Counter()
    with idem.claim(conn, key, lease=1, heartbeat=False) as late:
        late.step("reserve", lambda s: s.conn.execute(
            "INSERT INTO effects (key, worker) VALUES (%s, 'reserve late')", (key,)) and "reserved")
        taker = wait_for("the takeover", lambda: (lambda j: j if j.outcome == "completed" else None)(
            idem.run_once(other, key, three_steps("taker", charges))))
        late_ran = []
        late.step("charge", lambda s: late_ran.append(1) or s.conn.execute(
            "INSERT INTO effects (key, worker) VALUES (%s, 'charge late')", (key,)) and "late")
    assert late.outcome == "fenced"
    assert late_ran == [], "the late worker ran a step the taker had finished"
    assert taker.result["finished"] == ["reserve"]
    assert sorted(effects(admin, key)) == ["reserve late"]


@pytest.mark.parametrize("what, value, message", [
    ("not JSON", {"at": object()}, "cannot be stored as JSON"),
    ("a NUL", {"s": "a\x00b"}, "NUL"),
    ("too large", {"huge": "x" * 17000}, "cannot be stored"),      # past idempotency.max_step_bytes (16 kB)
    ("NaN", {"ratio": float("nan")}, "cannot be stored as JSON"),
    ("a lone surrogate", {"s": "\udc80"}, "surrogate"),
])
def test_a_step_whose_result_cannot_be_stored_fails_the_key_for_good(conn, admin, new_key, what, value, message):
    key, runs = new_key(), []

    def work(job):
        return job.step("charge", lambda s: runs.append(1) or value)
    job = idem.run_once(conn, key, work)
    assert (job.outcome, job.retryable) == ("failed", False) and message in job.error
    assert key_row(admin, key)[0] == "FAILED_FINAL"
    assert idem.run_once(conn, key, work).replayed and len(runs) == 1


def test_a_step_in_a_transaction_that_rolls_back_runs_again(conn, admin, new_key):
    # Remembered as finished before the caller's transaction committed, the
    # step was skipped by the retry (the key completed without it).
    key, runs = new_key(), []

    def charge(s):
        runs.append(1)
        s.conn.execute("INSERT INTO effects (key, worker) VALUES (%s, 'charge')", (key,))
        return {"try": len(runs)}
    with idem.claim(conn, key) as job:
        with pytest.raises(RuntimeError):
            with conn.transaction():
                assert job.step("charge", charge) == {"try": 1}
                raise RuntimeError("a serialization failure, say")
        with conn.transaction():
            assert job.step("charge", charge) == {"try": 2}
        assert job.step("charge", charge) == {"try": 2}     # recorded: not run again
        job.result = "done"
    assert job.outcome == "completed" and len(runs) == 2
    assert effects(admin, key) == ["charge"]


def test_a_step_past_max_steps_fails_the_key_for_good(conn, admin, new_key):
    # 54000 would come at every attempt, after the step's work.
    key, runs = new_key(), []

    def work(job):
        for i in range(33):     # idempotency.max_steps is 32
            job.step(f"s{i}", lambda s: runs.append(1) or i)
    job = idem.run_once(conn, key, work)
    assert (job.outcome, job.retryable) == ("failed", False) and "step cannot be recorded" in job.error
    assert key_row(admin, key)[0] == "FAILED_FINAL"
    assert idem.run_once(conn, key, work).replayed and len(runs) == 33


@pytest.mark.parametrize("name", ["charge card", "", "x" * 64, "café"])
def test_a_step_name_idem_step_refuses_fails_the_key_before_the_step_runs(conn, admin, new_key, name):
    key, runs = new_key(), []
    job = idem.run_once(conn, key, lambda job: job.step(name, lambda s: runs.append(1)))
    assert (job.outcome, job.retryable) == ("failed", False) and "step's name" in job.error
    assert runs == []
    with pytest.raises(idem.FinalError, match="step's name"):
        idem.step_key("default", key, name)
    with pytest.raises(psycopg.Error) as refused:
        connect(autocommit=True).execute("SELECT idempotency.idem_step_key(%s, %s)", (key, name))
    assert refused.value.sqlstate in ("22023", "22001"), "the server refuses it too"


def test_async_jobs_have_the_same_steps(new_key):
    key, charges = new_key(), Counter()

    async def scenario():
        async with await psycopg.AsyncConnection.connect(options=SETTINGS, autocommit=True) as aconn:
            async def work(job, fail):
                async def reserve(step):
                    return {"attempt": job.attempt}
                out = [await job.step("reserve", reserve)]
                async with job.step("charge") as s:
                    if not s.done:
                        charges[s.key] += 1
                        s.result = {"attempt": job.attempt}
                out.append(s.result)
                if fail:
                    raise idem.RetryableError("mail provider timeout", retry_in=0)
                return out + [job.resumed]
            first = await idem.arun_once(aconn, key, lambda job: work(job, True))
            await asyncio.sleep(0.2)
            second = await idem.arun_once(aconn, key, lambda job: work(job, False))
            return first, second
    first, second = asyncio.run(scenario())
    assert first.outcome == "failed"
    assert second.result == [{"attempt": 1}, {"attempt": 1}, True]
    assert list(charges.values()) == [1]


flask = pytest.importorskip("flask", reason="python3-flask is not installed")
from pg_idempotency.flask import Idempotency, context  # noqa: E402


def test_flask_a_step_whose_result_cannot_be_stored_fails_the_key_for_good(admin):
    runs = Counter()
    with ConnectionPool(kwargs={"autocommit": True, "options": SETTINGS}, min_size=1, max_size=3) as pool:
        app = flask.Flask("steps-unstorable")
        Idempotency(app, pool=pool, scope="flask.steps-unstorable", paths=["/charge"])

        @app.post("/charge")
        def charge():
            ctx = context()
            ctx.step("charge", lambda s: runs.update([ctx.key]) or {"at": object()})
            return flask.jsonify(charged=True), 201
        client = app.test_client()
        key = f"steps-{uuid.uuid4()}"
        assert client.post("/charge", json={}, headers={"Idempotency-Key": key}).status_code == 500
        assert key_row(admin, key, "flask.steps-unstorable")[0] == "FAILED_FINAL"
        again = client.post("/charge", json={}, headers={"Idempotency-Key": key})
        assert (again.status_code, again.headers.get("Idempotent-Replayed")) == (500, "true")
        assert runs[key] == 1


def test_flask_a_retried_request_resumes_after_its_finished_steps(admin):
    charges, runs = Counter(), Counter()
    with ConnectionPool(kwargs={"autocommit": True, "options": SETTINGS}, min_size=1, max_size=3) as pool:
        app = flask.Flask("steps")
        Idempotency(app, pool=pool, scope="flask.steps", paths=["/checkout"])

        @app.post("/checkout")
        def checkout():
            ctx = context()
            runs[ctx.key] += 1
            resumed = list(ctx.steps)

            def reserve(step):
                step.conn.execute("INSERT INTO effects (key, worker) VALUES (%s, 'reserve')", (ctx.key,))
                return {"reserved": 1}
            ctx.step("reserve", reserve)
            with ctx.step("charge") as s:
                if not s.done:
                    charges[s.key] += 1
                    s.result = {"charge": s.key}
            if runs[ctx.key] == 1:
                return flask.jsonify(error="mail provider down"), 503
            return flask.jsonify(resumed=resumed, charge=s.result, key=ctx.step_key("charge")), 201
        client = app.test_client()
        key = f"steps-{uuid.uuid4()}"
        assert client.post("/checkout", json={}, headers={"Idempotency-Key": key}).status_code == 503
        retry = client.post("/checkout", json={}, headers={"Idempotency-Key": key})
        assert retry.status_code == 201
        body = retry.get_json()
        assert body["resumed"] == ["reserve", "charge"] and body["charge"]["charge"] == body["key"]
        assert charges == Counter({body["key"]: 1})
        assert effects(admin, key) == ["reserve"]
        assert client.post("/checkout", json={}, headers={"Idempotency-Key": key}).headers["Idempotent-Replayed"] == "true"
        assert runs[key] == 2
