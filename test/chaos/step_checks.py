"""The proof of the chaos test's 3-step jobs (step_worker.py).

Each step took effect once, where the step puts it: one reservation row in
this database, one charge at the payment API and one email at the mail API,
both providers called only with the step's key as the server derives it
(idem_step_key); every claim was given exactly the steps recorded before it,
and its holder resumed after the last one (no step ran again once recorded,
none was recorded twice); the resumed takeovers idem_metrics counted are
those the keys' rows imply, and there was at least one. Each check is one
line of the Proof (checks.py).
"""

from collections import Counter, defaultdict

from chaoslib import STEPS


def sample(items, n=5):
    items = sorted(map(str, items))
    return ", ".join(items[:n]) + (" ..." if len(items) > n else "")


def provider_books(stats, jobs):
    """What a provider did for jobs: per job, the idempotency keys it was
    called with, the effects it applied and the raw calls it received."""
    used, effects, calls = defaultdict(set), Counter(), Counter()
    for key, job in stats["jobs"].items():
        if job in jobs:
            used[job].add(key)
            effects[job] += stats["applied"].get(key, 0)
            calls[job] += stats["requests_by_key"].get(key, 0)
    return used, effects, calls


def in_order(steps):
    """The step names of a key's steps column by their place, or None when
    the places are not 1, 2, 3..."""
    ordered = sorted(steps.items(), key=lambda item: item[1]["n"])
    if [v["n"] for _, v in ordered] != list(range(1, len(ordered) + 1)):
        return None
    return [name for name, _ in ordered]


def prove_steps(p, data, multi, kills):
    """Adds the checks of the 3-step jobs (the keys in multi) to p; returns
    the figures for the summary."""
    keys, wlogs, step_keys = data["keys"], data["wlogs"], data["step_keys"]
    reservations, api, mail, m = data["reservations"], data["api"], data["mail"], data["metrics"]
    slogs = [e for e in wlogs if str(e["worker"]).startswith("steps-")]
    steps = {k: keys[k]["steps"] for k in multi}

    def recorded(k, name, field):
        return ((steps[k].get(name) or {}).get("result") or {}).get(field)

    p.check(f"3-step jobs were committed ({len(multi)})", multi)
    bad = [k for k in multi if in_order(steps[k]) != list(STEPS)]
    p.check("every 3-step job's key holds its three steps in order (reserve, charge, email)", not bad,
            sample(f"{k}:{in_order(steps[k])}" for k in bad))

    # ---------------------------------------------------------------- one effect per step
    bad = [k for k in multi if reservations.get(k, []) != [recorded(k, "reserve", "reservation_id")]]
    p.check("exactly one reservation row per 3-step job, the one its reserve step recorded", not bad,
            sample(f"{k}:{reservations.get(k, [])}" for k in bad))
    pay_used, pay_effects, pay_calls = provider_books(api, multi)
    bad = [k for k in multi if pay_used[k] != {step_keys[k]["charge"]} or pay_effects[k] != 1
           or api["ids"].get(step_keys[k]["charge"]) != recorded(k, "charge", "charge_id")]
    p.check("the payment API charged each 3-step job once, called only with its charge step's key, "
            "and the step recorded that charge", not bad,
            sample(f"{k}:{len(pay_used[k])} keys, {pay_effects[k]} charges" for k in bad))
    mail_used, mail_effects, mail_calls = provider_books(mail, multi)
    bad = [k for k in multi if mail_used[k] != {step_keys[k]["email"]} or mail_effects[k] != 1
           or mail["ids"].get(step_keys[k]["email"]) != recorded(k, "email", "message_id")]
    p.check("the mail API sent each 3-step job's email once, called only with its email step's key, "
            "and the step recorded that email", not bad,
            sample(f"{k}:{len(mail_used[k])} keys, {mail_effects[k]} emails" for k in bad))
    stray = set(mail["jobs"].values()) - multi
    p.check(f"the mail API never sent an email for another job, nor saw a key reused with another "
            f"request ({mail['mismatches']})", not stray and mail["mismatches"] == 0, sample(stray))
    bad = [k for k in multi if keys[k]["result"] != {
        "reservation_id": recorded(k, "reserve", "reservation_id"),
        "charge_id": recorded(k, "charge", "charge_id"),
        "message_id": recorded(k, "email", "message_id")}]
    p.check("each 3-step job's stored result carries what its three steps recorded", not bad, sample(bad))
    runs = [e for e in slogs if e["ev"] == "step_run"]
    bad = [f"{e['key']}/{e['step']}" for e in runs
           if e["key"] in multi and e["call_key"] != step_keys[e["key"]][e["step"]]]
    p.check(f"every step ran with the key the server derives for it, idem_step_key ({len(runs)} runs)",
            not bad, sample(bad))

    # ---------------------------------------------------------------- resuming after the last step
    claims = [e for e in slogs if e["ev"] == "claim" and e["outcome"] == "claimed" and e["key"] in multi]
    bad = [f"{e['key']}@{e['attempt']}:{e['steps']}" for e in claims
           if e["steps"] != [s for s in STEPS if steps[e["key"]].get(s, {}).get("attempt", e["attempt"]) < e["attempt"]]]
    p.check(f"every claim of a 3-step job was given exactly the steps recorded before it, in order "
            f"({len(claims)} claims)", not bad, sample(bad))
    # Once a step is recorded by attempt a, no later attempt runs it: its
    # holder resumes after it. Within one claim the steps run in order,
    # starting right after the last step the claim was given.
    bad = [f"{e['key']}/{e['step']}@{e['attempt']}" for e in runs
           if e["key"] in multi and e["attempt"] > steps[e["key"]].get(e["step"], {}).get("attempt", 0)]
    ran_by_token = defaultdict(list)
    for e in runs:
        ran_by_token[(e["key"], e["token"])].append(e["step"])
    for e in claims:
        ran = ran_by_token.get((e["key"], e["token"]), [])
        after = list(STEPS[len(e["steps"]):])
        if ran != after[:len(ran)]:
            bad.append(f"{e['key']}@{e['attempt']} given {e['steps']} ran {ran}")
    p.check("every takeover resumed after its last recorded step: no step ran again once recorded, "
            "and each claim ran the steps after the ones it was given, in order", not bad, sample(bad))
    records = Counter((e["key"], e["step"]) for e in slogs if e["ev"] == "step_recorded")
    attempts_of = {(e["key"], e["step"]): e["attempt"] for e in slogs if e["ev"] == "step_recorded"}
    bad = [f"{k}/{s}:{n}" for (k, s), n in records.items() if n > 1]
    bad += [f"{k}/{s}@{a}" for (k, s), a in attempts_of.items()
            if k in multi and steps[k].get(s, {}).get("attempt") != a]
    p.check(f"no step was recorded twice ({sum(records.values())} records logged, each by the attempt "
            f"the key holds it from)", not bad, sample(bad))

    # ---------------------------------------------------------------- resumed takeovers
    # Steps are recorded in order, so the claims of a key that found steps
    # are exactly those after the attempt that recorded its first step.
    implied = sum(keys[k]["attempts"] - steps[k]["reserve"]["attempt"] for k in multi if "reserve" in steps[k])
    logged = sum(1 for e in claims if e["steps"])
    p.check(f"metrics: resumed_takeovers = claims after a key's first step was recorded "
            f"({m['resumed_takeovers']} = {implied})", m["resumed_takeovers"] == implied, "exact")
    p.check(f"metrics: resumed_takeovers >= resumed claims logged ({m['resumed_takeovers']} >= {logged})",
            m["resumed_takeovers"] >= logged, "bound: a worker may die before its log line")
    p.check(f"takeovers resumed after finished steps ({logged} logged)", logged > 0)
    for step in STEPS:
        for where in ("in", "after"):
            n = kills[f"{where}_{step}"]
            p.check(f"step workers were killed {'inside' if where == 'in' else 'after'} the {step} step ({n})", n > 0)

    return dict(
        step_jobs=len(multi), resumed_metric=m["resumed_takeovers"], resumed_logged=logged,
        step_kills={s: (kills[f"in_{s}"], kills[f"after_{s}"]) for s in STEPS},
        step_runs=Counter(e["step"] for e in runs),
        reservation_rows=sum(len(reservations.get(k, [])) for k in multi),
        step_charge_calls=sum(pay_calls.values()), step_charge_effects=sum(pay_effects.values()),
        email_calls=sum(mail_calls.values()), email_effects=sum(mail_effects.values()),
        double_reservations=sum(max(0, len(reservations.get(k, [])) - 1) for k in multi),
        double_charges=sum(max(0, n - 1) for n in pay_effects.values()),
        double_emails=sum(max(0, n - 1) for n in mail_effects.values()))
