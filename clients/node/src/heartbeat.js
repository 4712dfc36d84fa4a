// Keeps a claim's lease alive while its work runs: idem_heartbeat every
// third of the lease. A heartbeat that finds the token stale (IK001) or the
// key no longer PROCESSING (IK003) means the lease is lost: the signal is
// aborted so that the work can stop, and the fence at the end refuses it.
// Other errors (a dropped connection) are transient; the next beat retries.
import { HEARTBEAT } from './sql.js';

// The beats of a pg.Pool's claims go through one connection of their own,
// opened with the pool's settings while a heartbeat runs and closed with
// the last: through the pool a beat waits behind every request for a
// connection, and on a busy pool that wait outlasted the lease (the key
// was taken over and its work ran twice). A pool of another kind (anything
// with query()) is beaten through.
const lanes = new WeakMap();

class BeatLane {
  constructor(pool) {
    this.pool = pool;
    this.users = 0;
    this.client = null;
    this.connected = null;
  }

  query(text, values) {
    if (this.client === null) {
      const client = new this.pool.Client(this.pool.options);
      client.on('error', () => this.drop(client));   // a connection lost while idle
      this.client = client;
      this.connected = client.connect();
    }
    const { client, connected } = this;
    return connected.then(() => client.query(text, values)).catch((err) => {
      // An error the server sent leaves the connection usable; any other
      // (the network, a closed connection) makes the next beat connect anew.
      if (!(typeof err?.severity === 'string' && typeof err?.code === 'string')) this.drop(client);
      throw err;
    });
  }

  drop(client) {
    if (this.client !== client) return;
    this.client = null;
    client.end().catch(() => {});
  }

  acquire() {
    this.users += 1;
  }

  release() {
    this.users -= 1;
    if (this.users === 0 && this.client !== null) this.drop(this.client);
  }
}

function laneOf(pool) {
  if (typeof pool?.Client !== 'function' || typeof pool?.options !== 'object') return null;
  let lane = lanes.get(pool);
  if (!lane) {
    lane = new BeatLane(pool);
    lanes.set(pool, lane);
  }
  return lane;
}

export class Heartbeat {
  constructor(pool, { key, token, scope, lease }) {
    this.controller = new AbortController();
    this.signal = this.controller.signal;
    this.lost = null;
    this.beat = Promise.resolve();
    this.lane = laneOf(pool);
    this.lane?.acquire();
    const through = this.lane ?? pool;
    this.renew = () => through.query(HEARTBEAT, [key, token, lease, scope]);
    // When the lease ends at the latest (ms since the epoch): from the
    // claim, which came just before, then from each beat that went through.
    this.leaseMs = lease * 1000;
    this.leaseEnds = Date.now() + this.leaseMs;
    // Set once the outcome is being recorded, the heartbeat still running:
    // a beat that then finds the key taken or finished stops without a word.
    this.recording = false;
    // A third of the lease, never under 10 ms: an absurdly short lease
    // must not flood the database. A beat still on its way (the lane or the
    // pooler behind it busy) gets no second one queued behind it: queued
    // beats of every claim made the lane slower still, until leases ended.
    this.inFlight = false;
    this.ended = false;   // the key was found taken or finished
    this.timer = setInterval(() => {
      if (this.inFlight) return;
      this.inFlight = true;
      this.beat = this.once().finally(() => { this.inFlight = false; });
    }, Math.max(10, (lease * 1000) / 3));
  }

  async once() {
    if (this.lost || this.ended) return;
    try {
      const started = Date.now();
      await this.renew();
      this.leaseEnds = Math.max(this.leaseEnds, started + this.leaseMs);
    } catch (err) {
      if (err.code === 'IK001' || err.code === 'IK003') {
        this.stopTimer();
        this.ended = true;
        if (this.recording) return;   // the record says what happened
        this.lost = err;
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
    if (this.lane) {
      const lane = this.lane;
      this.lane = null;
      lane.release();
    }
  }
}
