"""WSGI middleware for the Idempotency-Key header (Flask, any WSGI app):
the behaviour of the ASGI middleware, modes 'claim' and 'transaction'.

    app.wsgi_app = IdempotencyMiddleware(app.wsgi_app, conninfo="dbname=shop", scope="orders")

The handler finds the context (key, token, conn in transaction mode...) in
``environ['idempotency']``.
"""

import io
from http import HTTPStatus

from .http import Response, problem
from .sync import SyncIdempotency


def _reason(status):
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def _call_app(app, environ):
    """Runs a WSGI app; returns its whole Response."""
    captured = {}
    chunks = []

    def start_response(status, headers, exc_info=None):
        captured["status"] = int(status.split(" ", 1)[0])
        captured["headers"] = headers
        return chunks.append
    result = app(environ, start_response)
    try:
        for chunk in result:
            chunks.append(chunk)
    finally:
        if hasattr(result, "close"):
            result.close()
    headers = {}
    for name, value in captured.get("headers", []):
        name = name.lower()
        old = headers.get(name)
        headers[name] = value if old is None else (old if isinstance(old, list) else [old]) + [value]
    return Response(captured.get("status", 500), headers, b"".join(chunks))


def _read_body(environ):
    """The request's body, or None when its length is unknown: a chunked
    body (no Content-Length) is read to its end only where the server says
    the input ends there (wsgi.input_terminated); elsewhere reading past
    CONTENT_LENGTH may block, and a body taken as empty would give the
    request another one's fingerprint."""
    length = environ.get("CONTENT_LENGTH") or ""
    if length.strip():
        try:
            length = int(length)
        except ValueError:
            return None
        return environ["wsgi.input"].read(length) if length > 0 else b""
    if environ.get("wsgi.input_terminated"):
        return environ["wsgi.input"].read()
    if "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower():
        return None
    return b""


LENGTH_REQUIRED = ("Length required",
                   "The body's length is unknown (chunked, and this server does not end the input): "
                   "send it with a Content-Length.")


class IdempotencyMiddleware:
    """``IdempotencyMiddleware(wsgi_app, **options)``, the options of
    ``pg_idempotency.sync.SyncIdempotency``."""

    def __init__(self, app, **options):
        self.app = app
        self.idempotency = SyncIdempotency(**options)
        self.environ_key = "HTTP_" + self.idempotency.header.upper().replace("-", "_")

    def __call__(self, environ, start_response):
        method, path = environ.get("REQUEST_METHOD", "GET"), environ.get("PATH_INFO", "")
        if not self.idempotency.covers(method, path):
            return self.app(environ, start_response)
        body = _read_body(environ)
        if body is None:
            return self._send(problem(411, *LENGTH_REQUIRED), start_response)
        environ["wsgi.input"] = io.BytesIO(body)

        def call(context):
            environ["idempotency"] = context
            return _call_app(self.app, environ)
        response = self.idempotency.handle(method, path, environ.get(self.environ_key, ""), body,
                                           environ.get("CONTENT_TYPE", ""), call)
        return self._send(response, start_response)

    @staticmethod
    def _send(response, start_response):
        headers = [("Content-Length", str(len(response.body)))]
        for name, value in response.headers.items():
            if name.lower() == "content-length":
                continue
            for one in value if isinstance(value, list) else [value]:
                headers.append((name, str(one)))
        start_response(f"{response.status} {_reason(response.status)}", headers)
        return [response.body]

    def close(self):
        self.idempotency.close()
