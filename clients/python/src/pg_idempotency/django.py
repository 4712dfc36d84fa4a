"""Django middleware for the Idempotency-Key header (Django 3.2+):

    MIDDLEWARE = [..., "pg_idempotency.django.IdempotencyMiddleware"]
    IDEMPOTENCY = {"conninfo": "dbname=shop user=app", "scope": "orders", "paths": ["/orders"]}

``IDEMPOTENCY`` holds the options of ``pg_idempotency.sync.SyncIdempotency``
(or a list of such dicts, one middleware each, tried in order by
``paths``). The view finds the context in ``request.idempotency``: key,
token, conn (transaction mode: a psycopg connection in the key's
transaction, not Django's), lost, fence(conn).
"""

from .http import Response
from .sync import SyncIdempotency


def _to_response(response):
    if getattr(response, "streaming", False):
        return Response(500, {"content-type": "text/plain"}, b"a streaming response cannot be recorded")
    headers = {name.lower(): value for name, value in response.items()}
    return Response(response.status_code, headers, response.content)


def _from_response(response):
    from django.http import HttpResponse
    out = HttpResponse(response.body, status=response.status)
    for name, value in response.headers.items():
        out[name] = ", ".join(value) if isinstance(value, list) else value
    return out


class IdempotencyMiddleware:
    def __init__(self, get_response):
        from django.conf import settings
        self.get_response = get_response
        configured = getattr(settings, "IDEMPOTENCY", {})
        self.instances = [SyncIdempotency(**options)
                          for options in (configured if isinstance(configured, list) else [configured])]

    def __call__(self, request):
        idempotency = next((i for i in self.instances if i.covers(request.method, request.path)), None)
        if idempotency is None:
            return self.get_response(request)
        body = request.body

        def call(context):
            request.idempotency = context
            return _to_response(self.get_response(request))
        key = request.headers.get(idempotency.header, "")
        return _from_response(idempotency.handle(request.method, request.path, key, body,
                                                 request.META.get("CONTENT_TYPE", ""), call))
