"""Multi-step work (docs/keys.md, "Multi-step work"): each finished step is
recorded on the key with idem_step, in the transaction of the step's own
writes; a claim that resumes the key is given the finished steps, and a
step that finished returns its stored result instead of running again.

    charge = job.step("charge", lambda s: provider.charge(idempotency_key=s.key))

    with job.step("charge") as s:       # the block always runs: skip it when s.done
        if not s.done:
            s.result = provider.charge(idempotency_key=s.key)
    charge = s.result

The asynchronous forms are ``await job.step(name, afn)`` and ``async with
job.step(name) as s``."""

import contextlib
import hashlib
import re

import psycopg
from psycopg import pq

from . import _sql
from .errors import FinalError, UnstorableResult

# A step's name as idem_step takes it: 1 to 63 bytes of ASCII letters,
# digits and _ . : - (it is part of the step's key, which providers receive
# in a header). Checked before the step runs: a name the server refuses
# would fail the key at every attempt, after the step's work.
_STEP_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,63}")


def check_step_name(name):
    if not isinstance(name, str) or not _STEP_NAME.fullmatch(name):
        raise FinalError(f"idempotency: a step's name is 1 to 63 ASCII letters, digits and _ . : -, not {name!r}")


def parse_steps(steps):
    """The finished steps of a claim's answer (name -> {n, attempt,
    result}) as a dict in the order they finished."""
    return dict(sorted((steps or {}).items(), key=lambda item: item[1]["n"]))


def step_key(scope, key, step):
    """The key of a step's external call, to give the provider as its own
    idempotency key: the text idem_step_key(key, step, scope) returns,
    computed without a round trip (the step's name, a dash and the first
    128 bits of the SHA-256 of scope, key and step, each preceded by its
    length in bytes and a colon). A name idem_step_key refuses raises
    FinalError."""
    check_step_name(step)
    digest = hashlib.sha256()
    for part in (scope, key, step):
        data = part.encode()
        digest.update(f"{len(data)}:".encode())
        digest.update(data)
    return f"{step}-{digest.hexdigest()[:32]}"


class Step:
    """What a step's code gets: its ``name``, ``key`` (for the external
    call), ``conn`` (the connection of the step's transaction: its writes
    commit with the step's record), ``done`` (True when the step finished
    before: ``result`` is then the stored result) and ``result`` (what to
    record, set by the block)."""

    def __init__(self, name, key, done, result):
        self.name, self.key, self.done, self.result = name, key, done, result
        self.conn = None

    def __repr__(self):
        return f"<Step {self.name} {'done' if self.done else 'running'}>"


class StepHolder:
    """The claim a step belongs to: the key, its token, scope and attempt,
    the steps finished so far, and where a step's transaction runs:
    ``connection()`` gives a context manager of a connection (the job's
    own, a pool's). ``noted(exc)``, when given, hears of a step whose
    result could not be stored (the middlewares fail the key for good)."""

    def __init__(self, key, token, scope, attempt, steps, connection, noted=None):
        self.key, self.token, self.scope, self.attempt = key, token, scope, attempt
        self.steps = steps
        self.connection = connection
        self.noted = noted

    def begin(self, name):
        if self.token is None:
            raise RuntimeError("idempotency: steps need a claimed key")
        done = name in self.steps
        return Step(name, step_key(self.scope, self.key, name), done,
                    self.steps[name]["result"] if done else None)

    def owner(self, step):
        return {"key": self.key, "token": self.token, "scope": self.scope, "step": step.name}

    def params(self, step):
        try:
            result = _sql.jsonb_now(step.result)
        except (TypeError, ValueError) as exc:      # json.dumps: a datetime, a cycle, a NUL
            raise self.unstorable(f"the step's result cannot be stored as JSON: {exc}") from exc
        return {"key": self.key, "token": self.token, "step": step.name, "result": result, "scope": self.scope}

    def unstorable(self, message):
        """The error of a step whose result cannot be stored: it would be so
        at every attempt, after the step's work, so the key fails for good."""
        exc = UnstorableResult(message)
        if self.noted is not None:
            self.noted(exc)
        return exc

    def recorded(self, step, n):
        self.steps[step.name] = {"n": n, "attempt": self.attempt, "result": step.result}

    def begun(self, step, outer, recorded):
        """What STEP_BEGIN found: a step already recorded is done, with its
        stored result (remembered unless a transaction of the caller's,
        which may still roll back, holds it)."""
        if recorded is None:
            return False
        step.done, step.result = True, recorded["result"]
        if not outer:
            self.steps[step.name] = recorded
        return True


class SyncStep:
    """``with holder's step(name) as s``: a transaction on the holder's
    connection around the block, and the step's record in it."""

    def __init__(self, holder, name):
        self.holder, self.step = holder, holder.begin(name)
        self.stack = None
        self.outer = False

    def __enter__(self):
        if not self.step.done:
            with contextlib.ExitStack() as stack:
                conn = stack.enter_context(self.holder.connection())
                # A step in a transaction of the caller's is remembered as
                # finished only by the key: that transaction may roll back.
                self.outer = conn.info.transaction_status != pq.TransactionStatus.IDLE
                stack.enter_context(conn.transaction())
                # The key must still be this claim's before the step's work:
                # a worker paused past its lease, whose key another took
                # over and finished, would run again a step that one finished.
                recorded = conn.execute(_sql.STEP_BEGIN, self.holder.owner(self.step)).fetchone()[0]
                if self.holder.begun(self.step, self.outer, recorded):
                    return self.step
                self.stack = stack.pop_all()
            self.step.conn = conn
        return self.step

    def __exit__(self, exc_type, exc, tb):
        if self.stack is None:
            return False
        if exc_type is not None:        # the block failed: rolled back, nothing recorded
            self.stack.__exit__(exc_type, exc, tb)
            return False
        try:
            with self.stack:      # commits (an error in the record rolls back) and gives the connection back
                n = self.step.conn.execute(_sql.STEP, self.holder.params(self.step)).fetchone()[0]
        except psycopg.errors.StringDataRightTruncation as exc:    # 22001: over idempotency.max_step_bytes
            raise self.holder.unstorable(f"the step's result cannot be stored: {exc}") from exc
        except psycopg.errors.ProgramLimitExceeded as exc:         # 54000: idempotency.max_steps reached
            raise self.holder.unstorable(f"the step cannot be recorded: {exc}") from exc
        if not self.outer:
            self.holder.recorded(self.step, n)
        return False


class AsyncStep:
    """``async with holder's step(name) as s``, asynchronously."""

    def __init__(self, holder, name):
        self.holder, self.step = holder, holder.begin(name)
        self.stack = None
        self.outer = False

    async def __aenter__(self):
        if not self.step.done:      # as SyncStep's
            async with contextlib.AsyncExitStack() as stack:
                conn = await stack.enter_async_context(self.holder.connection())
                self.outer = conn.info.transaction_status != pq.TransactionStatus.IDLE
                await stack.enter_async_context(conn.transaction())
                cur = await conn.execute(_sql.STEP_BEGIN, self.holder.owner(self.step))
                if self.holder.begun(self.step, self.outer, (await cur.fetchone())[0]):
                    return self.step
                self.stack = stack.pop_all()
            self.step.conn = conn
        return self.step

    async def __aexit__(self, exc_type, exc, tb):
        if self.stack is None:
            return False
        if exc_type is not None:
            await self.stack.__aexit__(exc_type, exc, tb)
            return False
        try:
            async with self.stack:
                row = await (await self.step.conn.execute(_sql.STEP, self.holder.params(self.step))).fetchone()
        except psycopg.errors.StringDataRightTruncation as exc:    # 22001: over idempotency.max_step_bytes
            raise self.holder.unstorable(f"the step's result cannot be stored: {exc}") from exc
        except psycopg.errors.ProgramLimitExceeded as exc:         # 54000: idempotency.max_steps reached
            raise self.holder.unstorable(f"the step cannot be recorded: {exc}") from exc
        if not self.outer:
            self.holder.recorded(self.step, row[0])
        return False


def run_step(holder, name, fn):
    """``fn(step)`` as the step ``name`` unless it finished; its result."""
    with SyncStep(holder, name) as step:
        if not step.done:
            step.result = fn(step)
    return step.result


async def arun_step(holder, name, fn):
    """``await fn(step)`` as the step ``name`` unless it finished; its result."""
    async with AsyncStep(holder, name) as step:
        if not step.done:
            step.result = await fn(step)
    return step.result
