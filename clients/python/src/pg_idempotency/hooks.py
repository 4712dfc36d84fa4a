"""Hooks: callbacks for logging what a caller does not see as an error.

    on_replay(info)    a duplicate answered from stored work (completed, or failed for good)
    on_conflict(info)  a duplicate answered 'in progress' or 'retry later' (HTTP 409)
    on_fenced(info)    a worker whose lease was taken over: its writes rolled back

``info`` is a dict: ``key``, ``scope``, ``outcome``, ``retry_after``,
``token``, ``attempt``, ``error``; the middleware adds ``method``, ``path``
and ``status`` (the HTTP status sent). A hook that raises is logged (logger
``pg_idempotency``) and does not change the answer.
"""

import logging

from ._options import function

log = logging.getLogger("pg_idempotency")


class Hooks:
    def __init__(self, on_replay=None, on_conflict=None, on_fenced=None):
        self.on_replay = function("on_replay", on_replay)
        self.on_conflict = function("on_conflict", on_conflict)
        self.on_fenced = function("on_fenced", on_fenced)

    @staticmethod
    def info(job, **extra):
        return {"key": job.key, "scope": job.scope, "outcome": job.outcome, "retry_after": job.retry_after,
                "token": job.token, "attempt": job.attempt, "error": job.error, **extra}

    def _call(self, hook, info):
        if hook is None:
            return
        try:
            hook(info)
        except Exception:
            log.exception("pg_idempotency hook %r failed", hook)

    def answered(self, job, **extra):
        """The hook for a claim's answer that is not 'claimed'."""
        if job.outcome in ("completed", "failed") and job.replayed:
            self._call(self.on_replay, self.info(job, **extra))
        elif job.outcome in ("in_progress", "retry_later"):
            self._call(self.on_conflict, self.info(job, **extra))

    def fenced(self, job, **extra):
        self._call(self.on_fenced, self.info(job, **extra))
