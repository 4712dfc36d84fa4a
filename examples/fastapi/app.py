"""A ledger API on FastAPI: POST /transfers moves money between two
accounts, with an Idempotency-Key header. The Python client's ASGI
middleware, in transaction mode, claims the key, runs the handler on the
key's own connection (request.state.idempotency.conn) and stores the
response in the same transaction as the transfer: a retry gets the stored
response, a crash before the commit leaves neither the transfer nor the key,
and concurrent duplicates run the transfer once.

  201  the transfer, stored and replayed to every retry (Idempotent-Replayed)
  402  insufficient funds, 404 an unknown account: final, replayed, nothing moved
  409  the same key in progress (Retry-After); 422 the key with another body
  400  no Idempotency-Key header

    uvicorn app:app        (the database: the PG* environment, or DATABASE_URL)
"""
import os

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from pg_idempotency.asgi import IdempotencyMiddleware

app = FastAPI(title="ledger")
app.add_middleware(IdempotencyMiddleware, conninfo=os.environ.get("DATABASE_URL", ""),
                   scope="ledger.transfer", mode="transaction", paths=["/transfers"])


class Transfer(BaseModel):
    source: str = Field(min_length=1, max_length=64)
    target: str = Field(min_length=1, max_length=64)
    amount: int = Field(gt=0, description="cents")
    memo: str = ""


def problem(status, title, detail):
    return JSONResponse({"title": title, "status": status, "detail": detail}, status_code=status,
                        media_type="application/problem+json")


@app.post("/transfers", status_code=201)
async def transfer(body: Transfer, request: Request):
    idempotency = request.state.idempotency
    conn = idempotency.conn
    # Both rows locked in one order: two opposite transfers cannot deadlock.
    cur = await conn.execute("SELECT id, balance FROM accounts WHERE id IN (%s, %s) ORDER BY id FOR UPDATE",
                             (body.source, body.target))
    balances = dict(await cur.fetchall())
    if body.source not in balances or body.target not in balances:
        return problem(404, "Unknown account", f"No account {body.source!r} or {body.target!r}.")
    if balances[body.source] < body.amount:
        return problem(402, "Insufficient funds", f"{body.source} has {balances[body.source]}.")
    await conn.execute("UPDATE accounts SET balance = balance - %s WHERE id = %s", (body.amount, body.source))
    await conn.execute("UPDATE accounts SET balance = balance + %s WHERE id = %s", (body.amount, body.target))
    cur = await conn.execute("INSERT INTO transfers (idempotency_key, source, target, amount) "
                             "VALUES (%s, %s, %s, %s) RETURNING id", (idempotency.key, body.source, body.target, body.amount))
    transfer_id = (await cur.fetchone())[0]
    if body.memo == "crash" and os.environ.get("LEDGER_FAULTS"):
        os._exit(3)   # the check's fault: the process dies before the commit
    return {"transfer_id": transfer_id, "source": body.source, "target": body.target, "amount": body.amount,
            "source_balance": balances[body.source] - body.amount}


@app.get("/healthz")
async def healthz():
    return {"ok": True}
