// The Node client's outbox Consumer through a pooler in transaction mode,
// on a pg.Pool whose connections reach the server through PgBouncer while
// another application shares its pool. Run from a copy of clients/node
// with its node_modules; argument: the connection string. Prints one line
// per check, "ok ..." or "not ok ...", and exits 1 on any failure.
import pg from 'pg';
import { Consumer } from './src/index.js';

const connectionString = process.argv[2];
const pool = new pg.Pool({ connectionString, max: 3 });
await pool.query(`SELECT count(idempotency.outbox_enqueue('node.events', jsonb_build_object('n', n)))
                    FROM generate_series(1, 30) n`);
const handled = [];
const errors = [];
let consumer;
const all = new Promise((resolve) => {
  consumer = new Consumer(pool, {
    topics: ['node.events'], name: 'node-consumer', pollInterval: 0.05,
    onError: (err) => errors.push(String(err)),
  }, async (event) => {
    handled.push(event.id);
    if (handled.length >= 30) resolve();
  });
});
const timeout = new Promise((resolve) => setTimeout(resolve, 60000));
await Promise.race([all, timeout]);

// While the consumer runs: two transactions at once take both server
// backends of the pool; neither may be listening for the consumer.
const probe = new pg.Pool({ connectionString, max: 2 });
async function backendState() {
  const client = await probe.connect();
  try {
    await client.query('BEGIN');
    const { rows } = await client.query(`SELECT pg_backend_pid() AS pid,
        (SELECT count(*) FROM pg_listening_channels())::int AS channels`);
    await client.query('SELECT pg_sleep(0.5)');
    await client.query('COMMIT');
    return rows[0];
  } finally {
    client.release();
  }
}
const channels = new Map();
for (let i = 0; i < 20 && channels.size < 2; i++) {
  for (const row of await Promise.all([backendState(), backendState()])) channels.set(row.pid, row.channels);
}
await consumer.stop();
await probe.end();
await pool.end();

let failed = false;
function check(ok, what) {
  console.log(`${ok ? 'ok' : 'not ok'} ${what}`);
  failed ||= !ok;
}
check(handled.length === 30 && new Set(handled).size === 30,
  `node: the Consumer handled 30 events, each once (${new Set(handled).size} distinct)`);
check(errors.length === 0, `node: the Consumer reported no error ${errors.slice(0, 1)}`);
check(channels.size === 2 && [...channels.values()].every((n) => n === 0),
  `node: neither server backend of the pool listens for the Consumer (${JSON.stringify([...channels])})`);
process.exit(failed ? 1 : 0);
