import asyncio

import psycopg

import pg_idempotency as idem
from conftest import SETTINGS


def state(admin, event_id):
    return admin.execute("SELECT state::text, attempts, last_error FROM idempotency.outbox WHERE id = %s",
                         (event_id,)).fetchone()


def test_the_async_consumer_acks_retries_buries_and_runs_a_key_once(admin, new_key):
    topic, key = new_key("topic"), new_key()
    seen, runs, fenced = [], [], []

    async def main():
        async with await psycopg.AsyncConnection.connect(options=SETTINGS, autocommit=True) as conn:
            ids = {kind: await idem.aenqueue(conn, topic, {"kind": kind}) for kind in ("ok", "flaky", "poison")}
            jobs = [await idem.aenqueue(conn, topic, {"kind": "job"}, dedup_key=f"{key}/{n}") for n in range(3)]
            consumer = idem.AsyncConsumer("", [topic], name="async-test", poll=0.2, log=lambda m: None,
                                          on_fenced=fenced.append)

            async def handle(event):
                kind = event["payload"]["kind"]
                seen.append(f"{kind}#{event['attempt']}")
                if kind == "flaky" and event["attempt"] == 1:
                    raise idem.RetryableError("not yet", retry_in=0)
                if kind == "poison":
                    raise idem.FinalError("cannot parse")
                if kind == "job":
                    async with idem.aclaim(conn, key, {"amount": 5}, scope="async.jobs") as job:
                        runs.append(event["id"])     # duplicates raise NotClaimed: settled by it
                    return job

            run = asyncio.create_task(consumer.run(handle))

            def settled():
                return state(admin, ids["flaky"])[0] == "delivered" and state(admin, ids["poison"])[0] == "dead" \
                    and all(state(admin, j)[0] == "delivered" for j in jobs)
            for _ in range(200):
                if settled():
                    break
                await asyncio.sleep(0.05)
            # A notification wakes it (poll is long now): one more event.
            consumer.poll = 30
            late = await idem.aenqueue(conn, topic, {"kind": "ok"})
            for _ in range(100):
                if state(admin, late)[0] == "delivered":
                    break
                await asyncio.sleep(0.05)
            consumer.stop()
            await asyncio.wait_for(run, 10)
            return ids, jobs, late
    ids, jobs, late = asyncio.run(main())
    assert state(admin, ids["ok"])[0] == "delivered" and state(admin, late)[0] == "delivered"
    assert state(admin, ids["poison"])[2] == "cannot parse"
    assert all(state(admin, j)[0] == "delivered" for j in jobs)
    assert len(runs) == 1 and not fenced
    assert sorted(s for s in seen if not s.startswith("job")) == ["flaky#1", "flaky#2", "ok#1", "ok#1", "poison#1"]
