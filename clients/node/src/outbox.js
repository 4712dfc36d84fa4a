// The transactional outbox: enqueue in the caller's transaction, and a
// consumer loop for those who use the outbox as a job queue.
import { classifyOr, defaultClassify, errorText, isStaleToken, retryInOrNull, thrown } from './errors.js';
import { MAX_BATCH, checkCount, checkSeconds } from './options.js';
import { BACKEND_PID, ENQUEUE, LISTEN, OUTBOX_ACK, OUTBOX_CLAIM, OUTBOX_NACK, OUTBOX_RELEASE, jsonParam } from './sql.js';

// Enqueues on `client`: pass the client of your transaction and the event
// exists if and only if that transaction commits. Resolves to the event id.
export async function enqueue(client, topic, payload, { key = null, headers = null, dedupKey = null, deliverAt = null } = {}) {
  const { rows: [row] } = await client.query(ENQUEUE,
    [topic, jsonParam(payload), key, jsonParam(headers), dedupKey, deliverAt]);
  return row.id;
}

const CLAIM_OUTCOMES = new Set(['completed', 'failed', 'in_progress', 'retry_later', 'mismatch', 'fenced', 'released']);

// What to do with an event once its handler has run: ['ack'],
// ['nack', error, retryable, retryIn], ['release', retryIn] (pending again
// after retryIn seconds, its attempt not counted) or ['leave'] (it comes
// back when its lease ends). A handler may return what claim() resolved to.
// A classify that throws: the default classification (onError hears why).
export function settlement(value, error, classify = defaultClassify, onError = () => {}) {
  if (error) {
    if (isStaleToken(error)) return ['leave'];
    const final = classifyOr(classify, defaultClassify, error, onError) === 'final';
    return ['nack', errorText(error), !final, final ? null : retryInOrNull(error?.retryIn)];
  }
  if (!value || typeof value !== 'object' || !CLAIM_OUTCOMES.has(value.outcome)) return ['ack'];
  switch (value.outcome) {
    case 'completed':
      return ['ack'];
    case 'failed':
      if (value.replayed) return ['ack'];   // a redelivery of work that failed for good
      return ['nack', value.error, value.retryable, value.retryable ? value.retryAfter : null];
    case 'in_progress':
    case 'retry_later':
      // Another worker holds the key, or its own backoff runs: the event
      // did not fail. Counting an attempt each time would make it a dead
      // letter while the holder works (retry_after is when the holder is
      // expected to finish: milliseconds apart).
      return ['release', value.retryAfter];
    case 'released':
      return ['nack', 'released', true, value.retryIn ?? null];
    case 'mismatch':
      return ['nack', 'the event does not carry the request its key was used with', false, null];
    default: // fenced: the worker that took the key over holds the redelivered event
      return ['leave'];
  }
}

// consume(pool, { topics, name, concurrency, batch, lease, pollInterval,
// classify, onError }, handler): claims events of `topics` and runs
// handler(event) for each; acks or nacks by settlement(). Wakes on the
// outbox's notifications and polls every pollInterval seconds as well.
export function consume(pool, options, handler) {
  return new Consumer(pool, options, handler);
}

export class Consumer {
  constructor(pool, options, handler) {
    const {
      topics, name = `consumer-${process.pid}`, concurrency = 1, batch = 1, lease = 60,
      pollInterval = 1, classify = defaultClassify, onError = (err) => console.error(`[${name}]`, err),
    } = options;
    checkCount('batch', batch, 1, MAX_BATCH);
    checkSeconds('lease', lease, { positive: true });
    checkSeconds('pollInterval', pollInterval, { positive: true });
    checkCount('concurrency', concurrency, 1, Number.MAX_SAFE_INTEGER);
    if (typeof pool?.query !== 'function') throw new TypeError('idempotency: consume needs a pg Pool');
    // Each slot claims as the relay `${name}/${slot}`, at most 255 bytes.
    if (typeof name !== 'string' || name === '' || !name.isWellFormed() || Buffer.byteLength(`${name}/${concurrency - 1}`) > 255) {
      throw new TypeError(`idempotency: name must be a non-empty string of at most 255 bytes with /${concurrency - 1} appended, not ${JSON.stringify(name)}`);
    }
    Object.assign(this, { pool, handler, name, batch, lease, pollInterval, classify, onError });
    this.topics = topics == null ? null : [].concat(topics);
    this.stopping = false;
    this.sleepers = new Set();   // idle waits: an enqueue or stop() ends them
    this.holds = new Set();      // events held before their release: stop() ends them
    this.listener = null;
    // Behind a pooler (see listen), or on a pool with no connection to
    // spare beside the slots' claims (the LISTEN would hold the only one
    // and every claim wait for it): no LISTEN, polling only.
    this.pooled = Number.isInteger(pool.options?.max) && pool.options.max <= concurrency;
    this.done = this.start(concurrency);
  }

  async start(concurrency) {
    await this.listen();
    await Promise.all(Array.from({ length: concurrency }, (_, slot) => this.loop(`${this.name}/${slot}`)));
    await this.unlisten();
  }

  // Finishes the events in hand, then resolves.
  async stop() {
    this.stopping = true;
    this.wakeAll();
    for (const done of [...this.holds]) done();
    await this.done;
  }

  async loop(relay) {
    while (!this.stopping) {
      let events = [];
      try {
        ({ rows: events } = await this.pool.query(OUTBOX_CLAIM, [relay, this.batch, this.lease, this.topics]));
      } catch (err) {
        this.onError(err);
      }
      if (events.length === 0) {
        await this.idle();
        continue;
      }
      for (const event of events) await this.handle(event, relay);
    }
  }

  async handle(event, relay) {
    let value;
    let error = null;
    try {
      value = await this.handler(event);
    } catch (err) {
      error = thrown(err);
    }
    const [action, ...args] = settlement(value, error, this.classify, this.onError);
    if (action === 'release') await this.holdBeforeRelease(args[0]);
    try {
      if (action === 'ack') await this.pool.query(OUTBOX_ACK, [event.id]);
      else if (action === 'nack') await this.pool.query(OUTBOX_NACK, [event.id, ...args]);
      else if (action === 'release') await this.pool.query(OUTBOX_RELEASE, [event.id, relay]);
    } catch (err) {
      this.onError(err);   // the event comes back when its lease ends
    }
  }

  async listen() {
    if (this.listener || this.stopping || this.pooled) return;
    try {
      const client = await this.pool.connect();
      // Through a pooler in transaction mode (PgBouncer and the like) the
      // connection's backend key is the pooler's, not the server backend's
      // pid: a LISTEN would stay on a server backend that other clients
      // share, and its notifications would reach them. Poll instead.
      const { rows } = await client.query(BACKEND_PID);
      if (rows[0].pid !== client.processID) {
        this.pooled = true;
        client.release();
        return;
      }
      client.on('notification', () => this.wakeAll());
      client.on('error', (err) => {
        this.onError(err);
        this.dropListener(err);
      });
      await client.query(LISTEN);
      this.listener = client;
    } catch (err) {
      this.onError(err);   // polling only, until the next idle tries again
    }
  }

  dropListener(err) {
    const client = this.listener;
    this.listener = null;
    client?.release(err);
  }

  async unlisten() {
    if (!this.listener) return;
    await this.listener.query('UNLISTEN *').catch(() => {});
    this.dropListener();
  }

  // Keeps an event whose key another worker holds for retryAfter seconds,
  // at least pollInterval (so that it is not claimed again at once, over
  // and over) and at most half the lease (released, its attempt is not
  // counted; expired, it would be); stop() ends the wait.
  async holdBeforeRelease(retryAfter) {
    if (this.stopping) return;
    await pause(Math.min(Math.max(retryAfter ?? 0, this.pollInterval), this.lease / 2), this.holds);
  }

  // Waits up to pollInterval seconds, or until an event is enqueued or stop().
  async idle() {
    if (!this.listener) await this.listen();
    if (this.stopping) return;
    await pause(this.pollInterval, this.sleepers);
  }

  wakeAll() {
    for (const done of [...this.sleepers]) done();
  }
}

// Waits `seconds`, or until the function it adds to `wakers` is called.
function pause(seconds, wakers) {
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      wakers.delete(done);
      resolve();
    };
    const timer = setTimeout(done, seconds * 1000);
    wakers.add(done);
  });
}
