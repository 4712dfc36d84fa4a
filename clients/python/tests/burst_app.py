"""The app of test_burst.py, run by uvicorn: POST /pay behind the ASGI
middleware (claim mode, `wait` on) with a pool of BURST_POOL connections;
the handler appends its key to BURST_RUNS, then takes BURST_HANDLER
seconds."""

import asyncio
import os
import signal
import sys

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from psycopg_pool import AsyncConnectionPool

from pg_idempotency.asgi import IdempotencyMiddleware

HANDLER = float(os.environ.get("BURST_HANDLER", "1"))
pool = AsyncConnectionPool("", min_size=1, max_size=int(os.environ.get("BURST_POOL", "5")), open=False,
                           kwargs={"autocommit": True})
app = FastAPI()
app.add_middleware(IdempotencyMiddleware, pool=pool, scope=os.environ.get("BURST_SCOPE", "burst"),
                   wait=float(os.environ.get("BURST_WAIT", "5")), lease=float(os.environ.get("BURST_LEASE", "1.5")))


class Seen:
    """Counts the POSTs the server took in (a byte each in BURST_SEEN), outside
    the idempotency middleware (added last, so outermost)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST":
            with open(os.environ["BURST_SEEN"], "a") as out:
                out.write("r")
        await self.app(scope, receive, send)


app.add_middleware(Seen)


def dump_tasks(signum, frame):
    """SIGUSR1: where every thread and task is (the test asks when uvicorn does not stop)."""
    import faulthandler
    faulthandler.dump_traceback(all_threads=True)
    for task in asyncio.all_tasks(loop):
        task.print_stack(limit=8, file=sys.stderr)
    sys.stderr.flush()


@app.on_event("startup")
async def open_pool():
    global loop
    loop = asyncio.get_running_loop()
    signal.signal(signal.SIGUSR1, dump_tasks)
    await pool.open()


@app.on_event("shutdown")
async def close_pool():
    await pool.close()


@app.get("/healthz")
async def healthz():
    return {"ok": True}


@app.post("/pay")
async def pay(request: Request):
    key = request.state.idempotency.key
    with open(os.environ["BURST_RUNS"], "a") as runs:
        runs.write(key + "\n")
    await asyncio.sleep(HANDLER)
    return JSONResponse({"paid": key}, status_code=201)
