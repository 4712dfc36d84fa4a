"""The errors a caller raises or catches, and how a job's error is classified."""

import logging
import math

log = logging.getLogger("pg_idempotency")

# The longest retry_in the extension takes: 36,000 days.
MAX_RETRY_IN = 36000 * 86400


def retry_in_or_none(value):
    """A retry_in the extension takes (seconds from 0 to 36,000 days), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) and 0 <= value <= MAX_RETRY_IN else None


class FinalError(Exception):
    """Raise it in a job to fail the key for good (no retry)."""

    retryable = False


class UnstorableResult(FinalError):
    """A result that cannot be stored: not JSON, a string with a NUL
    character, or larger than the server stores. Run again, the work would
    come to the same end: the key fails for good."""


class RetryableError(Exception):
    """Raise it in a job to fail the key and ask for a retry after
    ``retry_in`` seconds (instead of the extension's backoff). A retry_in
    the extension would refuse is refused here, where its caller is."""

    retryable = True

    def __init__(self, message="", retry_in=None):
        if retry_in is not None and retry_in_or_none(retry_in) is None:
            raise ValueError(f"retry_in must be a number of seconds from 0 to {MAX_RETRY_IN} (36,000 days), "
                             f"not {retry_in!r}")
        super().__init__(message)
        self.retry_in = retry_in


# The longest error message stored (UTF-8 bytes): the server refuses one
# over idempotency.max_value_bytes (1 MB by default) with 22001.
MAX_ERROR_BYTES = 8192


def error_text(exc):
    """An exception's message as the extension stores it, rather than fail
    the record and leave the key held: text cannot hold NUL (it becomes
    U+FFFD) or lone surrogates, and a message over MAX_ERROR_BYTES is cut
    there (at a character's end) and says so."""
    text = (str(exc) or type(exc).__name__).replace("\x00", "\ufffd")
    data = text.encode("utf-8", "replace")
    if len(data) <= MAX_ERROR_BYTES:
        return data.decode("utf-8")
    note = f" [cut from {len(data)} bytes]"
    return data[:MAX_ERROR_BYTES - len(note)].decode("utf-8", "ignore") + note


def is_stale_token(exc):
    """IK001: the token is stale; the key (or lock) was taken over."""
    return getattr(exc, "sqlstate", None) == "IK001"


def default_classify(exc):
    """'final' for errors that say so (``retryable = False``), else 'retryable'."""
    return "final" if getattr(exc, "retryable", True) is False else "retryable"


def classify_or(classify, fallback, subject):
    """classify(subject), or fallback(subject) when classify raises (logged):
    the key or event must still be recorded, or it would stay held and its
    work run again once the lease ended."""
    try:
        return classify(subject)
    except Exception:
        log.exception("pg_idempotency: classify raised; the default classification applies")
        return fallback(subject)


class NotClaimed(Exception):
    """Raised by ``with claim(...)`` / ``async with aclaim(...)`` when the key
    is not granted: the block does not run. ``job`` is the claim's answer
    (``outcome``, ``result``, ``replayed``, ``retry_after``...)."""

    def __init__(self, job):
        super().__init__(f"{job.scope}/{job.key}: {job.outcome}")
        self.job = job
