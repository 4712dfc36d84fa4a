"""The Python client through a pooler in transaction mode: the WSGI
middleware with the pool it makes itself from a conninfo, the maintenance
runner and the outbox's Consumer and AsyncConsumer, all on connections that
reach the server through PgBouncer while another application shares its
pool. Argument: the
conninfo. Prints one line per check, "ok ..." or "not ok ...", and exits 1
on any failure."""

import sys
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
import io

import asyncio

import psycopg

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
sys.exit(1 if failed else 0)
