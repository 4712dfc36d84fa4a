// One pool per server process (Next.js may load a route's module more than
// once in development: the pool is kept on globalThis). The connection
// comes from the PG* environment; the role needs grant_application only.
import pg from 'pg';

export const pool = globalThis.orderPool ??= new pg.Pool({ max: Number(process.env.POOL_MAX ?? 5) });
