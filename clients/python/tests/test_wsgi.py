"""The threaded middleware: Flask (WSGI) and Django, from Debian's packages.
Concurrent duplicates come from threads (the servers' model)."""

import io
import math
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from conftest import SETTINGS, connect, effects, expire_result, key_row, terminate_backends

flask = pytest.importorskip("flask", reason="python3-flask is not installed")
from pg_idempotency.flask import Idempotency, context  # noqa: E402

runs = Counter()


@pytest.fixture(scope="module")
def pool():
    with ConnectionPool(kwargs={"autocommit": True, "options": SETTINGS}, min_size=1, max_size=3) as p:
        yield p


@pytest.fixture(scope="module")
def flask_app(pool):
    app = flask.Flask("test")
    seen = []
    Idempotency(app, pool=pool, scope="flask.orders", paths=["/orders", "/slow", "/large"], lease=2.5, wait=0,
                on_conflict=seen.append, on_replay=seen.append)
    Idempotency(app, pool=pool, scope="flask.waiting", paths=["/waiting"], wait=10)
    Idempotency(app, pool=pool, scope="flask.tx", paths=["/tx"], mode="transaction")
    Idempotency(app, pool=pool, scope="flask.nul", paths=["/nul", "/nul-header"])
    Idempotency(app, pool=pool, scope="flask.misclassified", paths=["/classify-claim"], classify=broken_classify)
    Idempotency(app, pool=pool, scope="flask.misclassified", paths=["/classify-tx"], mode="transaction",
                classify=broken_classify)

    @app.post("/nul")
    def nul():
        runs[context().key] += 1
        return flask.Response(b"a\x00b", mimetype="text/plain")

    @app.post("/nul-header")
    def nul_header():
        runs[context().key] += 1
        return flask.Response(b"ok", mimetype="text/plain", headers={"x-note": "a\x00b"})

    @app.post("/classify-claim")
    @app.post("/classify-tx")
    def misclassified():
        runs[context().key] += 1
        return flask.jsonify(run=runs[context().key]), 201

    @app.post("/orders")
    def orders():
        key = context().key
        runs[key] += 1
        return flask.jsonify(order=runs[key], echo=flask.request.get_json()), 201, {"x-order": f"o-{runs[key]}"}

    @app.post("/slow")
    def slow():
        runs[context().key] += 1
        time.sleep(0.8)
        return flask.jsonify(ok=True), 201

    @app.post("/large")
    def large():
        runs[context().key] += 1
        return flask.Response(b"x" * 1200000, mimetype="text/plain")

    @app.post("/waiting")
    def waiting():
        runs[context().key] += 1
        time.sleep(0.5)
        return flask.jsonify(ok=True), 201

    @app.post("/tx")
    def tx():
        ctx = context()
        runs[ctx.key] += 1
        ctx.conn.execute("INSERT INTO effects (key, worker) VALUES (%s, 'flask')", (ctx.key,))
        if flask.request.get_json().get("fail"):
            return flask.jsonify(error="after writing"), 500
        return flask.jsonify(written=True), 201
    app.seen = seen
    return app


def broken_classify(response):
    raise RuntimeError("classify is broken")


def post(client, path, key, body=None):
    headers = {"Idempotency-Key": key} if key else {}
    return client.post(path, json=body or {}, headers=headers)


def test_flask_replays_and_refuses(flask_app):
    client = flask_app.test_client()
    key = f"f-{uuid.uuid4()}"
    assert post(client, "/orders", None).status_code == 400
    first, again = post(client, "/orders", key, {"a": 1}), post(client, "/orders", key, {"a": 1})
    assert (first.status_code, again.status_code, again.headers["Idempotent-Replayed"]) == (201, 201, "true")
    assert again.data == first.data and again.headers["x-order"] == "o-1"
    assert post(client, "/orders", key, {"a": 2}).status_code == 422
    assert runs[key] == 1


def test_flask_response_larger_than_the_server_stores_fails_the_key_for_good(flask_app, admin):
    client = flask_app.test_client()
    key = f"f-{uuid.uuid4()}"
    first = post(client, "/large", key)
    assert key_row(admin, key, "flask.orders")[0] == "FAILED_FINAL"
    again = post(client, "/large", key)
    assert first.status_code == 500 and b"larger than the server stores" in first.data
    assert (again.status_code, again.headers["Idempotent-Replayed"], again.data) == (500, "true", first.data)
    assert runs[key] == 1


def test_flask_answers_410_once_the_stored_response_expired(flask_app, admin):
    client = flask_app.test_client()
    key = f"f-{uuid.uuid4()}"
    assert post(client, "/orders", key, {"a": 1}).status_code == 201
    expire_result(admin, key, "flask.orders")
    late = post(client, "/orders", key, {"a": 1})
    assert (late.status_code, late.headers["content-type"]) == (410, "application/problem+json")
    assert late.get_json()["idempotency_key"] == key
    assert runs[key] == 1


def test_flask_duplicates_run_once_and_get_retry_after(flask_app):
    key = f"f-{uuid.uuid4()}"
    flask_app.seen.clear()
    with ThreadPoolExecutor(8) as threads:
        answers = list(threads.map(lambda _: post(flask_app.test_client(), "/slow", key), range(8)))
    assert runs[key] == 1
    conflicts = [a for a in answers if a.status_code == 409]
    assert conflicts and sum(a.status_code == 201 for a in answers) == 8 - len(conflicts)
    busy = [s for s in flask_app.seen if s["outcome"] == "in_progress"]
    assert len(busy) == len(conflicts)
    for answer, info in zip(sorted(conflicts, key=lambda a: a.headers["retry-after"]),
                            sorted(busy, key=lambda i: i["retry_after"])):
        assert answer.headers["retry-after"] == str(max(1, math.ceil(info["retry_after"])))


def test_flask_waiting_duplicates_share_a_pool_of_3(flask_app):
    key = f"f-{uuid.uuid4()}"
    started = time.monotonic()
    with ThreadPoolExecutor(12) as threads:
        answers = list(threads.map(lambda _: post(flask_app.test_client(), "/waiting", key), range(12)))
    took = time.monotonic() - started
    assert [a.status_code for a in answers] == [201] * 12 and runs[key] == 1
    assert took < 0.5 + 2, f"{took:.2f}s: duplicates held the pool"


def test_flask_transaction_mode(flask_app, admin):
    client = flask_app.test_client()
    ok, failing = f"f-{uuid.uuid4()}", f"f-{uuid.uuid4()}"
    assert post(client, "/tx", ok).status_code == 201 and post(client, "/tx", ok).headers["Idempotent-Replayed"] == "true"
    assert post(client, "/tx", failing, {"fail": True}).status_code == 500
    assert effects(admin, ok) == ["flask"] and effects(admin, failing) == []
    assert key_row(admin, failing, "flask.tx") is None


def test_flask_a_key_sent_as_utf8_is_stored_as_those_characters_other_bytes_400(flask_app, admin):
    client = flask_app.test_client()
    key = f"ключ-{uuid.uuid4()}-✓"
    wire = key.encode().decode("latin-1")       # WSGI's environ: the bytes read as latin-1
    assert post(client, "/orders", wire).status_code == 201
    assert key_row(admin, key, "flask.orders")[0] == "COMPLETED"
    assert post(client, "/orders", wire).headers.get("Idempotent-Replayed") == "true"
    assert runs[key] == 1
    latin = post(client, "/orders", "caf\xe9")      # one byte 0xE9: not UTF-8
    assert latin.status_code == 400 and b"not UTF-8" in latin.data


def call_wsgi(app, key, body, **environ):
    """The app called as a WSGI server calls it, with a body of no stated
    length (chunked): its status and body."""
    import io
    captured = {}
    env = {"REQUEST_METHOD": "POST", "PATH_INFO": "/orders", "SERVER_NAME": "test", "SERVER_PORT": "80",
           "SERVER_PROTOCOL": "HTTP/1.1", "wsgi.url_scheme": "http", "wsgi.input": io.BytesIO(body),
           "wsgi.errors": io.StringIO(), "wsgi.multithread": True, "wsgi.multiprocess": False,
           "wsgi.run_once": False, "CONTENT_TYPE": "application/json", "HTTP_IDEMPOTENCY_KEY": key,
           "HTTP_TRANSFER_ENCODING": "chunked", **environ}
    chunks = app.wsgi_app(env, lambda status, headers, exc_info=None: captured.update(status=int(status[:3])))
    return captured["status"], b"".join(chunks)


def test_flask_a_chunked_body_is_read_to_its_end_where_the_server_ends_the_input(flask_app):
    key = f"f-{uuid.uuid4()}"
    status, body = call_wsgi(flask_app, key, b'{"item": "tea"}', **{"wsgi.input_terminated": True})
    assert (status, flask.json.loads(body)["echo"]) == (201, {"item": "tea"})
    status, _ = call_wsgi(flask_app, key, b'{"item": "coffee"}', **{"wsgi.input_terminated": True})
    assert status == 422, "another body under the same key is another request"
    assert runs[key] == 1


def test_flask_a_chunked_body_of_unknown_end_is_refused_with_411(flask_app):
    key = f"f-{uuid.uuid4()}"
    status, body = call_wsgi(flask_app, key, b'{"item": "tea"}')
    assert status == 411 and b"Content-Length" in body
    assert runs[key] == 0


def test_flask_a_body_with_a_nul_character_is_stored_and_replayed(flask_app):
    client = flask_app.test_client()
    key = f"f-{uuid.uuid4()}"
    first, again = post(client, "/nul", key), post(client, "/nul", key)
    assert (first.status_code, first.data) == (200, b"a\x00b")
    assert (again.headers.get("Idempotent-Replayed"), again.data) == ("true", b"a\x00b")
    assert runs[key] == 1


def test_flask_a_header_with_a_nul_character_is_stored_with_a_space(flask_app, admin):
    client = flask_app.test_client()
    key = f"f-{uuid.uuid4()}"
    first, again = post(client, "/nul-header", key), post(client, "/nul-header", key)
    assert (first.status_code, first.headers.get("x-note")) == (200, "a b")
    assert (again.headers.get("Idempotent-Replayed"), again.headers.get("x-note")) == ("true", "a b")
    assert runs[key] == 1
    assert key_row(admin, key, "flask.nul") == ("COMPLETED", 1)


@pytest.mark.parametrize("path", ["/classify-claim", "/classify-tx"])
def test_flask_a_classify_that_raises_records_by_default_and_is_logged(flask_app, admin, caplog, path):
    client = flask_app.test_client()
    key = f"f-{uuid.uuid4()}"
    first = post(client, path, key)
    assert first.status_code == 201
    assert key_row(admin, key, "flask.misclassified")[0] == "COMPLETED"
    again = post(client, path, key)
    assert (again.headers.get("Idempotent-Replayed"), again.data) == ("true", first.data)
    assert runs[key] == 1
    assert any("classify raised" in r.getMessage() and "classify is broken" in (r.exc_text or "")
               for r in caplog.records)


def test_flask_the_heartbeat_is_not_queued_behind_a_pool_whose_every_connection_is_taken(admin):
    # Through the pool, the beats waited for a connection past the lease:
    # the key was taken over and its work ran twice.
    key = f"f-{uuid.uuid4()}"
    with ConnectionPool(kwargs={"autocommit": True, "options": SETTINGS}, min_size=2, max_size=2) as small:
        app = flask.Flask("hold")
        Idempotency(app, pool=small, scope="flask.hold", paths=["/hold"], lease=1)

        @app.post("/hold")
        def hold():
            runs[context().key] += 1
            with small.connection(), small.connection():
                time.sleep(1.5)
                with connect(autocommit=True) as other:
                    outcome = other.execute("SELECT outcome::text FROM idempotency.idem_claim(%s, scope => 'flask.hold')",
                                            (key,)).fetchone()[0]
                time.sleep(1.0)
            return flask.jsonify(other=outcome), 201
        answer = post(app.test_client(), "/hold", key)
    assert answer.status_code == 201 and answer.get_json() == {"other": "in_progress"}, answer.data
    assert key_row(admin, key, "flask.hold") == ("COMPLETED", 1)
    assert runs[key] == 1


def test_flask_requests_after_the_server_closed_the_pools_connections_are_answered(admin):
    # A restart closes the pool's idle connections: each failed a request
    # with 500 (the claim was not tried again).
    with ConnectionPool(kwargs={"autocommit": True, "options": SETTINGS, "application_name": "idem-flask-closed"},
                        min_size=3, max_size=3) as closed_pool:
        closed_pool.wait()
        app = flask.Flask("closed")
        Idempotency(app, pool=closed_pool, scope="flask.closed", paths=["/closed"])

        @app.post("/closed")
        def closed():
            return flask.jsonify(ok=True), 201
        terminate_backends(admin, "idem-flask-closed")
        client = app.test_client()
        statuses = [post(client, "/closed", f"c-{uuid.uuid4()}").status_code for _ in range(5)]
    assert statuses == [201] * 5


def test_flask_a_record_waits_for_a_busy_pool_while_the_lease_lasts(admin, monkeypatch):
    # A record that gave up at its 10 s (here 0.5 s) while the pool was busy
    # left the key held until its lease ended, and the work ran again.
    monkeypatch.setattr("pg_idempotency._record.PATIENCE", 0.5)
    key = f"f-{uuid.uuid4()}"
    with ConnectionPool(kwargs={"autocommit": True, "options": SETTINGS}, min_size=1, max_size=1) as small:
        app = flask.Flask("busy")
        Idempotency(app, pool=small, scope="flask.busy", paths=["/busy"], lease=5)
        taken = threading.Event()

        def another_request():     # takes the pool's only connection for 1.5 s
            with small.connection():
                taken.set()
                time.sleep(1.5)

        @app.post("/busy")
        def busy():
            runs[context().key] += 1
            threading.Thread(target=another_request).start()
            taken.wait(10)
            return flask.jsonify(ok=True), 201
        answer = post(app.test_client(), "/busy", key)
    assert answer.status_code == 201, answer.data
    assert key_row(admin, key, "flask.busy") == ("COMPLETED", 1)
    assert runs[key] == 1


def test_flask_the_heartbeat_goes_on_while_a_busy_pool_delays_the_record(admin):
    # The heartbeat stopped before the record: while the record waited for
    # a busy pool the lease ended, and a duplicate took the key over and
    # ran the handler again.
    key = f"f-{uuid.uuid4()}"
    seen = {}
    with ConnectionPool(kwargs={"autocommit": True, "options": SETTINGS}, min_size=2, max_size=2) as small:
        app = flask.Flask("recording")
        Idempotency(app, pool=small, scope="flask.recording", paths=["/recording"], lease=1)
        taken = threading.Event()

        def another_request():     # holds both pool connections for 2.5 leases
            with small.connection(), small.connection():
                taken.set()
                time.sleep(2.0)
                with connect(autocommit=True) as other:
                    seen["other"] = other.execute(
                        "SELECT outcome::text FROM idempotency.idem_claim(%s, scope => 'flask.recording')",
                        (key,)).fetchone()[0]
                time.sleep(0.5)

        @app.post("/recording")
        def recording():
            runs[context().key] += 1
            threading.Thread(target=another_request).start()
            taken.wait(10)
            return flask.jsonify(ok=True), 201
        answer = post(app.test_client(), "/recording", key)
    assert answer.status_code == 201, answer.data
    assert seen == {"other": "in_progress"}
    assert key_row(admin, key, "flask.recording") == ("COMPLETED", 1)
    assert runs[key] == 1


def test_django(pool):
    django = pytest.importorskip("django", reason="python3-django is not installed")
    from django.conf import settings
    seen = []
    if not settings.configured:
        settings.configure(ROOT_URLCONF=__name__, ALLOWED_HOSTS=["testserver"], SECRET_KEY="test",
                           MIDDLEWARE=["pg_idempotency.django.IdempotencyMiddleware"],
                           IDEMPOTENCY=[{"pool": pool, "scope": "django.orders", "paths": ["/orders"], "lease": 2.5,
                                         "on_conflict": seen.append, "on_replay": seen.append},
                                        {"pool": pool, "scope": "django.slow", "paths": ["/slow"], "lease": 2.5}])
        django.setup()
    from django.test import Client
    key, slow = f"d-{uuid.uuid4()}", f"d-{uuid.uuid4()}"
    client = Client()

    def send(path, k, body):
        return Client().post(path, body, content_type="application/json", HTTP_IDEMPOTENCY_KEY=k)
    assert client.post("/orders", {}, content_type="application/json").status_code == 400
    first, again = send("/orders", key, {"a": 1}), send("/orders", key, {"a": 1})
    assert (first.status_code, again.status_code, again.headers["Idempotent-Replayed"]) == (201, 201, "true")
    assert again.content == first.content and again.headers["x-order"] == "o-1"
    assert send("/orders", key, {"a": 2}).status_code == 422
    with ThreadPoolExecutor(6) as threads:
        answers = list(threads.map(lambda _: send("/slow", slow, {}), range(6)))
    assert runs[slow] == 1
    conflicts = [a for a in answers if a.status_code == 409]
    assert conflicts and all(1 <= int(a.headers["retry-after"]) <= 3 for a in conflicts)
    assert [s["outcome"] for s in seen] == ["completed"]


def _django_orders(request):
    from django.http import JsonResponse
    key = request.idempotency.key
    runs[key] += 1
    response = JsonResponse({"order": runs[key]}, status=201)
    response["x-order"] = f"o-{runs[key]}"
    return response


def _django_slow(request):
    from django.http import JsonResponse
    runs[request.idempotency.key] += 1
    time.sleep(0.8)
    return JsonResponse({"ok": True}, status=201)


def __getattr__(name):
    # Django reads urlpatterns from this module (ROOT_URLCONF) once it is configured.
    if name == "urlpatterns":
        from django.urls import path
        return [path("orders", _django_orders), path("slow", _django_slow)]
    raise AttributeError(name)


def test_flask_transaction_mode_requests_after_the_server_closed_the_pools_connections_are_answered(admin):
    # A restart closes the pool's idle connections: the key's transaction
    # could not begin on them, and each request was answered 500 though
    # nothing of it had run.
    keys = [f"c-{uuid.uuid4()}" for _ in range(5)]
    with ConnectionPool(kwargs={"autocommit": True, "options": SETTINGS, "application_name": "idem-flask-closed-tx"},
                        min_size=3, max_size=3) as closed_pool:
        closed_pool.wait()
        app = flask.Flask("closed-tx")
        Idempotency(app, pool=closed_pool, scope="flask.closed-tx", paths=["/closed"], mode="transaction")

        @app.post("/closed")
        def closed():
            ctx = context()
            runs[ctx.key] += 1
            ctx.conn.execute("INSERT INTO effects (key, worker) VALUES (%s, 'flask-closed-tx')", (ctx.key,))
            return flask.jsonify(written=True), 201
        terminate_backends(admin, "idem-flask-closed-tx")
        client = app.test_client()
        first = [post(client, "/closed", key) for key in keys]
        again = [post(client, "/closed", key) for key in keys]
    assert [(a.status_code, a.headers.get("Idempotent-Replayed")) for a in first] == [(201, None)] * 5
    assert [(a.status_code, a.headers.get("Idempotent-Replayed")) for a in again] == [(201, "true")] * 5
    assert [runs[key] for key in keys] == [1] * 5
    assert [effects(admin, key) for key in keys] == [["flask-closed-tx"]] * 5
    assert [key_row(admin, key, "flask.closed-tx") for key in keys] == [("COMPLETED", 1)] * 5


def test_flask_transaction_mode_a_connection_lost_at_the_handlers_savepoint_is_tried_again(admin, monkeypatch):
    # The savepoint a final answer rolls back to is set before the handler
    # runs: lost there, nothing of the request has run, and the key's
    # transaction is tried again on a fresh connection (it was answered 500).
    key, name = f"c-{uuid.uuid4()}", "idem-flask-savepoint"
    execute, cut = psycopg.Connection.execute, []

    def cut_at_savepoint(self, query, *args, **kwargs):
        if not cut and str(query).startswith("SAVEPOINT"):
            # This connection's session only, ended before the statement
            # is sent (waits until it is gone).
            cut.append(admin.execute("SELECT pg_terminate_backend(%s, 30000)",
                                     (self.info.backend_pid,)).fetchone()[0])
        return execute(self, query, *args, **kwargs)
    monkeypatch.setattr(psycopg.Connection, "execute", cut_at_savepoint)
    with ConnectionPool(kwargs={"autocommit": True, "options": SETTINGS, "application_name": name},
                        min_size=2, max_size=2) as savepoint_pool:
        app = flask.Flask("savepoint")
        Idempotency(app, pool=savepoint_pool, scope=name, paths=["/savepoint"], mode="transaction")

        @app.post("/savepoint")
        def handler():
            ctx = context()
            runs[ctx.key] += 1
            ctx.conn.execute("INSERT INTO effects (key, worker) VALUES (%s, 'flask-savepoint')", (ctx.key,))
            return flask.jsonify(written=True), 201
        res = post(app.test_client(), "/savepoint", key)
    assert (cut, res.status_code) == ([True], 201), res.data
    assert runs[key] == 1 and effects(admin, key) == ["flask-savepoint"]
    assert key_row(admin, key, name) == ("COMPLETED", 1)


def test_flask_transaction_mode_a_connection_lost_after_the_handler_ran_is_not_tried_again(admin):
    # The handler's writes were lost with the key's transaction: a try on a
    # fresh connection would run it a second time within one request. The
    # request is answered 500, the key is left as if it never came, and the
    # client's retry runs the handler.
    key = f"c-{uuid.uuid4()}"
    with ConnectionPool(kwargs={"autocommit": True, "options": SETTINGS, "application_name": "idem-flask-cut-tx"},
                        min_size=2, max_size=2) as cut_pool:
        cut_pool.wait()     # both connections are open when the server ends them
        app = flask.Flask("cut-tx")
        Idempotency(app, pool=cut_pool, scope="flask.cut-tx", paths=["/cut"], mode="transaction")

        @app.post("/cut")
        def cut():
            ctx = context()
            runs[ctx.key] += 1
            ctx.conn.execute("INSERT INTO effects (key, worker) VALUES (%s, 'flask-cut-tx')", (ctx.key,))
            if runs[ctx.key] == 1:
                terminate_backends(admin, "idem-flask-cut-tx")
            return flask.jsonify(written=True), 201
        client = app.test_client()
        first = post(client, "/cut", key)
        assert (first.status_code, runs[key]) == (500, 1), first.data
        assert effects(admin, key) == [] and key_row(admin, key, "flask.cut-tx") is None
        again = post(client, "/cut", key)
    assert again.status_code == 201, again.data
    assert runs[key] == 2 and effects(admin, key) == ["flask-cut-tx"]
    assert key_row(admin, key, "flask.cut-tx") == ("COMPLETED", 1)
