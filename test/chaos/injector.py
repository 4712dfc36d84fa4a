"""The fault injector of the chaos test, and the supervisor of its processes.

Fleet:     starts the producer and worker processes (real processes, each
           `python3 producer.py|worker.py|step_worker.py`) and restarts any
           worker that died, as a process manager would.
Injector:  SIGKILLs random live workers from outside; restarts PostgreSQL with
           `pg_ctl -m immediate restart` (after snapshotting idem_metrics
           behind the fence, since the restart resets shared memory); and
           watches that no sweep leaves an ended lease behind (see watch).
The per-job faults (a worker killing itself at a step, stalls) are planned by
the producers and carried out by the workers themselves: see worker.py and
step_worker.py.
"""

import os
import random
import signal
import subprocess
import sys
import time

import psycopg2

from chaoslib import FENCE_KEY, connect, die_with_parent

HERE = os.path.dirname(os.path.abspath(__file__))

METRIC_COLUMNS = (
    "claims", "replays", "in_progress", "mismatches", "completions", "failures_retryable",
    "failures_final", "lease_expirations", "late_completions", "stale_tokens",
    "inbox_duplicates", "outbox_enqueued", "outbox_deduplicated", "outbox_delivered",
    "outbox_retried", "outbox_dead", "locks_acquired", "locks_contended", "processing_count",
    "processing_ms_sum", "resumed_takeovers")


def read_metrics(cur):
    cur.execute("SELECT %s, processing_ms_buckets, extract(epoch FROM stats_reset)::float8"
                " FROM idempotency.idem_metrics" % ", ".join(METRIC_COLUMNS))
    row = cur.fetchone()
    snap = dict(zip(METRIC_COLUMNS, row[:len(METRIC_COLUMNS)]))
    snap["processing_ms_buckets"] = list(row[len(METRIC_COLUMNS)])
    snap["stats_reset"] = row[len(METRIC_COLUMNS) + 1]
    return snap


def add_metrics(total, snap):
    for column in METRIC_COLUMNS:
        total[column] = total.get(column, 0) + snap[column]
    buckets = total.get("processing_ms_buckets") or [0] * len(snap["processing_ms_buckets"])
    total["processing_ms_buckets"] = [a + b for a, b in zip(buckets, snap["processing_ms_buckets"])]
    return total


class Fleet:
    def __init__(self, cfg, logdir):
        self.cfg, self.logdir = cfg, logdir
        self.workers = {}       # name (worker-N, steps-N) -> Popen
        self.worker_starts = {}  # name -> monotonic start
        self.producers = []
        self.crashes = []       # (what, exit status, stderr tail)
        self.restarted = 0
        self.exits = {"killed": 0, "clean": 0}

    def spawn(self, script, args, name):
        err = open(os.path.join(self.logdir, name + ".err"), "ab")
        return subprocess.Popen([sys.executable, os.path.join(HERE, script)] + args,
                                stdout=subprocess.DEVNULL, stderr=err, cwd=self.logdir,
                                preexec_fn=die_with_parent)

    def start_producers(self, count, seconds):
        c = self.cfg
        for i in range(count):
            self.producers.append(self.spawn("producer.py", [
                "--dsn", c.app_dsn, "--index", str(i), "--seed", str(c.seed),
                "--seconds", str(seconds), "--rate", str(c.producer_rate),
                "--fault-weights", c.fault_weights, "--step-rate", str(c.step_rate),
                "--log", os.path.join(self.logdir, f"producer-{i}.jsonl")], f"producer-{i}"))

    def worker_names(self):
        """Every worker's name, which names its log too."""
        return ([f"worker-{slot}" for slot in range(self.cfg.workers)]
                + [f"steps-{slot}" for slot in range(self.cfg.step_workers)])

    def start_worker(self, name):
        c = self.cfg
        common = ["--dsn", c.app_dsn, "--name", name, "--api", c.api,
                  "--outbox-lease", str(c.outbox_lease), "--key-lease", str(c.key_lease),
                  "--http-timeout", str(c.http_timeout),
                  "--log", os.path.join(self.logdir, f"{name}.jsonl")]
        if name.startswith("steps-"):
            self.workers[name] = self.spawn("step_worker.py", common + [
                "--mail-api", c.mail_api, "--batch", str(c.step_batch)], name)
        else:
            self.workers[name] = self.spawn("worker.py", common + ["--batch", str(c.batch)], name)
        self.worker_starts[name] = time.monotonic()

    def start_workers(self):
        for name in self.worker_names():
            self.start_worker(name)

    def tail(self, name):
        try:
            with open(os.path.join(self.logdir, name + ".err"), "rb") as f:
                return f.read()[-1500:].decode(errors="replace")
        except OSError:
            return ""

    def supervise(self):
        """Restarts dead workers; records how each one ended."""
        for name, proc in list(self.workers.items()):
            status = proc.poll()
            if status is None:
                continue
            if status == -signal.SIGKILL:
                self.exits["killed"] += 1
            else:
                self.crashes.append((name, status, self.tail(name)))
            self.start_worker(name)
            self.restarted += 1

    def producers_done(self):
        return all(p.poll() is not None for p in self.producers)

    def check_producers(self):
        for i, p in enumerate(self.producers):
            if p.poll() not in (0, None):
                self.crashes.append((f"producer-{i}", p.returncode, self.tail(f"producer-{i}")))

    def live_workers(self, min_age):
        now = time.monotonic()
        return [(name, p) for name, p in self.workers.items()
                if p.poll() is None and now - self.worker_starts[name] >= min_age]

    def stop_all(self, grace=5.0):
        procs = list(self.workers.values()) + self.producers
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        end = time.monotonic() + grace
        for p in procs:
            try:
                p.wait(max(0.05, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class Injector:
    def __init__(self, cfg, fleet):
        self.cfg, self.fleet = cfg, fleet
        self.rng = random.Random(cfg.seed * 31 + 7)
        self.external_kills = 0
        self.restarts = []          # per restart: dict of timings
        self.epochs = []            # idem_metrics snapshots taken just before each restart
        self.violations = []
        self.admin_conn = None
        self.watch_samples = 0
        self.watch_max_overdue = 0.0
        self.watch_bad = []         # (key, token) left behind by two sweeps
        self.unsettled = set()      # completed keys no sweep had settled at the last sample
        self.sweep_runs_proven = 0  # samples before which a sweep's run committed
        self.overdue_since = {}     # key -> ((token, lease_until), runs proven when first seen)
        self.probes = 0             # the watchdog's own keys (see probe)
        self.next_kill = time.monotonic() + self.rng.uniform(*cfg.kill_every)

    # ------------------------------------------------------------ admin connection
    def admin(self):
        if self.admin_conn is None or self.admin_conn.closed:
            self.admin_conn = connect(self.cfg.admin_dsn, "chaos-injector",
                                      deadline=time.monotonic() + 60)
            if self.admin_conn is None:
                raise RuntimeError("cannot connect to PostgreSQL")
            self.admin_conn.autocommit = True
        return self.admin_conn

    def query(self, sql, args=None):
        for _ in range(3):
            try:
                with self.admin().cursor() as cur:
                    cur.execute(sql, args)
                    return cur.fetchall() if cur.description else None
            except (psycopg2.OperationalError, psycopg2.InterfaceError):
                self.admin_conn = None
                time.sleep(0.3)
        raise RuntimeError(f"query failed three times: {sql}")

    def metrics(self):
        for _ in range(3):
            try:
                with self.admin().cursor() as cur:
                    return read_metrics(cur)
            except (psycopg2.OperationalError, psycopg2.InterfaceError):
                self.admin_conn = None
                time.sleep(0.3)
        raise RuntimeError("cannot read idem_metrics")

    # ------------------------------------------------------------ external SIGKILLs
    def maybe_kill(self):
        now = time.monotonic()
        if now < self.next_kill:
            return
        self.next_kill = now + self.rng.uniform(*self.cfg.kill_every)
        live = self.fleet.live_workers(min_age=0.5)
        if not live:
            return
        _, proc = self.rng.choice(live)
        try:
            os.kill(proc.pid, signal.SIGKILL)
            self.external_kills += 1
        except ProcessLookupError:
            pass

    # ------------------------------------------------------------ PostgreSQL restart
    def sweeps_running(self):
        return self.query("SELECT count(*) FROM pg_catalog.pg_stat_activity"
                          " WHERE backend_type = 'idempotency worker'")[0][0]

    def restart_postgres(self):
        """pg_ctl -m immediate restart, with the metrics snapshot made exact:
        1. pause the background sweep (idempotency.worker_enabled = off) and
           wait until no sweep runs: a sweep's counts (lease expirations,
           outbox retries) could otherwise commit after the snapshot and be
           lost with shared memory;
        2. take the fence exclusively: it waits for every pipeline transaction
           that made an extension call to end, and holds back new ones;
        3. snapshot idem_metrics, and hold the fence a moment so that
           pipeline transactions queue behind it (some have already written
           their ledger row); 4. restart immediately: those transactions are
           cut, workers and producers reconnect;
        5. resume the sweep; check that the counters did start again."""
        record = {"at": round(time.monotonic() - self.cfg.t0, 1)}
        started = time.time()
        self.query("ALTER SYSTEM SET idempotency.worker_enabled = off")
        self.query("SELECT pg_catalog.pg_reload_conf()")
        time.sleep(2 * self.cfg.naptime)
        quiet, deadline = 0, time.monotonic() + 10
        while quiet < 3 and time.monotonic() < deadline:
            quiet = quiet + 1 if self.sweeps_running() == 0 else 0
            time.sleep(0.05)
        t = time.monotonic()
        self.query("SET lock_timeout = '30s'")
        self.query("SELECT pg_catalog.pg_advisory_lock(%s)", (FENCE_KEY,))
        record["fence_wait_ms"] = round((time.monotonic() - t) * 1000)
        with self.admin().cursor() as cur:
            snapshot = read_metrics(cur)
            # Let pipeline transactions pile up behind the fence (some with
            # their ledger row written), so that the restart cuts them.
            time.sleep(self.cfg.fence_hold)
            cur.execute("SELECT count(*) FROM pg_catalog.pg_locks WHERE locktype = 'advisory'"
                        " AND NOT granted AND objid = %s", (FENCE_KEY,))
            record["cut"] = cur.fetchone()[0]
        t = time.monotonic()
        c = self.cfg
        result = subprocess.run(
            ["runuser", "-u", c.os_user, "--", os.path.join(c.bindir, "pg_ctl"), "-D", c.datadir,
             "-l", c.server_log, "-m", "immediate", "-w", "-t", "120", "restart"],
            cwd=os.path.dirname(c.datadir), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.admin_conn = None
        if result.returncode != 0:
            raise RuntimeError("pg_ctl restart failed: " + result.stderr.decode(errors="replace"))
        record["down_s"] = round(time.monotonic() - t, 2)
        self.epochs.append(snapshot)
        self.query("ALTER SYSTEM RESET idempotency.worker_enabled")
        self.query("SELECT pg_catalog.pg_reload_conf()")
        after = self.metrics()
        if after["stats_reset"] is None or after["stats_reset"] <= started:
            self.violations.append("idem_metrics was not reset by the restart "
                                   f"(stats_reset {after['stats_reset']}): the epochs would overlap")
        self.restarts.append(record)

    # ------------------------------------------------------------ the lease watchdog
    # One snapshot: the keys PROCESSING past their lease (with the server's
    # clock, read after the snapshot was taken), and the completed keys that
    # no sweep has settled yet (only a sweep clears their active_since).
    WATCH_SQL = (
        "SELECT key, token, extract(epoch FROM lease_until)::float8,"
        "       extract(epoch FROM pg_catalog.clock_timestamp())::float8"
        "  FROM idempotency.idempotency_keys"
        " WHERE status = 'PROCESSING' AND lease_until < pg_catalog.clock_timestamp()"
        " UNION ALL "
        "SELECT key, NULL, NULL, NULL FROM idempotency.idempotency_keys"
        " WHERE status = 'COMPLETED' AND active_since IS NOT NULL")
    # A key of the watchdog's own (scope watchdog), claimed and completed at
    # each sample: every sample leaves a finished key for the next sweep to
    # settle, so that sweep runs can be seen when the pipeline is quiet too.
    # chaos.py takes their claims and completions out of the metrics.
    PROBE_SQL = (
        "DO $$ DECLARE t int8; BEGIN"
        " SELECT token INTO t FROM idempotency.idem_claim('{key}', scope => 'watchdog');"
        " PERFORM idempotency.idem_complete('{key}', t, scope => 'watchdog');"
        " END $$")

    def probe(self):
        self.probes += 1
        try:
            self.query(self.PROBE_SQL.format(key=f"probe-{self.probes}"))
        except RuntimeError:
            pass

    def probes_completed(self):
        return self.query("SELECT count(*) FROM idempotency.idempotency_keys"
                          " WHERE scope = 'watchdog' AND status = 'COMPLETED'")[0][0]

    def watch(self):
        """Proves, from the order of events alone, that no sweep leaves an
        ended lease behind; how soon sweeps come is kept as a figure (max
        overdue), since it depends on the machine's load.

        A sweep's lease tasks run one after the other in each run: expire the
        ended leases (skipping rows another transaction holds), then settle
        the finished keys. Runs never overlap in a database. So a completed
        key unsettled at one sample and settled at the next proves that a run
        committed in between; of three runs proven after a sample that saw a
        key past its lease, the second and third began after that sample and
        saw the key's lease ended. A key still PROCESSING with the same token
        and lease after them was left behind twice: a violation (one skip
        could be a row held for a moment by a claim or a late complete)."""
        self.probe()
        try:
            rows = self.query(self.WATCH_SQL)
        except RuntimeError:
            return
        self.watch_samples += 1
        overdue, unsettled = {}, set()
        for key, token, lease_until, clock in rows:
            if token is None:
                unsettled.add(key)
            else:
                overdue[key] = (token, lease_until)
                self.watch_max_overdue = max(self.watch_max_overdue, clock - lease_until)
        if self.unsettled - unsettled:
            self.sweep_runs_proven += 1
        self.unsettled = unsettled
        for key, generation in overdue.items():
            first = self.overdue_since.get(key)
            if first is None or first[0] != generation:
                self.overdue_since[key] = (generation, self.sweep_runs_proven)
            elif (self.sweep_runs_proven - first[1] >= 3
                  and key not in {k for k, _ in self.watch_bad}):
                self.watch_bad.append((key, generation[0]))
        self.overdue_since = {k: v for k, v in self.overdue_since.items() if k in overdue}
