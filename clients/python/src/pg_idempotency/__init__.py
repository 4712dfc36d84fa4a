"""pg_idempotency: the idempotency PostgreSQL extension from Python
(psycopg 3). The worker pattern (``claim``, ``aclaim``, ``run_once``,
``arun_once``, ``idempotent``), the outbox (``enqueue``, ``aenqueue``,
``Consumer``, ``AsyncConsumer``), the SQL edition's sweeps on an
interval (``start_maintenance``, ``astart_maintenance``), and middleware
for the Idempotency-Key header: ``pg_idempotency.asgi`` (FastAPI,
Starlette), ``pg_idempotency.wsgi`` with ``pg_idempotency.flask``, and
``pg_idempotency.django``."""

from .aclaim import AsyncJob, aclaim, arun_once
from .claim import Job, claim, idempotent, run_once
from .errors import FinalError, NotClaimed, RetryableError, UnstorableResult, default_classify, is_stale_token
from ._steps import Step, step_key
from .maintenance import AsyncMaintenance, Maintenance, astart_maintenance, start_maintenance
from .outbox import AsyncConsumer, Consumer, aenqueue, enqueue, settlement

__all__ = ["AsyncConsumer", "AsyncJob", "AsyncMaintenance", "Consumer", "FinalError", "Job", "Maintenance",
           "NotClaimed", "RetryableError", "UnstorableResult", "aclaim", "aenqueue", "arun_once", "astart_maintenance", "claim",
           "default_classify", "enqueue", "idempotent", "is_stale_token", "run_once", "settlement", "start_maintenance", "Step", "step_key"]
__version__ = "0.2.0"
