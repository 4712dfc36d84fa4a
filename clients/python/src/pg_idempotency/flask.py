"""Flask integration of the Idempotency-Key middleware (Flask 2.2+):

    from pg_idempotency.flask import Idempotency, context
    Idempotency(app, conninfo="", scope="orders", paths=["/orders"])

    @app.post("/orders")
    def create_order():
        ctx = context()          # key, token, conn (transaction mode), lost, fence(conn)

Options: those of ``pg_idempotency.sync.SyncIdempotency``. Several
instances with other ``paths`` can cover other routes.
"""

from .wsgi import IdempotencyMiddleware


class Idempotency:
    def __init__(self, app=None, **options):
        self.options = options
        self.middleware = None
        if app is not None:
            self.init_app(app)

    def init_app(self, app):
        self.middleware = IdempotencyMiddleware(app.wsgi_app, **self.options)
        app.wsgi_app = self.middleware
        app.extensions.setdefault("pg_idempotency", []).append(self)

    def close(self):
        if self.middleware is not None:
            self.middleware.close()


def context():
    """The current request's idempotency context (None outside the middleware)."""
    from flask import request
    return request.environ.get("idempotency")
