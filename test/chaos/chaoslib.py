"""What the chaos test's processes share: connecting (and reconnecting) to
PostgreSQL, the fence that makes metrics snapshots exact, and logs that
survive SIGKILL."""

import ctypes
import json
import os
import signal
import time

import psycopg2

# The fence. idem_metrics lives in shared memory, which a restart resets, so
# the injector snapshots it just before each restart, and the snapshot must
# miss nothing that the restart then loses. Every pipeline transaction takes
# this advisory lock in shared mode before its first extension call (the
# complete transaction after its ledger INSERT, so that a restart can cut it
# with the row written) and keeps it to its end; the injector pauses the
# background sweep, takes the lock exclusively, snapshots, and restarts.
# Holding it exclusively means no pipeline transaction is between an
# extension call and its end: answers already given and state changes
# already committed are in the snapshot, and nothing is counted after it.
# Pipeline transactions that wait for it are cut by the restart.
FENCE_KEY = 7445001
FENCE_SQL = "SELECT pg_catalog.pg_advisory_xact_lock_shared(%d)" % FENCE_KEY

# What a lost or refused connection raises (restart, crash recovery, ...).
CONNECTION_ERRORS = (psycopg2.OperationalError, psycopg2.InterfaceError)

# The job fault plan: what a worker does to itself on a job's first delivery
# (or first claim of its key). Chosen per job by the producer's seeded RNG and
# carried in the job's payload.
KILL_STEPS = ("kill_before_claim", "kill_after_effect", "kill_after_complete")
STALLS = ("stall_late", "stall_fenced")
FAULTS = KILL_STEPS + STALLS

# The 3-step job (step_worker.py): its steps in order, in a scope and a topic
# of their own, and its faults, on the first claim of its key: SIGKILL inside
# a step (its effect done, its record not committed) or after a step was
# recorded (before the next step, or the complete).
STEP_SCOPE = "steps"
STEP_TOPIC = "steps"
STEPS = ("reserve", "charge", "email")
STEP_FAULTS = tuple(f"kill_{where}_{step}" for step in STEPS for where in ("in", "after"))


def connection_lost(error, conn):
    """True when error means the connection is gone. After an immediate
    shutdown psycopg2 raises a plain DatabaseError without SQLSTATE ("server
    closed the connection unexpectedly") and leaves conn.closed at 0, so
    that case is recognised by its shape; errors the server reports always
    carry a SQLSTATE."""
    if isinstance(error, CONNECTION_ERRORS) or (conn is not None and conn.closed != 0):
        return True
    code = getattr(error, "pgcode", None)
    if code is None:
        return type(error) is psycopg2.DatabaseError
    return code.startswith("08") or code.startswith("57P")


class Lost(Exception):
    """The database connection is gone; the current work is abandoned."""


class Process:
    """What a worker process of the run keeps: its arguments, name, JSON
    log and one database connection, made again after a loss with
    `connect(dsn, application_name, stop=...)` (the psycopg2 one above, or
    the client's in client_connection.py)."""

    def __init__(self, args, connect):
        self.args = args
        self.name = args.name
        self.log = JsonLog(args.log)
        self.conn = None
        self.stopping = False
        self._connect = connect

    def db(self):
        if self.conn is None or self.conn.closed:
            self.conn = self._connect(self.args.dsn, f"chaos-{self.name}", stop=lambda: self.stopping)
            if self.conn is None:
                raise Lost("stopping")
        return self.conn

    def drop(self):
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:
                pass
        self.conn = None


class JsonLog:
    """Appends one JSON object per line with a single write(2) on an O_APPEND
    descriptor: a line written before a SIGKILL is in the file."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def __call__(self, ev, **fields):
        fields["ev"] = ev
        fields["t"] = round(time.time(), 4)
        os.write(self.fd, (json.dumps(fields, separators=(",", ":")) + "\n").encode())


def read_jsonl(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass  # a line cut by a kill (cannot happen with one write, but be safe)
    except FileNotFoundError:
        pass
    return out


def connect(dsn, application_name, stop=lambda: False, deadline=None):
    """Connects, retrying with backoff while the server is away (restarting,
    in recovery). Returns None if stop() becomes true or the deadline passes."""
    delay = 0.05
    while not stop():
        try:
            conn = psycopg2.connect(dsn, application_name=application_name, connect_timeout=3)
            return conn
        except psycopg2.OperationalError:
            if deadline is not None and time.monotonic() > deadline:
                return None
            time.sleep(delay)
            delay = min(delay * 2, 0.5)
    return None


def die_with_parent():
    """Called in a child before exec: it gets SIGKILL when the test's driver
    dies, so that nothing outlives the run."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def interval(seconds):
    return "%.3f seconds" % seconds
