"""Finding 1 under a real server: uvicorn (Debian's), the ASGI middleware in
claim mode with `wait` on and a pool of at most 5 connections, 200
concurrent identical POSTs; then a SIGTERM during a burst. Prints the
measured figures."""

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import pytest

from conftest import wait_for

HERE = Path(__file__).resolve().parent
HANDLER, WAIT, POOL, LEASE = 1.0, 5.0, 5, 5.0


class Server:
    def __init__(self, tmp_path, scope, handler=HANDLER, wait=WAIT):
        self.socket = str(tmp_path / "api.sock")
        self.runs, self.seen = tmp_path / "runs.txt", tmp_path / "seen.txt"
        self.runs.write_text("")
        self.seen.write_text("")
        self.log = open(tmp_path / "uvicorn.log", "w")
        env = {**os.environ, "BURST_RUNS": str(self.runs), "BURST_SEEN": str(self.seen), "BURST_HANDLER": str(handler), "BURST_WAIT": str(wait),
               "BURST_POOL": str(POOL), "BURST_LEASE": str(LEASE), "BURST_SCOPE": scope}
        self.process = subprocess.Popen([sys.executable, "-m", "uvicorn", "burst_app:app", "--uds", self.socket,
                                         "--log-level", "info", "--no-access-log", "--backlog", "1024"],
                                        cwd=HERE, env=env, stdout=self.log, stderr=self.log)

        def up():
            try:
                with httpx.Client(transport=httpx.HTTPTransport(uds=self.socket)) as c:
                    return c.get("http://burst/healthz").status_code == 200
            except httpx.TransportError:
                return False
        wait_for("uvicorn", up, 30)

    def ran(self):
        return self.runs.read_text().split()

    def logged(self):
        self.log.flush()
        return Path(self.log.name).read_text()[-6000:]

    def taken_in(self):
        return len(self.seen.read_text())

    def stop(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.log.close()


@pytest.fixture
def server(tmp_path, request):
    s = Server(tmp_path, f"burst-{uuid.uuid4()}", *getattr(request, "param", (HANDLER, WAIT)))
    yield s
    s.stop()


class Answer:
    """An HTTP/1.1 response read off the socket: status_code, headers (lower-case), body."""

    def __init__(self, raw):
        head, _, self.body = raw.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.status_code = int(lines[0].split()[1])
        self.headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}


async def burst(socket, keys, copies):
    """Sends `copies` POSTs of each key at once, each on a connection of its
    own (a plain HTTP/1.1 client: httpx's own cost for 200 connections would
    be measured too); returns (key, Answer or the error, seconds from the
    request written to its answer read) per request."""
    body = b'{"amount": 5}'

    async def one(key):
        try:
            reader, writer = await asyncio.open_unix_connection(socket)
        except OSError as exc:
            return key, exc, 0.0
        request = (f"POST /pay HTTP/1.1\r\nhost: burst\r\nidempotency-key: {key}\r\n"
                   f"content-type: application/json\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
                   ).encode() + body
        try:
            writer.write(request)
            await writer.drain()
            started = time.monotonic()
            raw = await asyncio.wait_for(reader.read(), 60)
            took = time.monotonic() - started
            return key, (Answer(raw) if raw else ConnectionError("closed without an answer")), took
        except (OSError, asyncio.TimeoutError) as exc:
            return key, exc, 0.0
        finally:
            writer.close()
    return await asyncio.gather(*(one(key) for _ in range(copies) for key in keys))


def is_owner(answer):
    return isinstance(answer, Answer) and answer.status_code == 201 and \
        answer.headers.get("idempotent-replayed") != "true"


def figures(label, times):
    times = sorted(times)
    return f"{label}: n={len(times)} max={times[-1]:.2f}s median={times[len(times) // 2]:.2f}s" if times else f"{label}: n=0"


def test_200_identical_posts_with_wait_and_a_pool_of_5(server, admin, capsys):
    key = f"burst-{uuid.uuid4()}"
    answers = asyncio.run(burst(server.socket, [key], 200))
    owners = [t for _, a, t in answers if is_owner(a)]
    replays = [t for _, a, t in answers if isinstance(a, Answer) and a.status_code == 201 and not is_owner(a)]
    conflicts = [t for _, a, t in answers if isinstance(a, Answer) and a.status_code == 409]
    others = [a for _, a, _ in answers if not (isinstance(a, Answer) and a.status_code in (201, 409))]
    with capsys.disabled():
        print(f"\n[burst] 200 POSTs, handler {HANDLER}s, wait {WAIT}s, pool {POOL}: "
              f"{figures('owner', owners)}; {figures('replays', replays)}; {figures('409s', conflicts)}; other {len(others)}")
    assert server.ran() == [key], "the handler ran once"
    assert len(owners) == 1 and not others, [repr(a) for a in others[:3]]
    # Starved behind the duplicates' waits, the owner would answer after
    # WAIT at least: half of it leaves room for a loaded machine.
    assert owners[0] <= HANDLER + WAIT / 2, f"the owner answered in {owners[0]:.2f}s"
    assert max(replays + conflicts) <= WAIT + 1, f"a duplicate took {max(replays + conflicts):.2f}s"
    assert len(replays) + len(conflicts) == 199


SHORT_WAIT, LONG_HANDLER = 0.5, 2.0


@pytest.mark.parametrize("server", [(LONG_HANDLER, SHORT_WAIT)], indirect=True)
def test_200_identical_posts_with_a_wait_shorter_than_the_handler(server, admin, capsys):
    key = f"burst-{uuid.uuid4()}"
    answers = asyncio.run(burst(server.socket, [key], 200))
    owners = [t for _, a, t in answers if is_owner(a)]
    conflicts = [(a, t) for _, a, t in answers if isinstance(a, Answer) and a.status_code == 409]
    replays = [t for _, a, t in answers if isinstance(a, Answer) and a.status_code == 201 and not is_owner(a)]
    retry_after = sorted({a.headers.get("retry-after") for a, _ in conflicts})
    with capsys.disabled():
        print(f"\n[burst] 200 POSTs, handler {LONG_HANDLER}s, wait {SHORT_WAIT}s, pool {POOL}: "
              f"{figures('owner', owners)}; {figures('409s', [t for _, t in conflicts])}; "
              f"{figures('replays', replays)}; Retry-After values {retry_after}")
    assert server.ran() == [key] and len(owners) == 1
    # Holding the pool while they waited, the 199 duplicates would take turns
    # on its 5 connections (about 20 s) and the owner's complete behind them:
    # the bounds sit far below that, with room for a loaded machine (409s at
    # 1.57 s and the owner at 2.92 s, measured while three suites shared two
    # cores).
    assert owners[0] <= 2 * LONG_HANDLER, f"the owner answered in {owners[0]:.2f}s"
    assert len(conflicts) + len(replays) == 199
    assert max([t for _, t in conflicts] + replays) <= LONG_HANDLER + 1
    assert conflicts and all(1 <= int(a.headers["retry-after"]) <= LEASE for a, _ in conflicts)


TERM_HANDLER = 2.0


@pytest.mark.parametrize("server", [(TERM_HANDLER, WAIT)], indirect=True)
def test_sigterm_during_a_burst(server, admin, capsys):
    keys = [f"term-{uuid.uuid4()}" for _ in range(10)]

    async def scenario():
        sent = asyncio.create_task(burst(server.socket, keys, 20))
        loop = asyncio.get_running_loop()
        # Every key's handler is running and most duplicates are waiting: then the signal.
        while (len(server.ran()) < len(keys) or server.taken_in() < 180) and not sent.done():
            await asyncio.sleep(0.02)
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        try:
            code = await loop.run_in_executor(None, lambda: server.process.wait(TERM_HANDLER + WAIT + 10))
        except subprocess.TimeoutExpired:
            server.process.send_signal(signal.SIGUSR1)     # its tasks into the log
            await asyncio.sleep(1)
            raise AssertionError("uvicorn did not stop; its tasks:\n" + server.logged())
        exited = time.monotonic() - signalled
        return await sent, code, exited
    answers, code, exited = asyncio.run(scenario())
    # Every request in flight ends with its key's handler (its duplicates at once
    # after), then uvicorn closes the lifespan and the pool: 4 s for all that
    # on a busy machine (the old client never stopped).
    grace = TERM_HANDLER + 4
    answered = [t for _, a, t in answers if isinstance(a, Answer)]
    statuses = sorted({a.status_code for _, a, _ in answers if isinstance(a, Answer)})
    rows = admin.execute("SELECT status::text, count(*) FROM idempotency.idempotency_keys WHERE key = ANY(%s) "
                         "GROUP BY 1", (keys,)).fetchall()
    with capsys.disabled():
        print(f"\n[burst] SIGTERM during 10 keys x 20 POSTs (handler {TERM_HANDLER}s, {server.taken_in()} taken in): uvicorn exited {exited:.2f}s after it (bound {grace}s), "
              f"status {code}; {figures('answered', answered)} statuses {statuses}; "
              f"not answered (refused at shutdown) {len(answers) - len(answered)}; keys {dict(rows)}")
    assert exited <= grace, f"uvicorn took {exited:.2f}s to stop"
    assert sorted(server.ran()) == sorted(keys), "each handler ran once"
    assert dict(rows) == {"COMPLETED": len(keys)}, "no key left PROCESSING"
    assert statuses and set(statuses) <= {201, 409}
