// What the client keeps per pool: the requests waiting for a key (one
// poller per key, see wait.js), the keys held by running work (so that a
// shutdown can bound them), and whether the pool's users are stopping.
const states = new WeakMap();

export function stateOf(pool) {
  let state = states.get(pool);
  if (!state) {
    state = { groups: new Map(), trying: new Map(), owners: new Set(), closing: false };
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

// shutdown(pool, { timeout }): what a stopping server calls once it stopped
// accepting requests. Requests waiting for a key stop waiting and are
// answered at once (409 with Retry-After); new requests get 503; running
// handlers and claims have `timeout` seconds to finish and record their
// result; those still running then have their signal aborted, their
// heartbeat stopped and their key given back, so that no key is left
// PROCESSING with a live heartbeat. Resolves when all of that is done.
export async function shutdown(pool, { timeout = 10 } = {}) {
  const state = stateOf(pool);
  state.closing = true;
  for (const group of state.groups.values()) group.leaveAll();
  const pending = [...state.owners];
  let timer;
  const expired = new Promise((resolve) => { timer = setTimeout(resolve, Math.max(0, timeout) * 1000); });
  await Promise.race([Promise.allSettled(pending.map((owner) => owner.settled)), expired]);
  clearTimeout(timer);
  await Promise.allSettled([...state.owners].map((owner) => owner.stop(new Error('the server is shutting down'))));
}

export function isClosing(pool) {
  return states.get(pool)?.closing ?? false;
}
