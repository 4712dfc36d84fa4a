"""The errors a caller raises or catches, and how a job's error is classified."""


class FinalError(Exception):
    """Raise it in a job to fail the key for good (no retry)."""

    retryable = False


class RetryableError(Exception):
    """Raise it in a job to fail the key and ask for a retry after
    ``retry_in`` seconds (instead of the extension's backoff)."""

    retryable = True

    def __init__(self, message="", retry_in=None):
        super().__init__(message)
        self.retry_in = retry_in


def is_stale_token(exc):
    """IK001: the token is stale; the key (or lock) was taken over."""
    return getattr(exc, "sqlstate", None) == "IK001"


def default_classify(exc):
    """'final' for errors that say so (``retryable = False``), else 'retryable'."""
    return "final" if getattr(exc, "retryable", True) is False else "retryable"


class NotClaimed(Exception):
    """Raised by ``with claim(...)`` / ``async with aclaim(...)`` when the key
    is not granted: the block does not run. ``job`` is the claim's answer
    (``outcome``, ``result``, ``replayed``, ``retry_after``...)."""

    def __init__(self, job):
        super().__init__(f"{job.scope}/{job.key}: {job.outcome}")
        self.job = job
