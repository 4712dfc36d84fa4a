// Keeps a claim's lease alive while its work runs: idem_heartbeat every
// third of the lease. A heartbeat that finds the token stale (IK001) or the
// key no longer PROCESSING (IK003) means the lease is lost: the signal is
// aborted so that the work can stop, and the fence at the end refuses it.
// Other errors (a dropped connection) are transient; the next beat retries.
import { HEARTBEAT } from './sql.js';

export class Heartbeat {
  constructor(pool, { key, token, scope, lease }) {
    this.controller = new AbortController();
    this.signal = this.controller.signal;
    this.lost = null;
    this.beat = Promise.resolve();
    this.renew = () => pool.query(HEARTBEAT, [key, token, lease, scope]);
    // A third of the lease, never under 10 ms: an absurdly short lease
    // must not flood the database.
    this.timer = setInterval(() => {
      this.beat = this.beat.then(() => this.once());
    }, Math.max(10, (lease * 1000) / 3));
  }

  async once() {
    if (this.lost) return;
    try {
      await this.renew();
    } catch (err) {
      if (err.code === 'IK001' || err.code === 'IK003') {
        this.lost = err;
        this.stopTimer();
        this.controller.abort(err);
      }
    }
  }

  stopTimer() {
    clearInterval(this.timer);
  }

  // Stops beating; resolves once a beat in flight has finished.
  async stop() {
    this.stopTimer();
    await this.beat;
  }
}
