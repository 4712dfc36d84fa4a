"""One duplicate that waits, through the pooler, for a key another session
holds: ``claim(conn, key, wait=...)`` (or ``aclaim`` with "async"), on a
connection of its own. Arguments: the conninfo, the key, "sync" or
"async", the wait in seconds. Prints the claim's answer, followed by
"-ran" when this duplicate ran the work itself."""

import asyncio
import sys

import psycopg

import pg_idempotency as idem

conninfo, key, mode, wait = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])


def answer(job):
    return job.outcome + ("-ran" if job.claimed else "")


def sync_wait():
    with psycopg.connect(conninfo, prepare_threshold=None) as conn:
        return answer(idem.run_once(conn, key, lambda job: "ran", wait=wait))


async def async_wait():
    async with await psycopg.AsyncConnection.connect(conninfo, prepare_threshold=None) as conn:
        async def work(job):
            return "ran"
        return answer(await idem.arun_once(conn, key, work, wait=wait))


print(sync_wait() if mode == "sync" else asyncio.run(async_wait()))
