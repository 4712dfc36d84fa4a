"""Options as the client takes them, checked when given rather than in
every call that uses them."""

import math
import re

# The bounds the extension puts on what it is given (docs/keys.md, 22023)
# whatever its settings: a value past them would fail every request or
# claim. retry_in's (36,000 days) is errors.MAX_RETRY_IN, beside the check
# of an error's own retry_in. A lease (and a wait) is also at most
# idempotency.max_lease (1 day by default), which a superuser may raise up
# to MAX_LEASE: only the server checks that.
MAX_LEASE = 2147483.647             # seconds: the highest idempotency.max_lease
MAX_BATCH = 10000                   # outbox_claim's batch


def seconds(name, value, default, *, positive=False, most=MAX_LEASE):
    """A duration option in seconds: None keeps ``default``; anything but a
    number from 0 (from a microsecond when ``positive``) up to ``most`` is
    refused, saying so, where it would otherwise fail later (a heartbeat
    thread, every request)."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0 or (positive and value < 1e-6) or value > most:
        least = "1 µs" if positive else "0"
        raise ValueError(f"{name} must be a number of seconds from {least} to {most:,}, not {value!r}")
    return value


def count(name, value, least, most):
    """A whole-number option from ``least`` to ``most``."""
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise ValueError(f"{name} must be a whole number from {least} to {most}, not {value!r}")
    return value


# RFC 9110's token: the characters of a header's name.
_HTTP_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def header_name(name, value):
    """An HTTP header's name: no request carries another, and a replay
    could not send it."""
    if not isinstance(value, str) or not _HTTP_TOKEN.fullmatch(value):
        raise ValueError(f"{name} must be an HTTP header name, not {value!r}")
    return value


def methods(value):
    """The HTTP methods covered, as a set of upper-case names. A string is
    refused: its letters would be taken for methods, and no request would
    be covered."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, set, frozenset)) or not value \
            or not all(isinstance(m, str) and _HTTP_TOKEN.fullmatch(m) for m in value):
        raise ValueError(f"methods must be a list or tuple of HTTP method names, such as ('POST', 'PATCH'), "
                         f"not {value!r}")
    return {m.upper() for m in value}


def paths(value):
    """The path prefixes covered (None: every path). A string is refused, as
    for methods."""
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, set, frozenset)) \
            or not all(isinstance(p, str) and p for p in value):
        raise ValueError(f"paths must be a list or tuple of path prefixes, such as ('/orders',), not {value!r}")
    return tuple(value) or None


def flag(name, value):
    """A yes-or-no option: True or False, nothing taken for one."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, not {value!r}")
    return value


def function(name, value):
    """A function option (None where it has a default)."""
    if value is not None and not callable(value):
        raise ValueError(f"{name} must be a function, not {value!r}")
    return value


def pool_of(value):
    """A connection pool: something with ``connection()`` (psycopg_pool's)."""
    if value is not None and not callable(getattr(value, "connection", None)):
        raise ValueError(f"pool must be a psycopg_pool connection pool, not {value!r}")
    return value


def scope_name(value):
    """A scope idem_claim takes: 1 to 63 bytes of UTF-8 (another failed
    every request)."""
    try:
        size = len(value.encode("utf-8")) if isinstance(value, str) else 0
    except UnicodeEncodeError:
        size = 0
    if not 0 < size <= 63:
        raise ValueError(f"scope must be 1 to 63 bytes of UTF-8, not {value!r}")
    return value
