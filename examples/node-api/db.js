// One connection pool per process. Connection settings come from the
// standard libpq environment (PGHOST, PGPORT, PGDATABASE, PGUSER, ...),
// which node-postgres reads itself.
import pg from 'pg';

export const pool = new pg.Pool({
  max: Number(process.env.PG_POOL_SIZE ?? 10),
  application_name: process.env.APP_NAME ?? 'payments',
});

// A pool error is a dropped idle connection; the pool replaces it.
pool.on('error', (err) => console.error('idle connection error:', err.message));

// Runs fn(client) inside BEGIN ... COMMIT on one connection; rolls back and
// rethrows on any error.
export async function transaction(fn) {
  const client = await pool.connect();
  try {
    await client.query('BEGIN');
    const value = await fn(client);
    await client.query('COMMIT');
    return value;
  } catch (err) {
    await client.query('ROLLBACK').catch(() => {});
    throw err;
  } finally {
    client.release();
  }
}
