#!/usr/bin/python3
"""The chaos test of the idempotency extension: an at-least-once pipeline of
real processes under faults, and the proof that it happened once in effect.

  producers (producer.py)  register a key and enqueue its job in one
                           transaction; duplicate, racing and rolled-back
                           submissions; a share of the jobs have 3 steps
  workers (worker.py)      outbox_claim on topic 'jobs'; idem_claim; charge
                           the mock payment API (mock_api.py) with the job key
                           as Idempotency-Key; INSERT a ledger row and
                           idem_complete in one transaction; outbox_ack
  step workers             the 3-step jobs of topic 'steps', with the Python
    (step_worker.py)       client's job.step: reserve (a row in this database,
                           in the step's transaction), charge through the
                           payment API and email through the mail API (a
                           second mock_api.py), each call with the step's key
                           (idem_step_key) as Idempotency-Key; a claim that
                           resumes a key skips its finished steps
  injector (injector.py)   external SIGKILLs of workers, worker restarts,
                           pg_ctl -m immediate restart, a lease watchdog;
                           per-job faults are planned by the producers' seeded
                           RNG and carried out by the workers: SIGKILL before
                           the claim, after the side effect and before the
                           complete, after the complete and before the ack;
                           inside each step (after its effect, before its
                           record) and after each step's record; stalls past
                           the lease; the mock APIs time out after taking
                           effect, or fail with 503
  proof (checks.py)        once the queue is drained: exactly-once effects in
                           the ledger, the reservations and at both APIs,
                           delivery, states, every takeover resumed after its
                           last recorded step, metrics against what the
                           injector did

Runs against a cluster that run.sh started (library preloaded), a database
that exists and the two mock APIs. Prints each check (ok/FAIL), a summary
table and a closing note with the count of resumed takeovers; exits 1 on
any violation.
"""

import argparse
import os
import sys
import time
import types

import psycopg2

from chaoslib import FAULTS
from checks import gather, print_summary, prove
from injector import Fleet, Injector, add_metrics

SETUP_SQL = """
CREATE EXTENSION IF NOT EXISTS idempotency;
DO $$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'chaos_app') THEN
    CREATE ROLE chaos_app LOGIN;
  END IF;
END $$;
-- Producers register keys and enqueue jobs; workers consume the outbox.
SELECT idempotency.grant_application('chaos_app');
SELECT idempotency.grant_relay('chaos_app');
-- The business effect. No unique constraint on job_key: only the extension
-- stands between a duplicate delivery and a second row.
CREATE TABLE ledger (
    id           bigserial PRIMARY KEY,
    job_key      text NOT NULL,
    amount_cents integer NOT NULL,
    charge_id    text NOT NULL,
    worker       text NOT NULL,
    token        bigint NOT NULL,
    written_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);
GRANT SELECT, INSERT ON ledger TO chaos_app;
GRANT USAGE ON SEQUENCE ledger_id_seq TO chaos_app;
-- The first step of a 3-step job, written in the step's transaction; no
-- unique constraint either.
CREATE TABLE reservations (
    id           bigserial PRIMARY KEY,
    job_key      text NOT NULL,
    amount_cents integer NOT NULL,
    worker       text NOT NULL,
    token        bigint NOT NULL,
    reserved_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);
GRANT SELECT, INSERT ON reservations TO chaos_app;
GRANT USAGE ON SEQUENCE reservations_id_seq TO chaos_app;
SELECT idempotency.idem_metrics_reset();
"""


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", required=True, help="the cluster's socket directory")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--dbname", default="chaos")
    p.add_argument("--datadir", required=True)
    p.add_argument("--server-log", required=True)
    p.add_argument("--bindir", required=True)
    p.add_argument("--os-user", default="postgres")
    p.add_argument("--api", required=True, help="the mock payment API, http://127.0.0.1:PORT")
    p.add_argument("--mail-api", required=True, help="the mock mail API, http://127.0.0.1:PORT")
    p.add_argument("--logdir", required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--seconds", type=float, default=20, help="how long producers submit")
    p.add_argument("--restarts", type=int, default=1, help="PostgreSQL restarts during the load")
    p.add_argument("--drain-seconds", type=float, default=30,
                   help="how long the drain may go without an event delivered or a key completed")
    p.add_argument("--producers", type=int, default=3)
    p.add_argument("--workers", type=int, default=5)
    p.add_argument("--step-workers", type=int, default=2, help="workers of the 3-step jobs")
    p.add_argument("--step-rate", type=float, default=0.12, help="the share of new jobs with 3 steps")
    p.add_argument("--naptime", type=float, default=0.2, help="idempotency.naptime of the cluster")
    return p.parse_args()


def main():
    a = parse_args()
    cfg = types.SimpleNamespace(
        seed=a.seed, api=a.api.rstrip("/"), mail_api=a.mail_api.rstrip("/"), logdir=a.logdir, datadir=a.datadir,
        server_log=a.server_log, bindir=a.bindir, os_user=a.os_user,
        admin_dsn=f"host={a.host} port={a.port} dbname={a.dbname} user=postgres",
        app_dsn=f"host={a.host} port={a.port} dbname={a.dbname} user=chaos_app",
        producers=a.producers, workers=a.workers, producer_rate=8.0,
        step_workers=a.step_workers, step_rate=a.step_rate, step_batch=2,
        # kill_before_claim, kill_after_effect, kill_after_complete, stall_late, stall_fenced
        fault_weights="0.035,0.035,0.035,0.012,0.012",
        batch=3, key_lease=2.0, outbox_lease=3.0, http_timeout=0.5,
        kill_every=(1.5, 4.0), fence_hold=0.3, naptime=a.naptime, t0=time.monotonic())
    assert len(cfg.fault_weights.split(",")) == len(FAULTS)
    os.makedirs(cfg.logdir, exist_ok=True)
    print(f"chaos: seed {a.seed}, {a.seconds:.0f}s of load, {a.producers} producers, "
          f"{a.workers} workers, {a.step_workers} step workers, {a.restarts} restart(s), "
          f"drain stalls up to {a.drain_seconds:.0f}s", flush=True)

    conn = psycopg2.connect(cfg.admin_dsn)
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(SETUP_SQL)
    conn.close()

    fleet = Fleet(cfg, cfg.logdir)
    injector = Injector(cfg, fleet)
    started = time.monotonic()
    cfg.t0 = started
    fleet.start_workers()
    fleet.start_producers(a.producers, a.seconds)
    # One restart at 40% of the load, or several spread from 15% to 85%.
    spread = [0.4] if a.restarts == 1 else [0.15 + 0.7 * i / (a.restarts - 1) for i in range(a.restarts)]
    restart_at = [started + a.seconds * f for f in spread]
    # The drain fails when drain_seconds pass with no event delivered and no
    # key completed (on a busy machine the retries' timeouts and backoffs
    # stretch it, but it keeps moving), or after five times that in all.
    drained, drain_deadline, drain_bound, last_left = False, None, None, None
    next_watch = next_progress = started
    try:
        while True:
            now = time.monotonic()
            fleet.supervise()
            if drain_deadline is None:
                injector.maybe_kill()
                if restart_at and now >= restart_at[0]:
                    restart_at.pop(0)
                    injector.restart_postgres()
                    r = injector.restarts[-1]
                    print(f"chaos: t={r['at']}s PostgreSQL restarted (immediate); fence waited "
                          f"{r['fence_wait_ms']}ms, {r['cut']} waiting transactions cut, "
                          f"down {r['down_s']}s", flush=True)
                    continue
                if fleet.producers_done() and not restart_at:
                    fleet.check_producers()
                    drain_deadline = now + a.drain_seconds
                    drain_bound = now + 5 * a.drain_seconds
                    print(f"chaos: t={now - started:.0f}s producers done; draining", flush=True)
            if now >= next_watch:
                next_watch = now + 0.25
                injector.watch()
                if drain_deadline is not None:
                    left = injector.query(
                        "SELECT (SELECT count(*) FROM idempotency.outbox"
                        "         WHERE topic IN ('jobs', 'steps') AND state <> 'delivered'),"
                        "       (SELECT count(*) FROM idempotency.idempotency_keys"
                        "         WHERE status <> 'COMPLETED')")[0]
                    if left == (0, 0):
                        drained = True
                        break
                    if left != last_left:
                        last_left, drain_deadline = left, now + a.drain_seconds
                    stalled = now > drain_deadline
                    if stalled or now > drain_bound:
                        why = (f"no progress for {a.drain_seconds:.0f}s" if stalled
                               else f"{5 * a.drain_seconds:.0f}s in all")
                        print(f"chaos: the drain stopped ({why}) with {left[0]} events undelivered, "
                              f"{left[1]} keys not completed", flush=True)
                        break
            if now >= next_progress:
                next_progress = now + 5
                row = injector.query(
                    "SELECT count(*), count(*) FILTER (WHERE state = 'delivered'),"
                    "       count(*) FILTER (WHERE topic = 'steps')"
                    "  FROM idempotency.outbox WHERE topic IN ('jobs', 'steps')")[0]
                print(f"chaos: t={now - started:4.0f}s jobs {row[0]:5d} ({row[2]} with 3 steps), "
                      f"delivered {row[1]:5d}, "
                      f"worker restarts {fleet.restarted}, external kills {injector.external_kills}, "
                      f"PostgreSQL restarts {len(injector.restarts)}", flush=True)
            time.sleep(0.1)
    finally:
        fleet.stop_all()

    fleet.check_producers()
    final = injector.metrics()
    total = {}
    for snap in injector.epochs + [final]:
        add_metrics(total, snap)
    # The watchdog's own keys: one claim, one completion (observed) each.
    probes = injector.probes_completed()
    for column in ("claims", "completions", "processing_count"):
        total[column] -= probes
    total["probe_observations"] = probes
    data = gather(cfg, injector, fleet, final, total)
    proof, summary = prove(cfg, injector, fleet, data, drained)
    proof.print(sys.stdout)
    print_summary(summary, time.monotonic() - started, sys.stdout)
    resumed = (f"{summary['resumed_metric']} resumed takeovers ({summary['resumed_logged']} "
               f"logged by the step workers) in {summary['step_jobs']} 3-step jobs")
    if proof.violations:
        print(f"chaos: {proof.violations} violation(s) (seed {a.seed}); {resumed}")
        return 1
    print(f"chaos: no violations; {resumed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
