"""pg_idempotency: the idempotency PostgreSQL extension from Python
(psycopg 3). The worker pattern (``claim``, ``aclaim``, ``idempotent``),
the outbox (``enqueue``, ``aenqueue``, ``Consumer``), and ASGI middleware
for the Idempotency-Key header (``pg_idempotency.asgi``)."""

from .aclaim import AsyncJob, aclaim
from .claim import Job, claim, idempotent
from .errors import FinalError, RetryableError, default_classify, is_stale_token
from .outbox import Consumer, aenqueue, enqueue, settlement

__all__ = ["AsyncJob", "Consumer", "FinalError", "Job", "RetryableError", "aclaim", "aenqueue", "claim",
           "default_classify", "enqueue", "idempotent", "is_stale_token", "settlement"]
__version__ = "0.1.0"
