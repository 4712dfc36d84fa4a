"""What sync and async claims share: the state of a claimed key, read from
the extension's answers, and how a job's error becomes a failure."""

import time

from psycopg.rows import dict_row

from . import _sql
from ._steps import parse_steps, step_key
from .errors import UnstorableResult, classify_or, default_classify, error_text, is_stale_token, retry_in_or_none


def result_param(result):
    """The jsonb parameter of a result to store, or UnstorableResult (not
    JSON, NaN, a NUL character, a lone surrogate)."""
    try:
        return _sql.jsonb_now(result)
    except (TypeError, ValueError) as exc:      # json.dumps: a datetime, a cycle
        raise UnstorableResult(f"the result cannot be stored as JSON: {exc}") from exc


def refused_result(exc):
    """The UnstorableResult of a complete that the server refused for its
    result (a data exception, 22xxx: larger than idempotency.max_value_bytes,
    or not in the database's encoding): run again, the work would come to
    the same end."""
    return UnstorableResult(f"the result cannot be stored: {exc}")


class JobState:
    """The key, what the claim answered and, after the block, how it ended.

    ``outcome``: the claim's answer ('claimed', 'completed', 'in_progress',
    'retry_later', 'failed', 'mismatch'); after a claimed block, how it
    ended: 'completed', 'failed', 'fenced' or 'released'.
    """

    def __init__(self, key, request, scope, lease, classify):
        self.key = key
        self.request = request
        self.scope = scope
        self.lease = lease
        self.classify = classify or default_classify
        self.outcome = None
        self.claimed = False
        self.token = None
        self.attempt = None
        self.result = None
        self.error = None
        self.retryable = None
        self.retry_after = None     # seconds until the key may be claimed again
        self.replayed = False       # the answer of earlier work, not of this block
        # A duplicate answered from the key's tombstone (extension 0.7.0): the
        # work finished so long ago that its result (or error) is gone.
        self.result_expired = False
        self.exception = None       # what the block raised
        self.finished = None        # 'completed' or 'released' once recorded
        # Multi-step work: the steps finished so far, by name, in their order
        # (an earlier attempt's, which the claim resumes after, then this job's).
        self.steps = {}
        self.resumed = False
        # When the lease ends at the latest (time.monotonic()), as the claim
        # or the last heartbeat set it: a record keeps trying until then.
        self.lease_ends = 0.0
        # The outcome is being recorded (the heartbeat still runs): a beat
        # that finds the key taken or finished then says nothing, the record
        # does.
        self.recording = False

    def __repr__(self):
        return f"<Job {self.scope}/{self.key} {self.outcome}>"

    def step_key(self, name):
        """The key of a step's external call (the same as idem_step_key)."""
        return step_key(self.scope, self.key, name)

    def params(self, **extra):
        return {"key": self.key, "scope": self.scope, "token": self.token, "lease": self.lease, **extra}

    def claim_params(self, wait):
        return self.params(request=_sql.jsonb(self.request), wait=wait or None)

    def answered(self, row):
        """Takes in the claim's answer."""
        self.outcome = row["outcome"]
        self.claimed = self.outcome == "claimed"
        if self.claimed:
            self.lease_ends = time.monotonic() + self.lease
        self.token = row["token"]
        self.attempt = row["attempt"]
        self.result_expired = bool(row.get("result_expired"))
        self.steps = parse_steps(row.get("steps"))
        self.resumed = bool(self.steps)
        if self.outcome == "completed":
            self.result, self.replayed = row["result"], True
        elif self.outcome == "failed":
            self.error, self.retryable, self.replayed = row["error"], False, True
        elif self.outcome in ("in_progress", "retry_later"):
            self.retry_after = row["retry_after"] or 0.0

    def renewed(self, started):
        """A heartbeat sent at ``started`` (time.monotonic()) renewed the lease."""
        self.lease_ends = max(self.lease_ends, started + self.lease)

    def failure(self, exc):
        """The idem_fail parameters for an error raised by the block."""
        # A result (a step's) that cannot be stored would be so again.
        final = isinstance(exc, UnstorableResult) or classify_or(self.classify, default_classify, exc) == "final"
        # An error's retry_in the extension would refuse: its backoff instead.
        retry_in = None if final else retry_in_or_none(getattr(exc, "retry_in", None))
        return self.params(error=error_text(exc), retryable=not final, retry_in=retry_in)

    def failed(self, status, retry_after, exc):
        self.outcome = "failed"
        self.exception = exc
        self.error = error_text(exc)
        self.retryable = status == "FAILED_RETRYABLE"
        self.retry_after = max(0.0, retry_after or 0.0) if self.retryable else None

    def completed(self, result):
        self.outcome = self.finished = "completed"
        self.result = result

    def fenced(self, exc):
        self.outcome = "fenced"
        self.exception = exc
        self.error = str(exc)


def exit_action(job, exc, in_transaction):
    """What leaving a claim's block records: None, 'complete', 'fail' or
    'fence'. Nothing is recorded for a key that was not claimed, was already
    recorded, or whose claim the caller's rollback (or the lease's end, for
    a BaseException such as KeyboardInterrupt) undoes."""
    if not job.claimed or job.outcome == "fenced":
        return None
    if exc is None:
        return "complete" if job.finished is None else None
    if in_transaction or not isinstance(exc, Exception) or job.finished is not None:
        return None
    return "fence" if is_stale_token(exc) else "fail"


def dict_cursor(conn):
    return conn.cursor(row_factory=dict_row)
