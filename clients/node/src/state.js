// What the client keeps per pool: the requests waiting for a key (one
// poller per key, see wait.js), the keys held by running work (so that a
// shutdown can bound them), and whether the pool's users are stopping.
import { MAX_TIMER_MS } from './options.js';

const states = new WeakMap();

export function stateOf(pool) {
  let state = states.get(pool);
  if (!state) {
    state = { groups: new Map(), trying: new Map(), owners: new Set(), claims: new Set(), closing: false };
    states.set(pool, state);
  }
  return state;
}

// A running piece of work that holds a key: settled() resolves when it has
// recorded its end; stop() ends it now (signal aborted, heartbeat stopped,
// key given back).
export function track(pool, owner) {
  const { owners } = stateOf(pool);
  owners.add(owner);
  return () => owners.delete(owner);
}

// A claim on its way to the server (claimRow() resolves to its row), so
// that a shutdown cannot miss it: shutdown waits for the claims under way,
// and a key claimed once the shutdown began is given back at once
// (release(row)) and answered as in progress, its work never started.
export function claimWhileOpen(pool, claimRow, release) {
  const state = stateOf(pool);
  const claiming = (async () => {
    const row = await claimRow();
    if (row.outcome !== 'claimed' || !state.closing) return row;
    await release(row).catch(() => {});   // not given back: its lease ends it
    return { ...row, outcome: 'in_progress', retry_after: 1 };
  })();
  state.claims.add(claiming);
  const done = () => state.claims.delete(claiming);
  claiming.then(done, done);
  return claiming;
}

// shutdown(pool, { timeout }): what a stopping server calls once it stopped
// accepting requests. Requests waiting for a key stop waiting and are
// answered at once (409 with Retry-After); new requests get 503; running
// handlers and claims have `timeout` seconds to finish and record their
// result; those still running then have their signal aborted, their
// heartbeat stopped and their key given back, so that no key is left
// PROCESSING with a live heartbeat. Resolves when all of that is done.
export async function shutdown(pool, { timeout = 10 } = {}) {
  if (typeof timeout !== 'number' || Number.isNaN(timeout) || timeout < 0) {
    throw new TypeError(`idempotency: timeout must be a number of seconds from 0, or Infinity, not ${String(timeout)}`);
  }
  const state = stateOf(pool);
  state.closing = true;
  for (const group of state.groups.values()) group.leaveAll();
  await Promise.allSettled([...state.claims]);
  const pending = [...state.owners];
  let timer;
  // Infinity, or more than a timer holds (Node would fire at once): the
  // running work ends by itself.
  const expired = new Promise((resolve) => {
    if (timeout * 1000 <= MAX_TIMER_MS) timer = setTimeout(resolve, timeout * 1000);
  });
  await Promise.race([Promise.allSettled(pending.map((owner) => owner.settled)), expired]);
  clearTimeout(timer);
  await Promise.allSettled([...state.owners].map((owner) => owner.stop(new Error('the server is shutting down'))));
}

export function isClosing(pool) {
  return states.get(pool)?.closing ?? false;
}
