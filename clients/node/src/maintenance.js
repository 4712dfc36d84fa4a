// The SQL edition (docs/managed-postgres.md) has no background workers:
// idempotency.idem_maintenance() does one pass of their sweeps (lease
// expiry, settling, purges). Where pg_cron is not available, a process
// that runs anyway calls it on an interval with startMaintenance. The
// pool's role needs EXECUTE on idem_maintenance (grant_admin, or a GRANT
// of that one function). Against the C++ extension the call is harmless:
// its workers have done the same.
import { MAX_TIMER_MS } from './options.js';

// Calls idem_maintenance() at once and then every intervalMs after the
// end of the previous pass; onPass(rows) hears each pass's (task, rows),
// onError(err) each failure (the next pass is still made). The timer never
// keeps the process alive. stop() ends it once a running pass is over.
export function startMaintenance(pool, { intervalMs = 5000, onPass, onError } = {}) {
  // Past a timer's longest delay Node fires at once: the passes would run
  // back to back.
  if (!(Number.isFinite(intervalMs) && intervalMs > 0 && intervalMs <= MAX_TIMER_MS)) {
    throw new RangeError(`intervalMs must be a number of milliseconds above 0, at most ${MAX_TIMER_MS}, not ${String(intervalMs)}`);
  }
  let stopped = false;
  let timer = null;
  let running = null;
  const report = onError ?? ((err) => process.emitWarning(`idem_maintenance failed: ${err.message}`));
  const pass = async () => {
    try {
      const { rows } = await pool.query(
        'SELECT task, rows::float8 AS rows FROM idempotency.idem_maintenance()');
      onPass?.(rows);
    } catch (err) {
      report(err);
    }
    if (!stopped) {
      timer = setTimeout(() => { running = pass(); }, intervalMs);
      timer.unref();
    }
  };
  running = pass();
  return {
    async stop() {
      stopped = true;
      clearTimeout(timer);
      await running;
    },
  };
}
