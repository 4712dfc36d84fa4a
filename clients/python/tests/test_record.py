"""Recording how work ended outlives a brief loss of the database: the
connections of the middlewares' pools are cut through a proxy
(cut_proxy.py), for a second as the handler ends, or between the record's
commit and its answer. The claim itself is not tried again, nor is a
record on a connection the application gave (claim(conn, ...)): a lost
connection is the application's to make again."""

import asyncio

import httpx
import pytest
from fastapi import FastAPI
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from conftest import SETTINGS, key_row
from cut_proxy import CutProxy
from pg_idempotency.asgi import IdempotencyMiddleware

flask = pytest.importorskip("flask", reason="python3-flask is not installed")
from pg_idempotency.flask import Idempotency  # noqa: E402

SCOPE = "py.outage"


@pytest.fixture
def proxy():
    p = CutProxy()
    yield p
    p.close()


def asgi_post(proxy, key, cut):
    async def main():
        async with AsyncConnectionPool(proxy.conninfo(), kwargs={"autocommit": True, "options": SETTINGS},
                                       min_size=1, max_size=3) as pool:
            app = FastAPI()

            @app.post("/pay")
            async def pay():
                cut()
                return {"paid": True}
            app.add_middleware(IdempotencyMiddleware, pool=pool, scope=SCOPE, lease=20)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
                return await client.post("/pay", headers={"idempotency-key": key})
    return asyncio.run(main())


def flask_post(proxy, key, cut, status=201):
    with ConnectionPool(proxy.conninfo(), kwargs={"autocommit": True, "options": SETTINGS},
                        min_size=1, max_size=3) as pool:
        app = flask.Flask("outage")
        Idempotency(app, pool=pool, scope=SCOPE, paths=["/pay"], lease=20)

        @app.post("/pay")
        def pay():
            cut()
            return flask.jsonify(paid=True), status
        return app.test_client().post("/pay", headers={"idempotency-key": key})


def test_asgi_records_through_a_second_without_the_database(proxy, admin, new_key):
    key = new_key()
    response = asgi_post(proxy, key, lambda: proxy.cut_for(1.0))
    assert response.status_code == 200, response.text
    assert key_row(admin, key, SCOPE)[0] == "COMPLETED"


def test_asgi_record_whose_answer_was_lost(proxy, admin, new_key):
    key = new_key()
    response = asgi_post(proxy, key, proxy.cut_after_next_statement)
    assert response.status_code == 200, response.text
    assert key_row(admin, key, SCOPE)[0] == "COMPLETED"


def test_wsgi_records_through_a_second_without_the_database(proxy, admin, new_key):
    key = new_key()
    response = flask_post(proxy, key, lambda: proxy.cut_for(1.0))
    assert response.status_code == 201, response.get_data(as_text=True)
    assert key_row(admin, key, SCOPE)[0] == "COMPLETED"


def test_wsgi_failure_whose_answer_was_lost(proxy, admin, new_key):
    key = new_key()
    response = flask_post(proxy, key, proxy.cut_after_next_statement, status=503)
    assert response.status_code == 503, response.get_data(as_text=True)
    assert key_row(admin, key, SCOPE)[0] == "FAILED_RETRYABLE"
