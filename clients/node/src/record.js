// Recording how work ended (complete, fail) outlives a brief loss of the
// database (a restart, a dropped connection): a record lost that way would
// leave the key held until its lease ends, and its work would run again.
// A try that fails without an answer from the server is made again, 100 ms
// later and then twice as long each time up to 1 s, for at most 10 s, or
// until the claim's lease ends when that is later, as its heartbeat moves
// it on (until then the key is the claim's to record, and a record given
// up leaves it to run again). A try whose answer was lost may have
// committed: the next one then finds the key no longer PROCESSING (IK003),
// and the key itself says whether this claim's record is the one it holds.
import { KEY_RECORD } from './sql.js';

// How long a record tries at least (a test lowers it to spare its time).
export const recordPatience = { ms: 10_000 };

// How long the heartbeat keeps a record trying at most (unless the lease
// the claim set at the record's start ends later): a try that keeps
// failing as a lost connection while the beats still get through must not
// hold the caller for ever.
const RECORD_MOST_PATIENCE_MS = 60_000;

// The statement may not have reached the server, or its answer did not
// come back: an error without a SQLSTATE from the server (the network, a
// closed connection), or a connection failure or a server shutting down.
export function lostConnection(err) {
  const fromServer = typeof err?.severity === 'string' && typeof err?.code === 'string';
  if (!fromServer) return true;
  return err.code.startsWith('08') || ['57P01', '57P02', '57P03'].includes(err.code);
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Runs tryOnce() until it does not fail for a lost connection and returns
// its value. After a lost answer, an IK003 is looked into: when the key is
// in one of `statuses` under this claim's token, recovered(row) answers.
// `job.leaseEnds`: when the claim's lease ends at the latest, if known; read
// again before each try, as a heartbeat still running moves it on (a record
// waiting for a busy pool while the lease lasts is not given up), for up to
// a minute or the lease it started with.
export async function retryLost(pool, job, tryOnce, statuses, recovered) {
  const { key, token, scope } = job;
  const start = Date.now();
  const least = start + recordPatience.ms;
  const most = Math.max(start + RECORD_MOST_PATIENCE_MS, job.leaseEnds ?? 0);
  const deadline = () => Math.max(least, Math.min(job.leaseEnds ?? 0, most));
  let pause = 100;
  let lost = false;
  for (;;) {
    try {
      return await tryOnce();
    } catch (err) {
      if (lost && err?.code === 'IK003') {
        const row = await pool.query(KEY_RECORD, [key, scope]).then((r) => r.rows[0], () => null);
        if (row && statuses.includes(row.status) && row.token === String(token)) return recovered(row);
      }
      if (!lostConnection(err) || pool.ending || Date.now() >= deadline()) throw err;
      lost = true;
      await sleep(Math.min(pause, deadline() - Date.now()));
      pause = Math.min(pause * 2, 1000);
    }
  }
}
