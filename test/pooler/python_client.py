"""The Python client through a pooler in transaction mode: the WSGI and
ASGI middlewares with the pools they make themselves from a conninfo (the
ASGI one with waiting duplicates, and in transaction mode), a claim whose
heartbeat renews its lease many times, the maintenance runner and the
outbox's Consumer and AsyncConsumer, all on connections that reach the
server through PgBouncer while another application shares its pool.
Argument: the conninfo. Prints one line per check, "ok ..." or "not ok ...", and exits 1
on any failure."""

import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
import io

import asyncio

import psycopg

import pg_idempotency as idem
from pg_idempotency.asgi import IdempotencyMiddleware as AsgiMiddleware
from pg_idempotency.maintenance import start_maintenance
from pg_idempotency.outbox import AsyncConsumer, Consumer
from pg_idempotency.wsgi import IdempotencyMiddleware

conninfo = sys.argv[1]
runs = Counter()
lock = threading.Lock()


def handler(environ, start_response):
    with lock:
        runs[environ["PATH_INFO"]] += 1
    start_response("201 Created", [("Content-Type", "application/json")])
    return [b'{"ok": true}']


app = IdempotencyMiddleware(handler, conninfo=conninfo, scope="pooler", pool_options={"max_size": 4})


def post(key):
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/" + key, "HTTP_IDEMPOTENCY_KEY": key,
               "CONTENT_LENGTH": "2", "CONTENT_TYPE": "application/json", "wsgi.input": io.BytesIO(b"{}")}
    status = []
    body = b"".join(app(environ, lambda s, h, e=None: status.append(s)))
    return status[0], body


errors = []
passes = []
maintenance = start_maintenance(conninfo, interval=0.02, on_pass=lambda rows: passes.append(1),
                                on_error=errors.append)
keys = [f"order-{i}" for i in range(40)]
with ThreadPoolExecutor(max_workers=4) as pool:
    # Each key three times, in turn: the first runs the handler, the others
    # replay it; 120 requests over the pool's connections, each far past
    # psycopg's prepare_threshold.
    answers = list(pool.map(post, keys * 3))
while len(passes) < 30 and not errors:
    threading.Event().wait(0.05)
maintenance.stop()
app.idempotency.close()

# The Consumer: 30 events, one claim each, on one connection (far past
# prepare_threshold), polling every 0.05 s.
with psycopg.connect(conninfo, autocommit=True, prepare_threshold=None) as conn:
    conn.execute("SELECT count(idempotency.outbox_enqueue('py.events', jsonb_build_object('n', n)))"
                 " FROM generate_series(1, 30) n")
handled = []
consumer_log = []
consumer = Consumer(conninfo, ["py.events"], name="py-consumer", poll=0.05, log=consumer_log.append)


def handle(event):
    handled.append(event["id"])
    if len(handled) >= 30:
        consumer.stop()


runner = threading.Thread(target=consumer.run, args=(handle,), daemon=True)
runner.start()
runner.join(60)

# The AsyncConsumer: 30 more events, the same way.
with psycopg.connect(conninfo, autocommit=True, prepare_threshold=None) as conn:
    conn.execute("SELECT count(idempotency.outbox_enqueue('py.async', jsonb_build_object('n', n)))"
                 " FROM generate_series(1, 30) n")
handled_async = []
async_log = []


async def consume_async():
    async_consumer = AsyncConsumer(conninfo, ["py.async"], name="py-async", poll=0.05, log=async_log.append)

    async def handle_async(event):
        handled_async.append(event["id"])
        if len(handled_async) >= 30:
            async_consumer.stop()
    await asyncio.wait_for(async_consumer.run(handle_async), 60)


try:
    asyncio.run(consume_async())
except Exception as exc:   # reported by the check below
    async_log.append(repr(exc))

# The ASGI middlewares, each with the pool it opens from the conninfo and
# closes at the app's shutdown: /slow in claim mode, where the duplicates
# sent at once wait for the holder (its handler takes 0.3 s), and /tx in
# transaction mode, whose handler writes on the key's connection.
asgi_runs = Counter()


async def inner(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return
    context = scope["state"]["idempotency"]
    asgi_runs[scope["path"] + context.key] += 1
    if scope["path"] == "/slow":
        await asyncio.sleep(0.3)
    else:
        await context.conn.execute("INSERT INTO asgi_effects VALUES (%s)", (context.key,))
    await send({"type": "http.response.start", "status": 201, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"ok": true}'})


asgi_app = AsgiMiddleware(AsgiMiddleware(inner, conninfo=conninfo, scope="pooler.asgi_tx", paths=["/tx"],
                                         mode="transaction"),
                          conninfo=conninfo, scope="pooler.asgi", paths=["/slow"], wait=30)


async def asgi_post(path, key):
    sent = []
    body = [{"type": "http.request", "body": b"{}", "more_body": False}]

    async def receive():
        return body.pop() if body else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)
    scope = {"type": "http", "method": "POST", "path": path, "headers": [
        (b"idempotency-key", key.encode()), (b"content-type", b"application/json")]}
    await asgi_app(scope, receive, send)
    return sent[0]["status"]


async def lifespan(event):
    messages = [{"type": "lifespan." + event}]
    done = []

    async def receive():
        return messages.pop() if messages else await asyncio.Event().wait()

    async def send(message):
        done.append(message["type"])
    task = asyncio.ensure_future(asgi_app({"type": "lifespan"}, receive, send))
    while not done:
        await asyncio.sleep(0.01)
    task.cancel()


async def asgi_burst():
    await lifespan("startup")
    try:
        asgi_keys = [f"asgi-{i}" for i in range(20)]
        return await asyncio.gather(*[asgi_post(path, key) for path in ("/slow", "/tx")
                                      for key in asgi_keys * 3])
    finally:
        await lifespan("shutdown")


try:
    asgi_statuses = Counter(asyncio.run(asgi_burst()))
except Exception as exc:   # reported by the checks below
    asgi_statuses = Counter({repr(exc): 1})
with psycopg.connect(conninfo, autocommit=True, prepare_threshold=None) as conn:
    asgi_effects = conn.execute("SELECT count(*), count(DISTINCT key) FROM asgi_effects").fetchone()

# A claim whose work outlasts its lease several times: the heartbeat renews
# it (every third of the lease) on a connection of its own, opened like the
# claim's (which prepares nothing, as the docs say behind a pooler).
# Meanwhile, after 3.5 s, another worker's claim of the key must find it
# held; a lease the heartbeat failed to renew would have ended by then.
def claim_again():
    with psycopg.connect(conninfo, prepare_threshold=None) as other:
        try:
            with idem.claim(other, "long-job", scope="pooler.heartbeat", lease=1, heartbeat=False):
                return "claimed"
        except idem.NotClaimed as answer:
            return answer.job.outcome


with psycopg.connect(conninfo, prepare_threshold=None) as conn:
    with idem.claim(conn, "long-job", scope="pooler.heartbeat", lease=1) as job:
        time.sleep(3.5)
        second_claim = claim_again()
        time.sleep(0.5)
heartbeat_outcome = (job.outcome, job.lost.is_set(), second_claim)


failed = False


def check(ok, what):
    global failed
    print(("ok " if ok else "not ok ") + what)
    failed |= not ok


statuses = Counter(status for status, _ in answers)
check(statuses == Counter({"201 Created": 120}), f"python: 120 requests answered 201 ({dict(statuses)})")
check(sorted(runs.values()) == [1] * 40, f"python: each of 40 keys handled once ({sum(runs.values())} runs)")
check(not errors and len(passes) >= 30,
      f"python: the maintenance runner made {len(passes)} passes without an error {errors[:1]}")
check(len(handled) == 30 and len(set(handled)) == 30 and not runner.is_alive(),
      f"python: the Consumer handled 30 events, each once, and stopped ({len(set(handled))} distinct)")
check(not consumer_log, f"python: the Consumer logged no error {consumer_log[:1]}")
check(len(set(handled_async)) == 30 == len(handled_async) and not async_log,
      f"python: the AsyncConsumer handled 30 events, each once, with no error ({len(set(handled_async))} distinct"
      f"{', ' + async_log[0] if async_log else ''})")
check(asgi_statuses == Counter({201: 120}),
      f"python: 120 ASGI requests, duplicates at once, answered 201 ({dict(asgi_statuses)})")
check(sorted(asgi_runs.values()) == [1] * 40,
      f"python: each of 40 ASGI keys handled once ({sum(asgi_runs.values())} runs)")
check(asgi_effects == (20, 20), f"python: the transaction mode's writes, each key's once ({asgi_effects})")
check(heartbeat_outcome == ("completed", False, "in_progress"),
      f"python: 4 s of work under a 1 s lease stays held and completes, its heartbeat renewing it"
      f" (outcome, lost, another claim at 3.5 s: {heartbeat_outcome})")
sys.exit(1 if failed else 0)
