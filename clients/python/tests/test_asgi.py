"""The Idempotency-Key middleware in a FastAPI app, driven in process by
httpx (requests at once run concurrently on one event loop)."""

import asyncio
import json
import math
import os
from collections import Counter

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool
from starlette.testclient import TestClient

import pg_idempotency as idem
from pg_idempotency.asgi import IdempotencyMiddleware
from pg_idempotency.http import Response as StoredResponse
from conftest import SETTINGS, effects, estimates_retry_after, expire_result, key_row, terminate_backends

runs = Counter()     # per key: how many times a handler ran


async def until_held(pool, key, scope):
    """Waits until a request holds `key` (its claim committed): duplicates
    sent before that could claim it first on a busy machine."""
    for _ in range(800):
        async with pool.connection() as conn:
            row = await (await conn.execute("SELECT status::text FROM idempotency.idem_get(%s, %s)",
                                            (key, scope))).fetchone()
        if row is not None and row[0] == "PROCESSING":
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"no request held {key} within 20 s")


def broken_classify(response):
    raise RuntimeError("classify is broken")


def make_app(pool):
    app = FastAPI()

    @app.post("/orders")
    async def orders(request: Request):
        body = await request.json()
        key = request.state.idempotency.key
        runs[key] += 1
        await asyncio.sleep(body.get("delay", 0))
        return JSONResponse({"order": runs[key], "echo": body}, status_code=201, headers={"x-order": f"order-{runs[key]}"})

    @app.post("/waiting")
    async def waiting(request: Request):
        key = request.state.idempotency.key
        runs[key] += 1
        await asyncio.sleep(0.3)
        return JSONResponse({"order": runs[key]}, status_code=201)

    @app.post("/flaky")
    async def flaky(request: Request):
        key = request.state.idempotency.key
        runs[key] += 1
        return JSONResponse({"run": runs[key]}, status_code=503 if runs[key] == 1 else 201)

    @app.post("/throws")
    async def throws(request: Request):
        key = request.state.idempotency.key
        runs[key] += 1
        if runs[key] == 1:
            raise RuntimeError("boom")
        return {"ok": True}

    @app.post("/declined")
    async def declined(request: Request):
        runs[request.state.idempotency.key] += 1
        return JSONResponse({"declined": True}, status_code=402)

    @app.post("/binary")
    async def binary(request: Request):
        runs[request.state.idempotency.key] += 1
        return Response(bytes([0, 255, 128, 10, 13]), media_type="application/octet-stream")

    @app.post("/large")
    async def large(request: Request):
        runs[request.state.idempotency.key] += 1
        return Response(b"x" * 1200000, media_type="text/plain")

    @app.post("/nul")
    async def nul(request: Request):
        runs[request.state.idempotency.key] += 1
        return Response(b"a\x00b", media_type="text/plain")

    @app.post("/nul-header")
    async def nul_header(request: Request):
        runs[request.state.idempotency.key] += 1
        return Response(b"ok", media_type="text/plain", headers={"x-note": "a\x00b"})

    @app.post("/classify-claim")
    @app.post("/classify-tx")
    async def misclassified(request: Request):
        key = request.state.idempotency.key
        runs[key] += 1
        return JSONResponse({"run": runs[key]}, status_code=201)

    @app.post("/optional")
    async def optional():
        return {"ok": True}

    @app.post("/tx")
    async def tx(request: Request):
        body = await request.json()
        ctx = request.state.idempotency
        runs[ctx.key] += 1
        await ctx.conn.execute("INSERT INTO effects (key, worker) VALUES (%s, 'asgi')", (ctx.key,))
        await asyncio.sleep(body.get("delay", 0))
        if body.get("fail"):
            return JSONResponse({"error": "failed after writing"}, status_code=500)
        if body.get("refuse"):
            return JSONResponse({"error": "refused after writing"}, status_code=409)
        return JSONResponse({"written": True}, status_code=201)

    @app.post("/jobs")
    async def jobs(request: Request):
        body = await request.json()
        ctx = request.state.idempotency
        runs[ctx.key] += 1
        if body.get("invalid"):
            return JSONResponse({"error": "invalid"}, status_code=400)
        await idem.aenqueue(ctx.conn, "asgi.jobs", {"key": ctx.key, "request": ctx.request, "body": body},
                            dedup_key=ctx.key)
        return JSONResponse({"accepted": ctx.key}, status_code=202)

    common = {"pool": pool}
    app.add_middleware(IdempotencyMiddleware, **common, scope="asgi.orders",
                       paths=["/orders", "/waiting", "/flaky", "/throws", "/declined", "/binary", "/large", "/nul",
                              "/nul-header"])
    app.add_middleware(IdempotencyMiddleware, **common, scope="asgi.misclassified", paths=["/classify-claim"],
                       classify=broken_classify)
    app.add_middleware(IdempotencyMiddleware, **common, scope="asgi.misclassified", paths=["/classify-tx"],
                       mode="transaction", classify=broken_classify)
    app.add_middleware(IdempotencyMiddleware, **common, scope="asgi.waiting", paths=["/waiting"], wait=10)
    app.add_middleware(IdempotencyMiddleware, **common, scope="asgi.optional", paths=["/optional"], required=False)
    app.add_middleware(IdempotencyMiddleware, **common, scope="asgi.tx", paths=["/tx"], mode="transaction")
    app.add_middleware(IdempotencyMiddleware, **common, scope="asgi.jobs", paths=["/jobs"], mode="register",
                       failed_response=lambda error: StoredResponse(402, {"content-type": "text/plain"}, error.encode()))
    return app


def scenario(test):
    """Runs test(post, pool) with a fresh app on a fresh event loop."""
    async def main():
        async with AsyncConnectionPool(kwargs={"autocommit": True, "options": SETTINGS}, min_size=2, max_size=20) as pool:
            app = make_app(pool)
            # The app's exceptions become the 500 that the server would send.
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                async def post(path, key, body=None, content=None):
                    headers = {"content-type": "application/json"}
                    if key:
                        headers["idempotency-key"] = key
                    res = await client.post(path, headers=headers,
                                            content=content if content is not None else json.dumps(body or {}))
                    res.replayed = res.headers.get("idempotent-replayed") == "true"
                    return res
                return await test(post, pool)
    return asyncio.run(main())


def test_no_key_is_400_and_optional_keys_pass(new_key):
    async def test(post, pool):
        missing = await post("/orders", None, {"item": "a"})
        assert missing.status_code == 400
        assert missing.headers["content-type"] == "application/problem+json"
        assert (await post("/optional", None)).status_code == 200
    scenario(test)


def test_a_repeat_replays_status_headers_and_body_byte_for_byte(new_key):
    key = new_key()

    async def test(post, pool):
        first = await post("/orders", key, {"item": "a", "qty": 2})
        again = await post("/orders", key, {"item": "a", "qty": 2})
        assert (first.status_code, first.replayed) == (201, False)
        assert (again.status_code, again.replayed, again.headers["x-order"]) == (201, True, "order-1")
        assert again.content == first.content
        assert again.headers["content-type"] == first.headers["content-type"]
        canonical = await post("/orders", key, content='{ "qty": 2, "item": "a" }')
        assert canonical.replayed, "the same JSON in another order is the same request"
    scenario(test)
    assert runs[key] == 1


def test_the_key_reused_with_another_body_or_path_is_422(new_key):
    key = new_key()

    async def test(post, pool):
        await post("/orders", key, {"item": "a"})
        assert (await post("/orders", key, {"item": "b"})).status_code == 422
        assert (await post("/flaky", key, {"item": "a"})).status_code == 422
    scenario(test)
    assert runs[key] == 1


def test_a_repeat_after_the_stored_response_expired_is_410_naming_the_key(new_key, admin):
    key = new_key()

    async def test(post, pool):
        assert (await post("/orders", key, {"item": "a"})).status_code == 201
        expire_result(admin, key, "asgi.orders")
        late = await post("/orders", key, {"item": "a"})
        assert late.status_code == 410
        assert late.headers["content-type"] == "application/problem+json"
        doc = late.json()
        assert (doc["status"], doc["idempotency_key"]) == (410, key)
        assert f'"{key}"' in doc["detail"] and "expired" in doc["detail"]
        assert (await post("/orders", key, {"item": "b"})).status_code == 422
    scenario(test)
    assert runs[key] == 1


def test_concurrent_duplicates_run_the_handler_once(new_key):
    key = new_key()

    async def test(post, pool):
        answers = await asyncio.gather(*(post("/orders", key, {"item": "c", "delay": 0.4}) for _ in range(10)))
        original = [a for a in answers if a.status_code == 201 and not a.replayed]
        conflicts = [a for a in answers if a.status_code == 409]
        replays = [a for a in answers if a.status_code == 201 and a.replayed]
        assert len(original) == 1, [a.status_code for a in answers]
        assert len(conflicts) + len(replays) == 9 and conflicts
        assert all(int(c.headers["retry-after"]) >= 1 for c in conflicts)
        assert all(r.content == original[0].content for r in replays)
    scenario(test)
    assert runs[key] == 1


def test_with_wait_duplicates_get_the_first_response(new_key):
    key = new_key()

    async def test(post, pool):
        answers = await asyncio.gather(*(post("/waiting", key) for _ in range(6)))
        assert [a.status_code for a in answers] == [201] * 6
        assert sum(not a.replayed for a in answers) == 1
        assert len({a.content for a in answers}) == 1
    scenario(test)
    assert runs[key] == 1


def test_retryable_and_final_failures(new_key):
    flaky, throws, declined = new_key(), new_key(), new_key()

    async def test(post, pool):
        assert (await post("/flaky", flaky)).status_code == 503
        retry = await post("/flaky", flaky)
        assert (retry.status_code, retry.replayed) == (201, False)
        assert (await post("/flaky", flaky)).replayed
        assert (await post("/throws", throws)).status_code == 500
        assert (await post("/throws", throws)).status_code == 200
        first = await post("/declined", declined)
        again = await post("/declined", declined)
        assert (again.status_code, again.replayed, again.content) == (402, True, first.content)
    scenario(test)
    assert (runs[flaky], runs[throws], runs[declined]) == (2, 2, 1)


def test_a_binary_body_is_replayed_byte_for_byte(new_key):
    key = new_key()

    async def test(post, pool):
        await post("/binary", key)
        again = await post("/binary", key)
        assert again.replayed and again.content == bytes([0, 255, 128, 10, 13])
    scenario(test)


def test_a_key_sent_as_utf8_is_stored_as_those_characters_other_bytes_400(new_key, admin):
    key = f"ключ-{new_key()}-✓"

    async def test(post, pool):
        first = await post("/orders", key.encode())
        assert first.status_code == 201
        assert key_row(admin, key, "asgi.orders")[0] == "COMPLETED"
        assert (await post("/orders", key.encode())).replayed
        latin = await post("/orders", b"caf\xe9")      # one byte 0xE9: not UTF-8
        assert latin.status_code == 400 and b"not UTF-8" in latin.content
    scenario(test)
    assert runs[key] == 1


def test_a_body_with_a_nul_character_is_stored_and_replayed(new_key):
    key = new_key()

    async def test(post, pool):
        first = await post("/nul", key)
        again = await post("/nul", key)
        assert (first.status_code, first.content) == (200, b"a\x00b")
        assert again.replayed and again.content == b"a\x00b"
    scenario(test)
    assert runs[key] == 1


def test_a_header_with_a_nul_character_is_stored_with_a_space(new_key):
    key = new_key()

    async def test(post, pool):
        first = await post("/nul-header", key)
        again = await post("/nul-header", key)
        assert (first.status_code, first.headers.get("x-note")) == (200, "a b")
        assert again.replayed and again.headers.get("x-note") == "a b"
    scenario(test)
    assert runs[key] == 1


@pytest.mark.parametrize("path", ["/classify-claim", "/classify-tx"])
def test_a_classify_that_raises_records_by_default_and_is_logged(new_key, admin, caplog, path):
    key = new_key()

    async def test(post, pool):
        first = await post(path, key)
        assert first.status_code == 201
        assert key_row(admin, key, "asgi.misclassified")[0] == "COMPLETED"
        again = await post(path, key)
        assert again.replayed and again.content == first.content
    scenario(test)
    assert runs[key] == 1
    assert any("classify raised" in r.getMessage() and "classify is broken" in (r.exc_text or "")
               for r in caplog.records)


def test_a_response_larger_than_the_server_stores_fails_the_key_for_good(new_key, admin):
    key = new_key()

    async def test(post, pool):
        first = await post("/large", key)
        assert key_row(admin, key, "asgi.orders")[0] == "FAILED_FINAL"
        again = await post("/large", key)
        assert first.status_code == 500 and b"larger than the server stores" in first.content
        assert (again.status_code, again.replayed, again.content) == (500, True, first.content)
    scenario(test)
    assert runs[key] == 1


def test_transaction_mode(new_key, admin):
    ok, failing, refused, racing = new_key(), new_key(), new_key(), new_key()

    async def test(post, pool):
        assert (await post("/tx", ok)).status_code == 201
        assert (await post("/tx", ok)).replayed
        assert (await post("/tx", failing, {"fail": True})).status_code == 500
        assert (await post("/tx", refused, {"refuse": True})).status_code == 409
        again = await post("/tx", refused, {"refuse": True})
        assert (again.status_code, again.replayed) == (409, True)
        answers = await asyncio.gather(*(post("/tx", racing, {"delay": 0.3}) for _ in range(8)))
        assert sum(a.status_code == 201 and not a.replayed for a in answers) == 1
        assert all(a.status_code in (201, 409) for a in answers)
    scenario(test)
    assert effects(admin, ok) == ["asgi"] and effects(admin, racing) == ["asgi"]
    assert effects(admin, failing) == [] and key_row(admin, failing, "asgi.tx") is None
    assert effects(admin, refused) == [] and key_row(admin, refused, "asgi.tx") == ("FAILED_FINAL", 1)
    assert runs[racing] == 1


def test_register_mode_with_a_worker(new_key, admin):
    done, refused, invalid = new_key(), new_key(), new_key()

    async def work(pool, key, fn):
        async with pool.connection() as conn:
            event = await (await conn.execute(
                "SELECT payload FROM idempotency.outbox_claim('test', batch => 100, topics => '{asgi.jobs}')")).fetchall()
            payload = next(p for (p,) in event if p["key"] == key)
            async with idem.aclaim(conn, key, payload["request"], scope="asgi.jobs") as job:
                job.result = fn(payload["body"])
            return job

    async def test(post, pool):
        assert (await post("/jobs", done, {"amount": 5})).status_code == 202
        assert (await post("/jobs", done, {"amount": 5})).status_code == 409
        assert (await post("/jobs", done, {"amount": 6})).status_code == 422
        assert (await work(pool, done, lambda body: {"paid": body["amount"]})).outcome == "completed"
        answer = await post("/jobs", done, {"amount": 5})
        assert (answer.status_code, answer.replayed, answer.json()) == (200, True, {"paid": 5})

        await post("/jobs", refused, {"amount": 7})

        def refuse(body):
            raise idem.FinalError("insufficient funds")
        assert (await work(pool, refused, refuse)).outcome == "failed"
        answer = await post("/jobs", refused, {"amount": 7})
        assert (answer.status_code, answer.text, answer.replayed) == (402, "insufficient funds", True)

        assert (await post("/jobs", invalid, {"invalid": True})).status_code == 400
        assert (await post("/jobs", invalid, {"amount": 1})).status_code == 202
    scenario(test)
    assert runs[done] == 1


def test_with_a_conninfo_the_middleware_opens_its_pool_and_closes_it_at_shutdown(new_key):
    app = FastAPI()

    @app.post("/ping")
    async def ping():
        return {"pong": True}
    app.add_middleware(IdempotencyMiddleware, conninfo="", scope="asgi.conninfo")
    middleware = None
    key = new_key()
    with TestClient(app) as client:
        first = client.post("/ping", headers={"idempotency-key": key}, json={})
        again = client.post("/ping", headers={"idempotency-key": key}, json={})
        middleware = app.middleware_stack.app
    assert (first.status_code, again.headers.get("idempotent-replayed")) == (200, "true")
    assert isinstance(middleware, IdempotencyMiddleware) and middleware.pool is None


class SlowHandOut:
    """A pool whose hand-out of a connection takes a while and loses a
    cancellation that lands meanwhile, as psycopg_pool 3.1.7 can: the task
    then goes on as if nothing happened."""

    def __init__(self, pool):
        self.pool = pool
        self.handing_out = asyncio.Event()
        self.heartbeats = 0

    def connection(self):
        outer = self

        class Lease:
            async def __aenter__(self):
                outer.handing_out.set()
                try:
                    await asyncio.sleep(0.3)
                except asyncio.CancelledError:
                    pass                   # the cancel is lost
                outer.handing_out.clear()
                self.cm = outer.pool.connection()
                conn = await self.cm.__aenter__()
                return Counting(conn, outer)

            async def __aexit__(self, *exc):
                return await self.cm.__aexit__(*exc)
        return Lease()


class Counting:
    def __init__(self, conn, pool):
        self.conn, self.pool = conn, pool

    def __getattr__(self, name):
        return getattr(self.conn, name)

    async def execute(self, sql, *args, **kwargs):
        if "idem_heartbeat" in sql:
            self.pool.heartbeats += 1
        return await self.conn.execute(sql, *args, **kwargs)


def test_a_lost_cancel_does_not_keep_the_heartbeat_or_the_request(new_key, admin):
    """Finding 1: the heartbeat swallowed its cancellation, the request never
    answered and its key stayed PROCESSING with a moving lease."""
    key = new_key()

    async def main():
        async with AsyncConnectionPool(kwargs={"autocommit": True, "options": SETTINGS}, min_size=1,
                                       max_size=4) as real:
            pool = SlowHandOut(real)
            app = FastAPI()

            @app.post("/slow")
            async def slow():
                await asyncio.sleep(0.35)              # the first beat is due
                await pool.handing_out.wait()          # answer while the beat is handed a connection
                return JSONResponse({"ok": True}, status_code=201)
            app.add_middleware(IdempotencyMiddleware, pool=pool, scope="asgi.lost", lease=0.9)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                started = asyncio.get_running_loop().time()
                answer = await asyncio.wait_for(client.post("/slow", headers={"idempotency-key": key}), 10)
                took = asyncio.get_running_loop().time() - started
                beats = pool.heartbeats
                await asyncio.sleep(1.2)               # more than a beat period
                return answer, took, beats, pool.heartbeats
    answer, took, beats, later = asyncio.run(main())
    assert answer.status_code == 201 and took < 3, took
    assert later <= beats + 1, "the heartbeat went on after its request"
    assert key_row(admin, key, "asgi.lost") == ("COMPLETED", 1)


def test_a_cancelled_request_leaves_no_key_processing(new_key, admin):
    key = new_key()

    async def main():
        async with AsyncConnectionPool(kwargs={"autocommit": True, "options": SETTINGS}, min_size=1,
                                       max_size=4) as pool:
            started = asyncio.Event()

            async def app(scope, receive, send):
                started.set()
                await asyncio.sleep(30)
            middleware = IdempotencyMiddleware(app, pool=pool, scope="asgi.cancel", lease=0.9)
            scope = {"type": "http", "method": "POST", "path": "/x", "headers": [(b"idempotency-key", key.encode())]}

            async def receive():
                return {"type": "http.request", "body": b"", "more_body": False}

            async def send(message):
                pass
            task = asyncio.create_task(middleware(scope, receive, send))
            await started.wait()
            task.cancel()
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            await asyncio.wait({task}, timeout=10)
            return task.cancelled(), loop.time() - t0
    cancelled, took = asyncio.run(main())
    assert cancelled and took < 6, took
    assert key_row(admin, key, "asgi.cancel") == ("FAILED_RETRYABLE", 1), "not PROCESSING"


def test_retry_after_is_the_claims_retry_after_rounded_up(new_key):
    key = new_key()

    async def main():
        async with AsyncConnectionPool(kwargs={"autocommit": True, "options": SETTINGS}, min_size=1,
                                       max_size=4) as pool:
            seen = []
            app = FastAPI()
            # Held until the duplicate is answered: on a loaded machine its
            # round trip can outlast any fixed sleep.
            release = asyncio.Event()

            @app.post("/hold")
            async def hold():
                await release.wait()
                return {"ok": True}
            app.add_middleware(IdempotencyMiddleware, pool=pool, scope="asgi.retry_after", lease=2.5,
                               on_conflict=seen.append, on_replay=seen.append)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
                first = asyncio.create_task(client.post("/hold", headers={"idempotency-key": key}))
                await until_held(pool, key, "asgi.retry_after")
                try:
                    busy = await client.post("/hold", headers={"idempotency-key": key})
                finally:
                    release.set()
                await first
                again = await client.post("/hold", headers={"idempotency-key": key})
            return busy, again, seen
    busy, again, seen = asyncio.run(main())
    assert busy.status_code == 409
    retry_after = seen[0]["retry_after"]
    assert 0 < retry_after <= 2.5 and busy.headers["retry-after"] == str(max(1, math.ceil(retry_after)))
    assert [(s["outcome"], s["status"], s["path"]) for s in seen] == [("in_progress", 409, "/hold"),
                                                                        ("completed", 200, "/hold")]
    assert again.headers["idempotent-replayed"] == "true"


def test_a_300_ms_handlers_duplicates_get_retry_after_1(new_key, conn):
    if os.environ.get("IDEM_EDITION") == "sql":
        pytest.skip("the SQL edition keeps no estimates (they live in the C++ extension's shared "
                    "memory): retry_after is the lease left (docs/managed-postgres.md)")
    if not estimates_retry_after(conn):
        pytest.skip("the installed extension does not estimate retry_after yet (feature probe "
                    "estimates_retry_after: in_progress answers the whole lease left)")

    async def main():
        async with AsyncConnectionPool(kwargs={"autocommit": True, "options": SETTINGS}, min_size=1,
                                       max_size=8) as pool:
            app = FastAPI()
            # The held key's handler, after its 300 ms, holds on until its
            # duplicates are answered (their round trips can outlast 300 ms
            # on a loaded machine); a holder past its expected time is
            # answered a quarter of it, so Retry-After stays 1.
            held = {"key": None, "release": asyncio.Event()}

            @app.post("/quick")
            async def quick(request: Request):
                await asyncio.sleep(0.3)
                if request.headers["idempotency-key"] == held["key"]:
                    await held["release"].wait()
                return {"ok": True}
            scope = f"asgi.estimate-{new_key()}"
            app.add_middleware(IdempotencyMiddleware, pool=pool, scope=scope, lease=30)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
                for _ in range(5):      # the scope's recent durations: about 300 ms
                    await client.post("/quick", headers={"idempotency-key": new_key()})
                key = held["key"] = new_key()
                first = asyncio.create_task(client.post("/quick", headers={"idempotency-key": key}))
                try:
                    await until_held(pool, key, scope)
                    busy = await asyncio.gather(*(client.post("/quick", headers={"idempotency-key": key})
                                                  for _ in range(5)))
                finally:
                    held["release"].set()
                await first
            return busy
    busy = asyncio.run(main())
    assert [b.status_code for b in busy] == [409] * 5
    values = [b.headers.get("retry-after") for b in busy]
    print(f"[retry-after] 300 ms handler, lease 30 s: Retry-After {values}")
    assert set(values) == {"1"}, values


def test_duplicates_of_a_holder_elsewhere_poll_off_the_pool(new_key):
    """Two middleware instances (two processes, as far as their holders go)
    share a pool of 2: A's request holds the key, 20 duplicates reach B and
    wait. A still finds a connection for its complete at once."""
    key = new_key()

    async def main():
        async with AsyncConnectionPool(kwargs={"autocommit": True, "options": SETTINGS}, min_size=2,
                                       max_size=2) as pool:
            def app_for():
                app = FastAPI()

                @app.post("/pay")
                async def pay(request: Request):
                    runs[request.state.idempotency.key] += 1
                    await asyncio.sleep(0.5)
                    return JSONResponse({"paid": True}, status_code=201)
                app.add_middleware(IdempotencyMiddleware, pool=pool, scope="asgi.elsewhere", wait=5)
                return app
            a, b = (httpx.AsyncClient(transport=httpx.ASGITransport(app=app_for()), base_url="http://test")
                    for _ in range(2))
            loop = asyncio.get_running_loop()
            async with a, b:
                started = loop.time()

                async def timed(client):
                    answer = await client.post("/pay", headers={"idempotency-key": key})
                    return answer, loop.time() - started
                owner = asyncio.create_task(timed(a))
                await until_held(pool, key, "asgi.elsewhere")
                duplicates = await asyncio.gather(*(timed(b) for _ in range(20)))
                return await owner, duplicates
    (owner, took), duplicates = asyncio.run(main())
    assert owner.status_code == 201 and took < 0.5 + 1, took
    assert all(d.status_code == 201 and d.headers["idempotent-replayed"] == "true" for d, _ in duplicates)
    assert max(t for _, t in duplicates) < 0.5 + 1
    assert runs[key] == 1


def test_transaction_mode_with_wait_replays_to_waiting_duplicates(new_key, admin):
    key = new_key()

    async def main():
        async with AsyncConnectionPool(kwargs={"autocommit": True, "options": SETTINGS}, min_size=2,
                                       max_size=3) as pool:
            app = FastAPI()

            @app.post("/tx")
            async def tx(request: Request):
                ctx = request.state.idempotency
                runs[ctx.key] += 1
                await ctx.conn.execute("INSERT INTO effects (key, worker) VALUES (%s, 'tx-wait')", (ctx.key,))
                await asyncio.sleep(0.4)
                return JSONResponse({"written": True}, status_code=201)
            app.add_middleware(IdempotencyMiddleware, pool=pool, scope="asgi.tx-wait", mode="transaction", wait=5)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
                return await asyncio.gather(*(client.post("/tx", headers={"idempotency-key": key}) for _ in range(12)))
    answers = asyncio.run(main())
    assert [a.status_code for a in answers] == [201] * 12
    assert sum(a.headers.get("idempotent-replayed") == "true" for a in answers) == 11
    assert runs[key] == 1 and effects(admin, key) == ["tx-wait"]


def test_the_heartbeat_is_not_queued_behind_a_pool_whose_every_connection_is_taken(new_key, admin):
    # Through the pool, the beats waited for a connection past the lease:
    # the key was taken over and its work ran twice.
    key = new_key()

    async def main():
        async with AsyncConnectionPool(kwargs={"autocommit": True, "options": SETTINGS}, min_size=2,
                                       max_size=2) as pool:
            app = FastAPI()

            @app.post("/hold")
            async def hold(request: Request):
                ctx = request.state.idempotency
                runs[ctx.key] += 1
                async with pool.connection(), pool.connection():
                    await asyncio.sleep(1.5)
                    async with await psycopg.AsyncConnection.connect(options=SETTINGS, autocommit=True) as other:
                        claimed = await other.execute(
                            "SELECT outcome::text FROM idempotency.idem_claim(%s, scope => 'asgi.hold')", (ctx.key,))
                        outcome = (await claimed.fetchone())[0]
                    await asyncio.sleep(1.0)
                return JSONResponse({"other": outcome}, status_code=201)
            app.add_middleware(IdempotencyMiddleware, pool=pool, scope="asgi.hold", lease=1)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
                return await client.post("/hold", headers={"idempotency-key": key}, content="{}")
    answer = asyncio.run(main())
    assert answer.status_code == 201 and answer.json() == {"other": "in_progress"}, answer.text
    assert key_row(admin, key, "asgi.hold") == ("COMPLETED", 1)
    assert runs[key] == 1


@pytest.mark.parametrize("lease, hold", [(5, 1.5), (1, 3.0)], ids=["the lease lasts", "the heartbeat keeps it"])
def test_a_record_waits_for_a_busy_pool_while_the_lease_lasts(new_key, admin, monkeypatch, lease, hold):
    # A record that gave up at its 10 s (here 0.5 s) while the pool was busy
    # left the key held until its lease ended, and the work ran again. With
    # a lease shorter than the wait, the heartbeat keeps the lease: a record
    # that gave up once the lease the claim set had ended left the key
    # PROCESSING under a lease its heartbeat still renewed.
    monkeypatch.setattr("pg_idempotency._record.PATIENCE", 0.5)
    key = new_key()

    async def main():
        async with AsyncConnectionPool(kwargs={"autocommit": True, "options": SETTINGS}, min_size=1,
                                       max_size=1) as pool:
            app = FastAPI()
            taken = asyncio.Event()

            async def another_request():     # takes the pool's only connection for `hold` s
                async with pool.connection():
                    taken.set()
                    await asyncio.sleep(hold)

            @app.post("/busy")
            async def busy(request: Request):
                runs[request.state.idempotency.key] += 1
                request.state.other = asyncio.create_task(another_request())
                await taken.wait()
                return JSONResponse({"ok": True}, status_code=201)
            app.add_middleware(IdempotencyMiddleware, pool=pool, scope="asgi.busy", lease=lease)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
                return await client.post("/busy", headers={"idempotency-key": key}, content="{}")
    answer = asyncio.run(main())
    assert answer.status_code == 201, answer.text
    assert key_row(admin, key, "asgi.busy") == ("COMPLETED", 1)
    assert runs[key] == 1


def test_the_heartbeat_goes_on_while_a_busy_pool_delays_the_record(new_key, admin):
    # The heartbeat stopped before the record: while the record waited for
    # a busy pool the lease ended, and a duplicate took the key over and
    # ran the handler again.
    key = new_key()
    seen = {}

    async def main():
        async with AsyncConnectionPool(kwargs={"autocommit": True, "options": SETTINGS}, min_size=2,
                                       max_size=2) as pool:
            app = FastAPI()
            taken = asyncio.Event()

            async def another_request():     # holds both pool connections for 2.5 leases
                async with pool.connection(), pool.connection():
                    taken.set()
                    await asyncio.sleep(2.0)
                    async with await psycopg.AsyncConnection.connect(options=SETTINGS, autocommit=True) as other:
                        claimed = await other.execute(
                            "SELECT outcome::text FROM idempotency.idem_claim(%s, scope => 'asgi.recording')", (key,))
                        seen["other"] = (await claimed.fetchone())[0]
                    await asyncio.sleep(0.5)

            @app.post("/recording")
            async def recording(request: Request):
                runs[request.state.idempotency.key] += 1
                request.state.other = asyncio.create_task(another_request())
                await taken.wait()
                return JSONResponse({"ok": True}, status_code=201)
            app.add_middleware(IdempotencyMiddleware, pool=pool, scope="asgi.recording", lease=1)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
                return await client.post("/recording", headers={"idempotency-key": key}, content="{}")
    answer = asyncio.run(main())
    assert answer.status_code == 201, answer.text
    assert seen == {"other": "in_progress"}
    assert key_row(admin, key, "asgi.recording") == ("COMPLETED", 1)
    assert runs[key] == 1


def test_requests_after_the_server_closed_the_pools_connections_are_answered(new_key, admin):
    # A restart closes the pool's idle connections: each failed a request
    # with the framework's 500 (the claim was not tried again).
    async def main():
        async with AsyncConnectionPool(kwargs={"autocommit": True, "options": SETTINGS,
                                               "application_name": "idem-asgi-closed"},
                                       min_size=3, max_size=3) as pool:
            await pool.wait()
            app = FastAPI()

            @app.post("/closed")
            async def closed():
                return JSONResponse({"ok": True}, status_code=201)
            app.add_middleware(IdempotencyMiddleware, pool=pool, scope="asgi.closed")
            terminate_backends(admin, "idem-asgi-closed")
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                return [(await client.post("/closed", headers={"idempotency-key": new_key()})).status_code
                        for _ in range(5)]
    assert asyncio.run(main()) == [201] * 5


def after_closed_connections(admin, name, mode, handler, keys):
    """Each of ``keys`` posted twice to ``handler`` (POST /closed, behind a
    middleware in ``mode`` on a pool whose connections the server closed
    first): the (status, Idempotent-Replayed) of the first requests and of
    the repeats."""
    async def main():
        async with AsyncConnectionPool(kwargs={"autocommit": True, "options": SETTINGS, "application_name": name},
                                       min_size=3, max_size=3) as pool:
            await pool.wait()
            app = FastAPI()
            app.post("/closed")(handler)
            app.add_middleware(IdempotencyMiddleware, pool=pool, scope=name, mode=mode)
            terminate_backends(admin, name)
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                async def post(key):
                    res = await client.post("/closed", headers={"idempotency-key": key})
                    return res.status_code, res.headers.get("idempotent-replayed")
                first = [await post(key) for key in keys]
                return first, [await post(key) for key in keys]
    return asyncio.run(main())


def test_transaction_mode_requests_after_the_server_closed_the_pools_connections_are_answered(new_key, admin):
    # A restart closes the pool's idle connections: the key's transaction
    # could not begin on them, and each request was answered 500 though
    # nothing of it had run.
    keys = [new_key() for _ in range(5)]

    async def closed(request: Request):
        ctx = request.state.idempotency
        runs[ctx.key] += 1
        await ctx.conn.execute("INSERT INTO effects (key, worker) VALUES (%s, 'closed-tx')", (ctx.key,))
        return JSONResponse({"written": True}, status_code=201)
    first, again = after_closed_connections(admin, "idem-asgi-closed-tx", "transaction", closed, keys)
    assert first == [(201, None)] * 5
    assert again == [(201, "true")] * 5
    assert [runs[key] for key in keys] == [1] * 5
    assert [effects(admin, key) for key in keys] == [["closed-tx"]] * 5
    assert [key_row(admin, key, "idem-asgi-closed-tx") for key in keys] == [("COMPLETED", 1)] * 5


def test_register_mode_requests_after_the_server_closed_the_pools_connections_are_answered(new_key, admin):
    keys = [new_key() for _ in range(5)]

    async def closed(request: Request):
        ctx = request.state.idempotency
        runs[ctx.key] += 1
        await idem.aenqueue(ctx.conn, "asgi.closed-jobs", {"key": ctx.key}, dedup_key=ctx.key)
        return JSONResponse({"accepted": ctx.key}, status_code=202)
    first, again = after_closed_connections(admin, "idem-asgi-closed-register", "register", closed, keys)
    assert first == [(202, None)] * 5
    assert again == [(409, None)] * 5      # registered: its worker has not completed it yet
    assert [runs[key] for key in keys] == [1] * 5
    assert [key_row(admin, key, "idem-asgi-closed-register")[0] for key in keys] == ["RECEIVED"] * 5
    jobs = dict(admin.execute("SELECT payload->>'key', count(*) FROM idempotency.outbox"
                              " WHERE topic = 'asgi.closed-jobs' GROUP BY 1").fetchall())
    assert [jobs.get(key) for key in keys] == [1] * 5


def test_transaction_mode_a_connection_lost_at_the_handlers_savepoint_is_tried_again(new_key, admin, monkeypatch):
    # The savepoint a final answer rolls back to is set before the handler
    # runs: lost there, nothing of the request has run, and the key's
    # transaction is tried again on a fresh connection (it was answered 500).
    key, name = new_key(), "idem-asgi-savepoint"
    execute, cut = psycopg.AsyncConnection.execute, []

    async def cut_at_savepoint(self, query, *args, **kwargs):
        if not cut and str(query).startswith("SAVEPOINT"):
            # This connection's session only, ended before the statement
            # is sent (waits until it is gone).
            cut.append(admin.execute("SELECT pg_terminate_backend(%s, 30000)",
                                     (self.info.backend_pid,)).fetchone()[0])
        return await execute(self, query, *args, **kwargs)
    monkeypatch.setattr(psycopg.AsyncConnection, "execute", cut_at_savepoint)

    async def main():
        async with AsyncConnectionPool(kwargs={"autocommit": True, "options": SETTINGS, "application_name": name},
                                       min_size=2, max_size=2) as pool:
            app = FastAPI()

            @app.post("/savepoint")
            async def handler(request: Request):
                ctx = request.state.idempotency
                runs[ctx.key] += 1
                await ctx.conn.execute("INSERT INTO effects (key, worker) VALUES (%s, 'savepoint')", (ctx.key,))
                return JSONResponse({"written": True}, status_code=201)
            app.add_middleware(IdempotencyMiddleware, pool=pool, scope=name, mode="transaction")
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                res = await client.post("/savepoint", headers={"idempotency-key": key})
                return res.status_code, res.text
    status, text = asyncio.run(main())
    assert (cut, status) == ([True], 201), text
    assert runs[key] == 1 and effects(admin, key) == ["savepoint"]
    assert key_row(admin, key, name) == ("COMPLETED", 1)


def test_transaction_mode_a_connection_lost_after_the_handler_ran_is_not_tried_again(new_key, admin):
    # The handler's writes were lost with the key's transaction: a try on a
    # fresh connection would run it a second time within one request. The
    # request is answered 500, the key is left as if it never came, and the
    # client's retry runs the handler.
    key = new_key()

    async def main():
        async with AsyncConnectionPool(kwargs={"autocommit": True, "options": SETTINGS,
                                               "application_name": "idem-asgi-cut-tx"},
                                       min_size=2, max_size=2) as pool:
            await pool.wait()   # both connections are open when the server ends them
            app = FastAPI()

            @app.post("/cut")
            async def cut(request: Request):
                ctx = request.state.idempotency
                runs[ctx.key] += 1
                await ctx.conn.execute("INSERT INTO effects (key, worker) VALUES (%s, 'cut-tx')", (ctx.key,))
                if runs[ctx.key] == 1:
                    terminate_backends(admin, "idem-asgi-cut-tx")
                return JSONResponse({"written": True}, status_code=201)
            app.add_middleware(IdempotencyMiddleware, pool=pool, scope="asgi.cut-tx", mode="transaction")
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                first = await client.post("/cut", headers={"idempotency-key": key})
                assert (first.status_code, runs[key]) == (500, 1), first.text
                assert effects(admin, key) == [] and key_row(admin, key, "asgi.cut-tx") is None
                return (await client.post("/cut", headers={"idempotency-key": key})).status_code
    assert asyncio.run(main()) == 201
    assert runs[key] == 2 and effects(admin, key) == ["cut-tx"]
    assert key_row(admin, key, "asgi.cut-tx") == ("COMPLETED", 1)
