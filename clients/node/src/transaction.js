// A connection of the pool held for a while (a transaction): a connection
// lost meanwhile fails the statement in flight, and the client's own
// 'error' event is heard here, since pg.Pool listens only on idle clients
// (unheard, it would end the process). release() destroys a broken client
// instead of pooling it again.
export async function checkOut(pool) {
  const client = await pool.connect();
  let lost = null;
  const onError = (err) => { lost = err; };
  client.on('error', onError);
  return {
    client,
    release: () => {
      client.off('error', onError);
      client.release(lost ?? undefined);
    },
  };
}

// Runs fn(client) between BEGIN and COMMIT on one connection of the pool;
// rolls back and rethrows on any error.
export async function withTransaction(pool, fn) {
  const { client, release } = await checkOut(pool);
  try {
    await client.query('BEGIN');
    const value = await fn(client);
    await client.query('COMMIT');
    return value;
  } catch (err) {
    await client.query('ROLLBACK').catch(() => {});
    throw err;
  } finally {
    release();
  }
}
