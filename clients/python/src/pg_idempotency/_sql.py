"""The SQL the client runs: every call into the extension, in one place.
Durations travel as seconds and become intervals here."""

import json
import re

from psycopg.types.json import Jsonb

# JSON's \u0000 escape, not preceded by an escaped backslash.
_NUL_ESCAPE = re.compile(r'(?<!\\)(?:\\\\)*\\u0000')


def _dumps(value):
    """JSON text the server takes, or ValueError: json.dumps would write NaN
    and Infinity (not JSON) and a lone surrogate (not UTF-8), which jsonb
    refuses, and a NUL character, which jsonb cannot hold."""
    text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    if _NUL_ESCAPE.search(text):
        raise ValueError("a string holds a NUL character (\\u0000), which jsonb cannot hold")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("a string holds a lone surrogate, which is not UTF-8") from exc
    return text


def jsonb_now(value):
    """``jsonb(value)`` dumped now: TypeError or ValueError here rather
    than when the statement runs."""
    if value is None:
        return None
    text = _dumps(value)
    return Jsonb(value, dumps=lambda _: text)


def jsonb(value):
    """A jsonb parameter (None stays NULL). Dumped when the statement runs:
    a value json cannot hold raises TypeError or ValueError then."""
    return None if value is None else Jsonb(value, dumps=_dumps)


# result_expired (extension 0.7.0): the answer came from the key's
# tombstone; the result is gone and the work is never run again. steps
# (0.7.0): the finished steps of a resumed claim. Both are read from the
# outcome as JSON, so that a database whose extension is not updated yet
# answers false and NULL instead of failing every call.
_OUTCOME = """outcome::text AS outcome, status::text AS status, token, attempt, result, error,
       extract(epoch FROM retry_after)::float8 AS retry_after, job_ref,
       coalesce((to_jsonb(o) ->> 'result_expired')::boolean, false) AS result_expired,
       nullif(to_jsonb(o) -> 'steps', 'null') AS steps"""

CLAIM = f"""SELECT {_OUTCOME}
  FROM idempotency.idem_claim(%(key)s, %(request)s, lease => make_interval(secs => %(lease)s),
                              scope => %(scope)s, wait => make_interval(secs => %(wait)s)) AS o"""

REGISTER = f"""SELECT {_OUTCOME}
  FROM idempotency.idem_register(%(key)s, %(request)s, job_ref => %(key)s, scope => %(scope)s) AS o"""

COMPLETE = f"""SELECT {_OUTCOME}
  FROM idempotency.idem_complete(%(key)s, %(token)s, %(result)s, scope => %(scope)s) AS o"""

FAIL = """SELECT idempotency.idem_fail(%(key)s, %(token)s, %(error)s, retryable => %(retryable)s,
                              retry_in => make_interval(secs => %(retry_in)s), scope => %(scope)s)::text AS status"""

# When the key may be claimed again (NULL once it failed for good).
NEXT_ATTEMPT = """SELECT extract(epoch FROM next_attempt_at - clock_timestamp())::float8 AS retry_after
  FROM idempotency.idem_get(%(key)s, %(scope)s)"""

HEARTBEAT = """SELECT idempotency.idem_heartbeat(%(key)s, %(token)s,
                                    extend => make_interval(secs => %(lease)s), scope => %(scope)s)"""
RELEASE = "SELECT idempotency.idem_release(%(key)s, %(token)s, scope => %(scope)s)"
ASSERT_OWNER = "SELECT idempotency.idem_assert_owner(%(key)s, %(token)s, scope => %(scope)s)"
# Before a step's work: the key must still be the claim's, and the step as
# recorded when it was (in a transaction of the caller's, or since).
STEP_BEGIN = ("SELECT (idempotency.idem_get(%(key)s, %(scope)s)).steps -> %(step)s"
              "  FROM (SELECT idempotency.idem_assert_owner(%(key)s, %(token)s, scope => %(scope)s)) owner")
STEP = "SELECT idempotency.idem_step(%(key)s, %(token)s, %(step)s, %(result)s, scope => %(scope)s)"

ENQUEUE = """SELECT idempotency.outbox_enqueue(%(topic)s, %(payload)s, key => %(key)s, headers => %(headers)s,
                                   dedup_key => %(dedup_key)s, deliver_at => %(deliver_at)s) AS id"""
OUTBOX_CLAIM = """SELECT id, topic, key, payload, headers, dedup_key, attempt
  FROM idempotency.outbox_claim(%(relay)s, batch => %(batch)s, lease => make_interval(secs => %(lease)s),
                                topics => %(topics)s)"""
OUTBOX_ACK = "SELECT idempotency.outbox_ack(ARRAY[%(id)s]::bigint[])"
OUTBOX_RELEASE = "SELECT idempotency.outbox_release(ARRAY[%(id)s]::bigint[], %(relay)s)"
OUTBOX_NACK = """SELECT idempotency.outbox_nack(%(id)s, %(error)s, retryable => %(retryable)s,
                                   retry_in => make_interval(secs => %(retry_in)s))::text AS state"""
LISTEN = "LISTEN idempotency_outbox"

# One pass of the background workers' sweeps (rows: what each task changed).
MAINTENANCE = "SELECT task, rows FROM idempotency.idem_maintenance()"
