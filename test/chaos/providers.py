"""How the chaos test's workers call the mock providers (mock_api.py): a
POST with the provider's idempotency key, retried with the same key when
the answer times out (the provider then replays what it did), as a client of
a real payment or mail API would."""

import http.client
import json
import socket
import time


class Provider:
    """One provider at http://127.0.0.1:PORT; log(ev, **fields) is the
    worker's log, written before and after each request."""

    def __init__(self, url, timeout, log, tries=3):
        host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
        self.host, self.port = host, int(port)
        self.timeout, self.log, self.tries = timeout, log, tries

    def post(self, path, idempotency_key, body, **fields):
        """Returns (response, None) or (None, error). A timeout is retried
        with the same key; an error answer is reported, not retried. fields
        (the job's key, the step...) go into every log line."""
        data = json.dumps(body)
        error = None
        for attempt in range(1, self.tries + 1):
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                conn.request("POST", path, body=data,
                             headers={"Idempotency-Key": idempotency_key,
                                      "Content-Type": "application/json"})
                resp = conn.getresponse()
                answer = resp.read()
                if resp.status in (200, 201):
                    replayed = resp.getheader("Idempotent-Replayed") == "true"
                    self.log("api", status=resp.status, replayed=replayed, attempt=attempt, **fields)
                    return json.loads(answer), None
                error = f"HTTP {resp.status}"
                self.log("api", status=resp.status, attempt=attempt, **fields)
                break  # an error answer: report it, no blind retry
            except (socket.timeout, TimeoutError):
                error = "timeout"
                self.log("api_timeout", attempt=attempt, **fields)
            except OSError as e:
                error = f"{type(e).__name__}: {e}"
                self.log("api", status=None, error=error, attempt=attempt, **fields)
                time.sleep(0.05)
            finally:
                conn.close()
        self.log("api_failed", error=error, **fields)
        return None, error
