// What the API and the worker share: the database pool (PG* environment),
// the kind of operation the keys name, and the outbox topic of the jobs.
import pg from 'pg';

export const SCOPE = 'payments';
export const TOPIC = 'payments.charge';

export function newPool(name) {
  const pool = new pg.Pool({ max: Number(process.env.PG_POOL_SIZE ?? 10), application_name: name });
  pool.on('error', (err) => console.error('idle connection error:', err.message));   // the pool replaces it
  return pool;
}
