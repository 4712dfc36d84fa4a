"""The proof at the end of the chaos test.

Ground truth comes from four independent places: what the producers saw
commit (their logs), what the workers did and the faults they carried out
(their logs, written before each step, so a SIGKILL loses at most the line
after it), what the mock payment and mail APIs applied (their own books),
and what is in the database. Each check is one line, ok or FAIL. The
3-step jobs' own checks are in step_checks.py.
"""

import json
import re
import urllib.request
from collections import Counter, defaultdict

from chaoslib import STEP_SCOPE, STEPS, read_jsonl
from step_checks import prove_steps


class Proof:
    def __init__(self):
        self.lines = []

    def check(self, name, ok, detail=""):
        self.lines.append((bool(ok), name, detail))

    @property
    def violations(self):
        return sum(1 for ok, _, _ in self.lines if not ok)

    def print(self, out):
        for ok, name, detail in self.lines:
            print(f"{'ok  ' if ok else 'FAIL'} {name}" + (f"  [{detail}]" if detail else ""), file=out)


def sample(items, n=5):
    items = sorted(items)
    return ", ".join(map(str, items[:n])) + (" ..." if len(items) > n else "")


def mock_stats(api):
    with urllib.request.urlopen(api + "/stats", timeout=10) as r:
        return json.load(r)


def gather(cfg, injector, fleet, final_metrics, total_metrics):
    """Everything the proof looks at, in one dict."""
    plogs, wlogs = [], []
    for i in range(cfg.producers):
        plogs += read_jsonl(f"{cfg.logdir}/producer-{i}.jsonl")
    for name in fleet.worker_names():
        for e in read_jsonl(f"{cfg.logdir}/{name}.jsonl"):
            e["worker"] = name
            wlogs.append(e)
    q = injector.query
    # Key names are unique across the two scopes (3-step jobs are step-*).
    keys = {r[0]: dict(scope=r[1], status=r[2], attempts=r[3], late=r[4], result=r[5], token=r[6],
                       steps=r[7] or {})
            for r in q("SELECT key, scope, status::text, attempts, "
                       "       claimed_at + %s * interval '1 second' < completed_at, result, token, steps"
                       "  FROM idempotency.idempotency_keys WHERE scope IN ('default', %s)",
                       (cfg.key_lease, STEP_SCOPE))}
    ledger = defaultdict(list)
    for key, charge_id in q("SELECT job_key, charge_id FROM ledger"):
        ledger[key].append(charge_id)
    reservations = defaultdict(list)
    for key, row_id in q("SELECT job_key, id FROM reservations"):
        reservations[key].append(row_id)
    outbox = defaultdict(list)
    for key, state, attempts, topic in q("SELECT dedup_key, state::text, attempts, topic FROM idempotency.outbox"
                                         " WHERE topic IN ('jobs', 'steps')"):
        outbox[key].append((state, attempts, topic))
    stats = {r[0]: tuple(r[1:]) for r in q(
        "SELECT scope, received, processing, completed, failed_retryable, failed_final, stuck"
        "  FROM idempotency.idem_stats WHERE scope IN ('default', %s)", (STEP_SCOPE,))}
    lag = {r[0]: tuple(r[1:]) for r in q(
        "SELECT topic, pending, in_flight, retrying, dead, extract(epoch FROM lag)::float8"
        "  FROM idempotency.outbox_lag WHERE topic IN ('jobs', 'steps')")}
    # The keys of the steps' external calls, as the server derives them.
    step_keys = defaultdict(dict)
    for key, step, call_key in q("SELECT k.key, s.step, idempotency.idem_step_key(k.key, s.step, scope => k.scope)"
                                 "  FROM idempotency.idempotency_keys k, unnest(%s::text[]) s(step)"
                                 " WHERE k.scope = %s", (list(STEPS), STEP_SCOPE)):
        step_keys[key][step] = call_key
    with open(cfg.server_log, errors="replace") as f:
        server_log = f.read()
    return dict(plogs=plogs, wlogs=wlogs, keys=keys, ledger=ledger, reservations=reservations,
                outbox=outbox, stats=stats, lag=lag, step_keys=step_keys,
                api=mock_stats(cfg.api), mail=mock_stats(cfg.mail_api), server_log=server_log,
                metrics=total_metrics, final_metrics=final_metrics)


def prove(cfg, injector, fleet, data, drained):
    p = Proof()
    plogs, wlogs, keys, ledger, outbox, api, m = (data[k] for k in (
        "plogs", "wlogs", "keys", "ledger", "outbox", "api", "metrics"))

    # ---------------------------------------------------------------- what committed
    submits = [e for e in plogs if e["ev"] == "submit"]
    committed = [e for e in submits if e["fate"] == "committed"]
    committed_keys = {e["key"] for e in committed}
    unknown = [e for e in submits if e["fate"] == "unknown"]
    rolled_back = {e["key"] for e in submits if e["fate"] == "rolled_back"}
    never_committed = rolled_back - committed_keys
    registered = Counter(e["key"] for e in committed if e["outcome"] == "registered")
    jobs = set(keys)  # the keys the database kept: checked against the producers' view below
    duplicates = [e for e in committed if e["outcome"] != "registered"]

    p.check("every committed submission survived (its key exists after the restarts)",
            committed_keys <= jobs, sample(committed_keys - jobs))
    p.check("nothing exists that no producer committed (rolled-back submissions left no key)",
            jobs <= committed_keys | {e["key"] for e in unknown} and not (jobs & never_committed),
            sample((jobs - committed_keys) | (jobs & never_committed)))
    # A submission whose COMMIT was cut by the restart is in doubt: the
    # database then tells whether it committed (the fence makes this rare).
    in_doubt = {e["key"] for e in unknown}
    p.check("each job was registered by exactly one committed submission",
            all(registered[k] == 1 for k in jobs - in_doubt) and all(v == 1 for v in registered.values()),
            sample(k for k in jobs if registered[k] != 1))

    # ---------------------------------------------------------------- effects
    # Jobs of one step (scope default, worker.py) and 3-step jobs (scope
    # steps, step_worker.py; their own checks are in step_checks.py).
    plain = {k for k in jobs if keys[k]["scope"] == "default"}
    multi = jobs - plain
    not_once = {k: len(ledger.get(k, [])) for k in plain if len(ledger.get(k, [])) != 1}
    p.check("every job's ledger row exists exactly once", not not_once,
            sample(f"{k}:{n}" for k, n in not_once.items()))
    # The provider's effects per job, whatever idempotency key it was called with.
    applied = Counter()
    for key, job in api["jobs"].items():
        applied[job] += api["applied"].get(key, 0)
    not_once = {k: applied.get(k, 0) for k in jobs if applied.get(k, 0) != 1}
    p.check("the payment API applied every job's charge exactly once", not not_once,
            sample(f"{k}:{n}" for k, n in not_once.items()))
    wrong_key = [key for key, job in api["jobs"].items() if job in plain and key != job]
    p.check("the payment API was called with the job's key for every job of one step", not wrong_key,
            sample(wrong_key))
    stray = (set(ledger) - plain) | (set(applied) - jobs) | (set(data["reservations"]) - multi)
    p.check(f"the payment API never saw a key reused with another request ({api['mismatches']})",
            api["mismatches"] == 0)
    effects = set(ledger) | set(applied) | set(data["reservations"]) | set(data["mail"]["jobs"].values())
    p.check("no never-committed job was charged, emailed, reserved or written to the ledger",
            not stray and not (never_committed & effects), sample(stray | (never_committed & effects)))
    charge_ids = api["ids"]
    bad = [k for k in plain if ledger.get(k) and ledger[k][0] != charge_ids.get(k)]
    bad += [k for k in plain if (keys[k]["result"] or {}).get("charge_id") != charge_ids.get(k)]
    p.check("ledger rows and stored results carry the charge id the API issued", not bad, sample(bad))
    answers = [e for e in plogs if e["ev"] == "answer" and e["outcome"] == "completed"]
    answers += [e for e in wlogs if e["ev"] == "claim" and e["outcome"] == "completed"]
    bad = [e["key"] for e in answers if e["key"] in plain
           and (e.get("result") or {}).get("charge_id") != charge_ids.get(e["key"])]
    bad += [e["key"] for e in answers if e["key"] in multi and e.get("result") != keys[e["key"]]["result"]]
    p.check(f"every replayed answer ({len(answers)}) carried the stored result", not bad, sample(bad))

    # ---------------------------------------------------------------- delivery and state
    p.check("the drain finished (every committed job done) without stalling", drained)
    not_one = [k for k in jobs if len(outbox.get(k, [])) != 1]
    not_one += [k for k in jobs if any(t != ("jobs" if k in plain else "steps") for _, _, t in outbox.get(k, []))]
    p.check("exactly one outbox event per job, on its topic (duplicate submissions enqueued nothing)",
            not not_one and not (set(outbox) - jobs), sample(not_one + list(set(outbox) - jobs)))
    undelivered = [k for k in jobs if any(s != "delivered" for s, _, _ in outbox.get(k, []))]
    p.check("every committed outbox event was delivered", not undelivered, sample(undelivered))
    not_done = [k for k in jobs if keys[k]["status"] != "COMPLETED"]
    p.check("every job's key is COMPLETED", not not_done,
            sample(f"{k}:{keys[k]['status']}" for k in not_done))
    # The watchdog's rule rests on sweep runs it saw: without them it
    # proves nothing, and sweeps that stop running show here.
    p.check(f"the watchdog saw the sweep run ({injector.sweep_runs_proven} of "
            f"{injector.watch_samples} samples followed a run)", injector.sweep_runs_proven >= 3)
    p.check(f"no sweep left an ended lease behind: no key stayed PROCESSING with its lease "
            f"ended across two sweep runs after it was seen (keys were seen at most "
            f"{injector.watch_max_overdue:.2f}s past their lease, restarts included; naptime "
            f"{cfg.naptime:.1f}s)",
            not injector.watch_bad, sample(injector.watch_bad))

    # The views say the same after the drain, for each kind of job.
    expected = {"default": (0, 0, len(plain), 0, 0, 0), STEP_SCOPE: (0, 0, len(multi), 0, 0, 0)}
    p.check("idem_stats: every job completed, nothing processing, failed or stuck (both scopes)",
            data["stats"] == expected, str(data["stats"]))
    expected = {"jobs": (0, 0, 0, 0, 0.0), "steps": (0, 0, 0, 0, 0.0)}
    p.check("outbox_lag: nothing pending, in flight, retrying or dead; lag 0 (both topics)",
            data["lag"] == expected, str(data["lag"]))

    # ---------------------------------------------------------------- processes and server
    crashes = fleet.crashes
    p.check("no worker or producer died other than by SIGKILL", not crashes,
            "; ".join(f"{w} exit {s}: {t.strip().splitlines()[-1] if t.strip() else ''}"
                      for w, s, t in crashes[:3]))
    reported = [e for e in plogs + wlogs if e["ev"] == "violation"]
    p.check("no unexpected answer or error in the pipeline", not reported,
            "; ".join(f"{e.get('what')}: {e.get('key', '')} {e.get('sqlstate', '')} "
                      f"{str(e.get('error', ''))[:120]}" for e in reported[:3]))
    crash_lines = re.findall(r".*(?:terminated by signal (?:4|6|7|8|11)|PANIC:|TRAP:).*",
                             data["server_log"])
    p.check("the server log shows no backend crash, PANIC or assertion", not crash_lines,
            sample(crash_lines, 2))
    for problem in injector.violations:
        p.check(problem, False)

    # ---------------------------------------------------------------- the faults happened
    kills = Counter(e["step"] for e in wlogs if e["ev"] == "kill")
    kill_jobs = defaultdict(set)
    for e in wlogs:
        if e["ev"] == "kill":
            kill_jobs[e["step"]].add(e["key"])
    for step in ("before_claim", "after_effect", "after_complete"):
        p.check(f"workers were killed {step.replace('_', ' ')} ({kills[step]})", kills[step] > 0)
    p.check(f"the API timed out after applying a charge ({api['timeouts']})", api["timeouts"] > 0)
    p.check(f"the mail API timed out after sending an email ({data['mail']['timeouts']})",
            data["mail"]["timeouts"] > 0)
    p.check(f"PostgreSQL was restarted with an immediate shutdown ({len(injector.restarts)})",
            len(injector.restarts) >= 1)

    # ---------------------------------------------------------------- the 3-step jobs
    steps_summary = prove_steps(p, data, multi, kills)

    # ---------------------------------------------------------------- metrics
    # m is the sum of idem_metrics over the epochs between restarts (each
    # epoch read behind the fence just before its restart) plus the last one.
    # Exact where every event is known; a bound where at-least-once (or a
    # worker killed before it could log an answer it got) leaves slack.
    P = Counter((e["outcome"]) for e in plogs if e["ev"] == "answer")
    W = Counter(e["outcome"] for e in wlogs if e["ev"] == "claim")
    logged = Counter(e["ev"] for e in wlogs)
    stale = [e for e in wlogs if e["ev"] == "stale"]
    stall_done_late = [e for e in wlogs if e["ev"] == "complete" and e.get("stall") == "stall_late"]
    stall_fenced = [e for e in stale if e.get("stall") == "stall_fenced"]
    n = len(jobs)
    # Every kill of a 3-step job's worker comes after its claim.
    after_claim = kills["after_effect"] + sum(kills[f"{where}_{step}"] for step in STEPS for where in ("in", "after"))
    attempts = sum(keys[k]["attempts"] for k in jobs)
    late_in_table = sum(1 for k in jobs if keys[k]["late"])
    buckets = sum(m["processing_ms_buckets"]) - m["probe_observations"]
    fails = m["failures_retryable"] + m["failures_final"]

    def metric(name, ok, why):
        p.check(f"metrics: {name}", ok, why)

    # Each job completes exactly once; a complete that was fenced (IK001) or
    # rolled back by a restart is not counted.
    metric(f"completions = jobs ({m['completions']} = {n})", m["completions"] == n, "exact")
    metric(f"processing_count = completions = sum(buckets) ({m['processing_count']}, {buckets})",
           m["processing_count"] == m["completions"] == buckets, "exact: one observation per completion")
    # attempts counts the key's granted claims (nothing here releases a claim).
    metric(f"claims = granted claims in the table ({m['claims']} = {attempts})",
           m["claims"] == attempts, "exact")
    # A worker killed after its claim never completes that lease generation,
    # nor does one whose complete was fenced (IK001): the job needs one more
    # claim for each.
    metric(f"claims >= jobs + kills after the claim + fenced workers "
           f"({m['claims']} >= {n} + {after_claim} + {len(stale)})",
           m["claims"] >= n + after_claim + len(stale), "bound: external kills add more")
    # Workers claim with key_lease and never heartbeat, so a lease ends
    # key_lease after claimed_at (lease_until itself is cleared once the
    # sweep settles an ended lease): late = completed after that.
    metric(f"late_completions = completions after the lease in the table "
           f"({m['late_completions']} = {late_in_table})", m["late_completions"] == late_in_table, "exact")
    # A stall_late worker completes key_lease + 0.6 s after its claim.
    metric(f"late_completions >= stalls completed late ({len(stall_done_late)})",
           m["late_completions"] >= len(stall_done_late), "bound")
    # Every generation left by a kill after the claim, or taken over from a
    # worker that was then fenced (every fenced stall among them), ended by
    # expiry (sweep or takeover), once each.
    metric(f"lease_expirations >= kills after the claim + fenced workers "
           f"({m['lease_expirations']} >= {after_claim} + {len(stale)}, "
           f"{len(stall_fenced)} of them fenced stalls)",
           m["lease_expirations"] >= after_claim + len(stale),
           "bound: external kills add more")
    # Nothing is left PROCESSING, so every generation ended: by completion,
    # failure or expiry; at most the late ones ended twice (expiry, then a
    # late complete or fail).
    ended = m["completions"] + fails + m["lease_expirations"]
    metric(f"claims <= completions + failures + expirations <= claims + late completions + failures "
           f"({m['claims']} <= {ended} <= {m['claims'] + m['late_completions'] + fails})",
           m["claims"] <= ended <= m["claims"] + m["late_completions"] + fails, "accounting")
    # Answers are counted when given. Producers are never killed, so theirs
    # are all logged; a worker may die between an answer and its log line.
    metric(f"replays >= producer replays + worker replays logged "
           f"({m['replays']} >= {P['completed']} + {W['completed']})",
           m["replays"] >= P["completed"] + W["completed"], "bound")
    metric(f"replays >= producer replays + jobs killed after complete "
           f"({m['replays']} >= {P['completed']} + {len(kill_jobs['after_complete'])})",
           m["replays"] >= P["completed"] + len(kill_jobs["after_complete"]),
           "bound: each such job was redelivered and answered completed")
    metric(f"in_progress >= answers logged ({m['in_progress']} >= "
           f"{P['in_progress']} + {W['in_progress'] + W['retry_later']})",
           m["in_progress"] >= P["in_progress"] + W["in_progress"] + W["retry_later"], "bound")
    # Every idem_fail follows a failed API call that was logged first.
    metric(f"failed API calls logged >= failures_retryable >= fails logged "
           f"({logged['api_failed']} >= {m['failures_retryable']} >= {logged['fail']})",
           logged["api_failed"] >= m["failures_retryable"] >= logged["fail"], "bounds")
    # Every IK001 a worker logged was counted when raised.
    metric(f"stale_tokens >= stale answers logged ({m['stale_tokens']} >= {len(stale)})",
           m["stale_tokens"] >= len(stale), "bound")
    # One event per job; every other committed submission found it by
    # dedup_key; rolled-back enqueues are not counted.
    metric(f"outbox_enqueued = jobs ({m['outbox_enqueued']} = {n})", m["outbox_enqueued"] == n, "exact")
    lo, hi = len(duplicates), len(duplicates) + len(unknown)
    metric(f"outbox_deduplicated = committed duplicate submissions ({m['outbox_deduplicated']} in [{lo}, {hi}])",
           lo <= m["outbox_deduplicated"] <= hi, "exact unless a commit was in doubt")
    metric(f"outbox_delivered = jobs ({m['outbox_delivered']} = {n})", m["outbox_delivered"] == n,
           "exact: each event turns delivered once")
    # A nack counts when it returns the event to pending (not when the event
    # was delivered meanwhile by a late ack).
    nacks = sum(1 for e in wlogs if e["ev"] in ("nack", "fail") and e.get("state") == "pending")
    metric(f"outbox_retried >= nacks logged ({m['outbox_retried']} >= {nacks})",
           m["outbox_retried"] >= nacks, "bound: lease expiries add more")
    # Nothing here may die (max_attempts and outbox_max_attempts are high),
    # requests never change under a key, and no inbox or lock is used.
    zero = {c: m[c] for c in ("failures_final", "mismatches", "outbox_dead", "inbox_duplicates",
                               "locks_acquired", "locks_contended") if m[c] != 0}
    metric("no final failure, mismatch, dead event, inbox or lock activity", not zero, str(zero) if zero else "")

    summary = dict(
        jobs=n, submissions=len(submits), duplicates=len(duplicates),
        duplicate_kinds=Counter(e["kind"] for e in duplicates),
        duplicate_answers=Counter(e["outcome"] for e in duplicates),
        rolled_back=len(never_committed), in_doubt=len(in_doubt), kills=kills, external_kills=injector.external_kills,
        worker_restarts=fleet.restarted, api_timeouts=api["timeouts"], api_errors=api["errors"],
        api_replays=api["replays"], restarts=injector.restarts,
        stalls=Counter(e["kind"] for e in wlogs if e["ev"] == "stall"),
        stale=len(stale), redeliveries=sum(a for v in outbox.values() for _, a, _ in v) - n,
        charge_calls=api["requests"], charge_effects=api["effects"],
        double_ledger=sum(max(0, len(ledger.get(k, [])) - 1) for k in plain),
        double_charges_plain=sum(max(0, applied[k] - 1) for k in plain),
        metrics=m, violations=p.violations, **steps_summary)
    return p, summary


def print_summary(s, seconds, out):
    m = s["metrics"]
    kills = s["step_kills"]
    rows = [
        ("jobs committed (3-step jobs among them)", "%d  (%d)" % (s["jobs"], s["step_jobs"])),
        ("submissions (all)", s["submissions"]),
        ("duplicates injected (committed)", "%d  %s" % (s["duplicates"], dict(s["duplicate_kinds"]))),
        ("  answered", dict(s["duplicate_answers"])),
        ("rolled back (never committed)", s["rolled_back"]),
        ("submissions in doubt (COMMIT cut)", s["in_doubt"]),
        ("kills before the claim", s["kills"]["before_claim"]),
        ("kills after the effect, before complete", s["kills"]["after_effect"]),
        ("kills after complete, before the ack", s["kills"]["after_complete"]),
        ("external SIGKILLs", s["external_kills"]),
        ("worker restarts", s["worker_restarts"]),
        ("stalls past the lease (late / fenced)", "%d / %d" % (s["stalls"]["late"], s["stalls"]["fenced"])),
        ("stale completes fenced (IK001)", s["stale"]),
        ("3-step kills inside / after reserve", "%d / %d" % kills["reserve"]),
        ("3-step kills inside / after charge", "%d / %d" % kills["charge"]),
        ("3-step kills inside / after email", "%d / %d" % kills["email"]),
        ("3-step runs of reserve / charge / email", "%d / %d / %d" % tuple(
            s["step_runs"][step] for step in ("reserve", "charge", "email"))),
        ("resumed takeovers (metrics / logged)", "%d / %d" % (s["resumed_metric"], s["resumed_logged"])),
        ("API timeouts after a charge", s["api_timeouts"]),
        ("API 503 errors", s["api_errors"]),
        ("API replays", s["api_replays"]),
        ("payment API: calls / charges (all jobs)", "%d / %d" % (s["charge_calls"], s["charge_effects"])),
        ("  of 3-step jobs: calls / charges", "%d / %d" % (s["step_charge_calls"], s["step_charge_effects"])),
        ("mail API: calls / emails sent", "%d / %d" % (s["email_calls"], s["email_effects"])),
        ("reservation rows (3-step jobs)", s["reservation_rows"]),
        ("double effects: ledger / charges / reservations / emails", "%d / %d / %d / %d" % (
            s["double_ledger"], s["double_charges_plain"] + s["double_charges"], s["double_reservations"],
            s["double_emails"])),
        ("PostgreSQL restarts (immediate)", "%d  %s" % (len(s["restarts"]), " ".join(
            f"@{r['at']}s(fence {r['fence_wait_ms']}ms, {r['cut']} txns cut, down {r['down_s']}s)" for r in s["restarts"]))),
        ("outbox redeliveries", s["redeliveries"]),
        ("metrics: claims / completions / late", "%d / %d / %d" % (m["claims"], m["completions"], m["late_completions"])),
        ("metrics: replays / in_progress / stale", "%d / %d / %d" % (m["replays"], m["in_progress"], m["stale_tokens"])),
        ("metrics: expirations / failures / retried", "%d / %d / %d" % (
            m["lease_expirations"], m["failures_retryable"], m["outbox_retried"])),
        ("run time (s)", round(seconds, 1)),
        ("violations", s["violations"]),
    ]
    width = max(len(r[0]) for r in rows)
    print("+-" + "-" * width + "-+-" + "-" * 50, file=out)
    for name, value in rows:
        print(f"| {name.ljust(width)} | {value}", file=out)
    print("+-" + "-" * width + "-+-" + "-" * 50, file=out)
