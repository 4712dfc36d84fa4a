import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

import pg_idempotency as idem
from conftest import SETTINGS, effects, expire_result, key_row, wait_for


def run_once(conn, key, result, **options):
    return idem.run_once(conn, key, lambda job: result, **options)


def test_runs_once_and_replays_the_result(conn, new_key):
    key, runs = new_key(), []
    for _ in range(2):
        job = idem.run_once(conn, key, lambda job: runs.append(job.attempt) or {"sent": "m-1"}, {"n": 1})
    assert runs == [1]
    assert (job.outcome, job.result, job.replayed) == ("completed", {"sent": "m-1"}, True)


def test_the_block_of_a_duplicate_does_not_run(conn, new_key):
    """Finding 4: the block ran for every duplicate unless it checked job.claimed."""
    key, runs = new_key(), []
    for _ in range(3):
        try:
            with idem.claim(conn, key, {"n": 1}) as job:
                runs.append(job.attempt)        # no `if job.claimed:`
                job.result = {"sent": "m-1"}
        except idem.NotClaimed as answer:
            job = answer.job
    assert runs == [1], "the work ran once, not once per duplicate"
    assert (job.outcome, job.result, job.replayed, job.claimed) == ("completed", {"sent": "m-1"}, True, False)


def test_hooks_report_conflicts_replays_and_fenced_workers(conn, other, new_key):
    key, seen = new_key(), []
    hooks = {name: (lambda info, name=name: seen.append((name, info["outcome"], info["key"])))
             for name in ("on_replay", "on_conflict", "on_fenced")}
    with idem.claim(conn, key, lease=1, heartbeat=False, **hooks) as late:
        assert run_once(other, key, "x", **hooks).outcome == "in_progress"
        wait_for("the takeover", lambda: run_once(other, key, "taker", **hooks).outcome == "completed")
        late.complete("late")
    assert late.outcome == "fenced"
    assert ("on_conflict", "in_progress", key) in seen
    assert ("on_fenced", "fenced", key) in seen
    assert run_once(other, key, "x", **hooks).replayed and seen[-1] == ("on_replay", "completed", key)


def test_a_failing_hook_changes_nothing(conn, new_key):
    key = new_key()
    run_once(conn, key, "done")

    def broken(info):
        raise RuntimeError("hook")
    assert run_once(conn, key, "again", on_replay=broken).result == "done"


def test_a_duplicate_after_the_result_expired_is_never_run_again(conn, admin, new_key):
    key, runs = new_key(), []
    idem.run_once(conn, key, lambda job: runs.append(1) or {"sent": "m-1"}, {"n": 1})
    expire_result(admin, key)
    job = idem.run_once(conn, key, lambda job: runs.append(2), {"n": 1})
    assert (job.outcome, job.result, job.replayed, job.result_expired) == ("completed", None, True, True)
    assert idem.run_once(conn, key, lambda job: runs.append(3), {"n": 2}).outcome == "mismatch"
    assert runs == [1]
    assert key_row(admin, key) is None, "no key was created again"
    with pytest.raises(idem.NotClaimed) as refused:
        with idem.claim(conn, key, {"n": 1}):
            runs.append(4)
    assert refused.value.job.result_expired and runs == [1]


def test_a_final_failure_whose_error_expired_answers_failed(conn, admin, new_key):
    key = new_key()

    def refuse(job):
        raise idem.FinalError("card refused")
    idem.run_once(conn, key, refuse)
    expire_result(admin, key)
    job = idem.run_once(conn, key, lambda job: pytest.fail("ran again"))
    assert (job.outcome, job.error, job.result_expired) == ("failed", None, True)


def test_a_fresh_answer_has_no_expired_result(conn, new_key):
    key = new_key()
    assert run_once(conn, key, "done").result_expired is False
    assert run_once(conn, key, "again").result_expired is False


def test_another_request_under_the_key_is_a_mismatch(conn, new_key):
    key = new_key()
    run_once(conn, key, "done", request={"n": 1})
    assert run_once(conn, key, "again", request={"n": 2}).outcome == "mismatch"


def test_a_key_held_elsewhere_is_in_progress_with_the_lease_left(conn, other, new_key):
    # A scope with no completion yet has no estimate of when the holder will
    # be done: retry_after is the lease left (docs/keys.md).
    key = new_key()
    scope = f"no-estimate-{key}"
    with idem.claim(conn, key, lease=20, scope=scope) as job:
        inner = run_once(other, key, "twice", scope=scope)
        assert 10 < inner.retry_after <= 20
    assert job.outcome == "completed"
    assert inner.outcome == "in_progress" and not inner.claimed


def test_transaction_commits_writes_and_complete_together(conn, admin, new_key):
    key = new_key()
    with idem.claim(conn, key) as job:
        with job.transaction():
            conn.execute("INSERT INTO effects (key, worker) VALUES (%s, 'one')", (key,))
            job.complete({"rows": 1})
    assert (job.outcome, job.result, job.replayed) == ("completed", {"rows": 1}, False)
    assert effects(admin, key) == ["one"]
    assert key_row(admin, key) == ("COMPLETED", 1)


def test_an_exception_is_a_retryable_failure_claimed_again_after_the_backoff(conn, admin, new_key):
    key = new_key()
    with idem.claim(conn, key) as job:
        raise TimeoutError("provider timeout")
    assert (job.outcome, job.retryable, job.error) == ("failed", True, "provider timeout")
    assert isinstance(job.exception, TimeoutError)
    assert 0 <= job.retry_after < 1
    assert key_row(admin, key) == ("FAILED_RETRYABLE", 1)
    retried = wait_for("the retry", lambda: (j := run_once(conn, key, "ok")).outcome == "completed" and j)
    assert not retried.replayed and key_row(admin, key) == ("COMPLETED", 2)


def test_retryable_error_sets_the_delay(conn, new_key):
    key = new_key()
    with idem.claim(conn, key) as job:
        raise idem.RetryableError("busy", retry_in=30)
    assert job.retryable and 25 < job.retry_after <= 30
    assert run_once(conn, key, "x").outcome == "retry_later"


def test_final_error_fails_for_good_and_duplicates_get_the_failure(conn, admin, new_key):
    key = new_key()
    with idem.claim(conn, key) as job:
        raise idem.FinalError("card declined")
    assert (job.outcome, job.retryable) == ("failed", False)
    assert key_row(admin, key) == ("FAILED_FINAL", 1)
    again = run_once(conn, key, "x")
    assert (again.outcome, again.error, again.retryable, again.replayed) == ("failed", "card declined", False, True)


def test_classify_decides_which_errors_are_final(conn, new_key):
    with idem.claim(conn, new_key(), classify=lambda exc: "final" if isinstance(exc, ValueError) else "retryable") as job:
        raise ValueError("bad input")
    assert job.retryable is False


def test_a_classify_that_raises_fails_the_key_by_default_and_is_logged(conn, admin, new_key, caplog):
    def broken(exc):
        raise RuntimeError("classify is broken")
    key = new_key()
    with idem.claim(conn, key, classify=broken) as job:
        raise ValueError("provider down")
    assert (job.outcome, job.retryable) == ("failed", True)
    assert key_row(admin, key) == ("FAILED_RETRYABLE", 1)
    assert any("classify raised" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("retry_in", [-1, float("inf"), float("nan"), "5", True, 36000 * 86400 + 1])
def test_retryable_error_refuses_a_retry_in_the_extension_would(retry_in):
    with pytest.raises(ValueError, match="retry_in must be"):
        idem.RetryableError("x", retry_in=retry_in)


def test_another_errors_retry_in_out_of_range_is_ignored(conn, admin, new_key):
    class Slow(Exception):
        retry_in = -5
    key = new_key()
    assert idem.RetryableError("x", retry_in=0).retry_in == 0
    with idem.claim(conn, key) as job:
        raise Slow("slow")
    assert (job.outcome, job.retryable) == ("failed", True)
    assert key_row(admin, key) == ("FAILED_RETRYABLE", 1)


def test_a_result_with_a_nul_character_fails_the_key_for_good(conn, admin, new_key):
    key = new_key()
    job = run_once(conn, key, {"text": "a\x00b"})
    assert (job.outcome, job.retryable) == ("failed", False) and "NUL" in job.error
    assert key_row(admin, key) == ("FAILED_FINAL", 1)
    assert run_once(conn, new_key(), {"text": "a\\u0000b"}).outcome == "completed"


# Each of these the server would refuse (22P02, 22001) after the work ran:
# left held, the key would run its work again once the lease ended.
UNSTORABLE_RESULTS = [
    ("NaN", {"ratio": float("nan")}, "JSON"),
    ("Infinity", [float("inf")], "JSON"),
    ("a lone surrogate", {"s": "a\ud800"}, "surrogate"),
    ("over idempotency.max_value_bytes (1 MB)", {"big": "x" * (1024 * 1024 + 1)}, "must be at most"),
]


@pytest.mark.parametrize("what, result, message", UNSTORABLE_RESULTS, ids=[c[0] for c in UNSTORABLE_RESULTS])
def test_a_result_the_server_would_refuse_fails_the_key_for_good(conn, admin, new_key, what, result, message):
    key, runs = new_key(), []
    job = idem.run_once(conn, key, lambda job: runs.append(1) or result)
    assert (job.outcome, job.retryable) == ("failed", False) and message in job.error
    assert key_row(admin, key) == ("FAILED_FINAL", 1)
    assert idem.run_once(conn, key, lambda job: runs.append(1)).replayed and len(runs) == 1


@pytest.mark.parametrize("what, result, message", UNSTORABLE_RESULTS, ids=[c[0] for c in UNSTORABLE_RESULTS])
def test_aclaim_fails_a_result_the_server_would_refuse_for_good(admin, new_key, what, result, message):
    async def scenario(key):
        async with await psycopg.AsyncConnection.connect(options=SETTINGS) as aconn:
            async with idem.aclaim(aconn, key) as job:
                job.result = result
        return job
    key = new_key()
    job = asyncio.run(scenario(key))
    assert (job.outcome, job.retryable) == ("failed", False) and message in job.error
    assert key_row(admin, key) == ("FAILED_FINAL", 1)


def test_a_result_completed_in_the_block_that_cannot_be_stored_fails_the_key_for_good(conn, admin, new_key):
    key = new_key()
    with idem.claim(conn, key) as job:
        with job.transaction():
            job.complete({"big": "x" * (1024 * 1024 + 1)})
    assert (job.outcome, job.retryable) == ("failed", False) and "cannot be stored" in job.error
    assert key_row(admin, key) == ("FAILED_FINAL", 1)


def test_an_error_message_over_8_kib_is_stored_cut(conn, admin, new_key):
    key = new_key()
    with idem.claim(conn, key) as job:
        raise idem.FinalError("é" * (1024 * 1024))      # 2 MB of UTF-8: over max_value_bytes too
    assert (job.outcome, job.retryable) == ("failed", False)
    assert len(job.error.encode()) <= 8192 and job.error.endswith("[cut from 2097152 bytes]")
    assert key_row(admin, key) == ("FAILED_FINAL", 1)


@pytest.mark.parametrize("message, stored", [("bad\x00byte", "bad\ufffdbyte"), ("bad\udcffbyte", "bad?byte")])
def test_an_error_message_text_cannot_hold_is_stored_replaced(conn, admin, new_key, message, stored):
    key = new_key()
    with idem.claim(conn, key) as job:
        raise RuntimeError(message)
    assert (job.outcome, job.error) == ("failed", stored)
    assert key_row(admin, key) == ("FAILED_RETRYABLE", 1)


def test_reraise_lets_the_error_through_after_recording_it(conn, admin, new_key):
    key = new_key()
    with pytest.raises(KeyError):
        with idem.claim(conn, key, reraise=True):
            raise KeyError("x")
    assert key_row(admin, key) == ("FAILED_RETRYABLE", 1)


def test_release_gives_the_key_back_without_an_attempt(conn, admin, new_key):
    key = new_key()
    with idem.claim(conn, key) as job:
        job.release()
    assert job.outcome == "released"
    assert run_once(conn, key, "x").attempt == 1


def test_the_heartbeat_keeps_a_one_second_lease_through_two_and_a_half(conn, other, admin, new_key):
    key, seen = new_key(), []
    with idem.claim(conn, key, lease=1) as job:
        for _ in range(5):
            time.sleep(0.5)
            seen.append(run_once(other, key, "twice").outcome)
        assert not job.lost.is_set()
    assert seen == ["in_progress"] * 5
    assert key_row(admin, key) == ("COMPLETED", 1)


def test_without_heartbeat_the_late_worker_is_fenced_and_its_writes_roll_back(conn, other, admin, new_key):
    key = new_key()
    with idem.claim(conn, key, lease=1, heartbeat=False) as late:
        def take_over():
            def work(taker):
                with taker.transaction():
                    other.execute("INSERT INTO effects (key, worker) VALUES (%s, 'taker')", (key,))
                    taker.complete("taker")
            taker = idem.run_once(other, key, work)
            return taker.outcome == "completed" and not taker.replayed
        wait_for("the takeover", take_over)
        with late.transaction():
            conn.execute("INSERT INTO effects (key, worker) VALUES (%s, 'late')", (key,))
            late.complete("late")
    assert late.outcome == "fenced"
    assert late.exception.sqlstate == "IK001"
    assert effects(admin, key) == ["taker"]


def test_in_the_callers_transaction_claim_writes_and_complete_commit_together(conn, other, admin, new_key):
    key, dropped = new_key(), new_key()
    with conn.transaction():
        with idem.claim(conn, key) as job:
            conn.execute("INSERT INTO effects (key, worker) VALUES (%s, 'one')", (key,))
            job.result = "done"
    assert key_row(admin, key) == ("COMPLETED", 1) and effects(admin, key) == ["one"]
    with pytest.raises(ZeroDivisionError):
        with conn.transaction():
            with idem.claim(conn, dropped):
                conn.execute("INSERT INTO effects (key, worker) VALUES (%s, 'dropped')", (dropped,))
                1 / 0
    assert key_row(admin, dropped) is None and effects(admin, dropped) == []


def test_the_decorator(conn, new_key):
    calls = []

    @idem.idempotent(key=lambda invoice: f"{invoice['id']}/email", request=lambda invoice: invoice,
                     scope="invoice.email")
    def send(job, invoice):
        calls.append(invoice["id"])
        return {"to": invoice["to"]}

    invoice = {"id": new_key("inv"), "to": "a@example.com"}
    first, second = send(conn, invoice), send(conn, invoice)
    assert calls == [invoice["id"]]
    assert (first.outcome, second.outcome, second.replayed, second.result) == \
        ("completed", "completed", True, {"to": "a@example.com"})


def test_aclaim(new_key):
    async def scenario():
        key = new_key()
        async with await psycopg.AsyncConnection.connect(options=SETTINGS) as aconn, \
                await psycopg.AsyncConnection.connect(options=SETTINGS, autocommit=True) as aother:
            async with idem.aclaim(aconn, key, lease=1) as job:
                await asyncio.sleep(1.5)    # the heartbeat task keeps the lease
                with pytest.raises(idem.NotClaimed) as refused:
                    async with idem.aclaim(aother, key):
                        raise AssertionError("the block of a duplicate ran")
                inner = refused.value.job
                async with job.transaction():
                    await job.complete({"ok": True})

            async def never(job):
                raise AssertionError("work ran for a duplicate")
            again = await idem.arun_once(aother, key, never)
            async with idem.aclaim(aconn, new_key()) as failing:
                raise idem.FinalError("no")
        return job, inner, again, failing
    job, inner, again, failing = asyncio.run(scenario())
    assert (job.outcome, inner.outcome, again.outcome, again.result) == \
        ("completed", "in_progress", "completed", {"ok": True})
    assert (failing.outcome, failing.retryable) == ("failed", False)


class TestWorkerProcess:
    def start(self, key):
        env = {**os.environ, "KEY": key, "LEASE": "1", "PGOPTIONS": SETTINGS}
        child = subprocess.Popen([sys.executable, str(Path(__file__).with_name("worker_process.py"))], env=env,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "claimed"
        return child

    def take_over(self, conn, key):
        def once():
            def work(job):
                with job.transaction():
                    conn.execute("INSERT INTO effects (key, worker) VALUES (%s, 'taker')", (key,))
                    job.complete({"attempt": job.attempt})
            job = idem.run_once(conn, key, work, lease=10)
            return job.outcome == "completed" and not job.replayed and job
        return wait_for("the takeover", once)

    def test_killed_mid_job_its_key_is_taken_over_when_the_lease_ends(self, conn, admin, new_key):
        key = new_key()
        child = self.start(key)
        child.kill()
        child.wait()
        assert self.take_over(conn, key).result == {"attempt": 2}
        assert effects(admin, key) == ["taker"]
        assert key_row(admin, key) == ("COMPLETED", 2)

    def test_paused_past_its_lease_taken_over_then_fenced_when_it_resumes(self, conn, admin, new_key):
        key = new_key()
        child = self.start(key)
        child.send_signal(signal.SIGSTOP)
        try:
            assert self.take_over(conn, key).result == {"attempt": 2}
        finally:
            child.send_signal(signal.SIGCONT)
        out, _ = child.communicate("go\n", timeout=30)
        assert out.startswith("fenced"), out
        assert effects(admin, key) == ["taker"], "the late worker wrote nothing"
        assert key_row(admin, key) == ("COMPLETED", 2)
