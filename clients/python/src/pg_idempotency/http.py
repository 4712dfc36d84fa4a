"""The Idempotency-Key header, independent of any framework: fingerprints,
the classification of responses, and responses as they are stored and
replayed. A stored response is the jsonb ``{status, headers, body,
encoding?}`` (body: the text, or its base64 with encoding "base64" when it
is not UTF-8 or holds a NUL character); the Node.js client stores the same."""

import base64
import hashlib
import json
import math
from dataclasses import dataclass, field

from . import _canonical
from ._options import function
from .errors import log

# Headers that describe one transfer, not the response: never replayed.
TRANSIENT_HEADERS = {"connection", "content-length", "date", "keep-alive", "transfer-encoding",
                     "idempotent-replayed"}


@dataclass
class Response:
    status: int
    headers: dict = field(default_factory=dict)    # lower-case name: str or list of str
    body: bytes = b""

    def __post_init__(self):
        self.headers = _without_nul(self.headers)


def _without_nul(headers):
    """The headers, storable: jsonb cannot hold U+0000, and a response that
    cannot be recorded leaves its key held (its handler ran again at the
    lease's end). A NUL in a value becomes a space, as RFC 9110 (5.5) lets a
    recipient do; a name that holds one, which no server sends, is dropped.
    The response sent is the one recorded."""
    def clean(value):
        return value.replace("\x00", " ") if isinstance(value, str) else value
    return {name: [clean(v) for v in value] if isinstance(value, list) else clean(value)
            for name, value in headers.items() if "\x00" not in name}


# A response the server cannot store (idempotency.max_value_bytes) fails
# its key for good with this message: left held, the key would run its
# handler again at each lease's end.
TOO_LARGE = "the response is larger than the server stores (idempotency.max_value_bytes)"

def json_response(status, value, headers=None):
    return Response(status, {"content-type": "application/json", **(headers or {})},
                    json.dumps(value, separators=(",", ":")).encode())


def problem(status, title, detail, headers=None):
    """An RFC 9457 problem document."""
    return Response(status, {"content-type": "application/problem+json", **(headers or {})},
                    json.dumps({"title": title, "status": status, "detail": detail}).encode())


def response_builders(completed_response, failed_response, expired_response):
    """A middleware's response builders, each checked to be a function; None
    keeps the default (for expired_response: expired_problem(key), a 410)."""
    return (function("completed_response", completed_response) or (lambda result: json_response(200, result)),
            function("failed_response", failed_response) or (lambda error: problem(500, "Request failed", error)),
            function("expired_response", expired_response))


def header_text(value):
    """A header's value as the UTF-8 text its bytes are, so that a key is the
    same characters a worker, or the Go client, would use for it; None when
    they are not UTF-8. Takes the bytes (ASGI) or the latin-1 text of WSGI's
    environ."""
    if isinstance(value, str):
        try:
            value = value.encode("latin-1")
        except UnicodeEncodeError:
            return value            # already text beyond latin-1: not bytes read one by one
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return None


NOT_UTF8 = ("Idempotency-Key is not UTF-8", "A key is UTF-8 text.")


def unrecorded(key, exc):
    """The answer to a response that could not be recorded (the key stays
    held until its lease ends), logged with the database's error."""
    log.error("pg_idempotency: key %r: the response could not be recorded: %s", key, exc)
    return problem(500, "Internal error", "The response could not be recorded.")


def body_digest(body, content_type=""):
    """SHA-256 of the body; a JSON body in canonical form (keys sorted, no
    spacing, numbers as JavaScript writes them: _canonical), so that two
    encodings of one document are the same request, here and in the Node
    and Go clients."""
    if body and "json" in (content_type or ""):
        try:
            text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
            body = _canonical.dumps(_canonical.parse(text)).encode()
        except ValueError:
            pass
    return hashlib.sha256(body or b"").hexdigest()


def default_fingerprint(method, path, body, content_type):
    return {"method": method, "path": path, "body": body_digest(body, content_type)}


def default_classify(response):
    """'complete' (store and replay), 'final' (store as a final failure,
    replayed too) or 'retryable' (not stored: the next request runs again)."""
    status = response.status
    if status >= 500 or status in (408, 425, 429):
        return "retryable"
    return "final" if status >= 400 else "complete"


def encode_response(response):
    headers = {}
    for name, value in response.headers.items():
        if name.lower() not in TRANSIENT_HEADERS:
            headers[name.lower()] = value
    # Stored as text when it is UTF-8 without NUL (which jsonb cannot hold).
    try:
        text = response.body.decode("utf-8")
        if "\x00" not in text:
            return {"status": response.status, "headers": headers, "body": text}
    except UnicodeDecodeError:
        pass
    return {"status": response.status, "headers": headers,
            "body": base64.b64encode(response.body).decode(), "encoding": "base64"}


def is_stored_response(value):
    return (isinstance(value, dict) and isinstance(value.get("status"), int)
            and isinstance(value.get("body"), str) and isinstance(value.get("headers"), dict))


def decode_response(stored):
    body = stored["body"]
    raw = base64.b64decode(body) if stored.get("encoding") == "base64" else body.encode()
    return Response(stored["status"], dict(stored["headers"]), raw)


def stored_failure(error):
    """The response a key failed by the middleware keeps in its error."""
    try:
        value = json.loads(error or "")
    except ValueError:
        return None
    return value if is_stored_response(value) else None


def expired_problem(key):
    """410 Gone: the request with ``key`` was processed, but its stored
    response has passed its retention and only the key's tombstone is left:
    an RFC 9457 problem document with the key as a member of its own."""
    return Response(410, {"content-type": "application/problem+json"}, json.dumps({
        "title": "Idempotent response expired",
        "status": 410,
        "detail": f'The request with Idempotency-Key "{key}" was already processed; '
                  "its stored response has expired and cannot be replayed.",
        "idempotency_key": key,
    }).encode())


def retry_after_header(seconds):
    """Retry-After for a claim's ``retry_after``: whole seconds rounded up, at least 1."""
    return str(max(1, math.ceil(seconds or 0)))


def answer(row, completed_response, failed_response, replay_header, key=None, expired_response=None):
    """The HTTP answer to a claim that did not grant the key (every
    middleware's): a replay, 410 when only the key's tombstone is left (the
    handler never runs again), 422, or 409 with Retry-After."""
    outcome = row["outcome"]
    if row.get("result_expired") and outcome in ("completed", "failed"):
        return (expired_response or expired_problem)(key)

    def replay(response):
        return Response(response.status, {**response.headers, replay_header: "true"}, response.body)
    if outcome == "completed":
        result = row["result"]
        return replay(decode_response(result) if is_stored_response(result) else completed_response(result))
    if outcome == "failed":
        stored = stored_failure(row["error"])
        return replay(decode_response(stored) if stored else failed_response(row["error"]))
    if outcome == "mismatch":
        return problem(422, "Idempotency-Key reused",
                       "This Idempotency-Key was already used with a different request.")
    return problem(409, "Request in progress",
                   "A request with this Idempotency-Key is being processed; retry later.",
                   {"retry-after": retry_after_header(row["retry_after"])})
