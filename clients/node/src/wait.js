// Waiting for a key held by another request without holding a connection
// of the pool. A waiting request never sits inside idem_claim(wait => ...)
// on a pooled connection (with a pool of 10 and 10 duplicates waiting, the
// holder's own complete and heartbeat would queue behind them). Instead:
//
//   - the first try is idem_claim without wait: one statement, the
//     connection goes back to the pool at once;
//   - duplicates that arrive while that try is under way take its answer
//     instead of asking again (when it claimed the key, they wait);
//   - while the answer is in_progress, the request joins the poller of its
//     key in this process (one per pool, key, scope and request, however
//     many duplicates wait), which tries again after 25 ms, then every
//     time twice as long, at most 250 ms apart; each try is again one
//     statement without wait (in transaction mode BEGIN, claim, COMMIT);
//   - a try that finds the key settled (completed, failed) answers every
//     waiting request; one that claims it (the holder failed retryably,
//     released it, or its lease ended) hands the claim to the longest
//     waiting request, the others go on waiting; a request whose own
//     `wait` has passed leaves with the last answer (409);
//   - a try that fails (the database restarting) answers nobody: the next
//     one may find the key settled. A request whose `wait` passes while
//     the latest try failed leaves with that error.
//
// So a crowd of duplicates costs the pool at most four short statements a
// second per key and process, and a waiter learns of the result at most
// 250 ms after it was committed.
import { canonicalJson } from './fingerprint.js';
import { stateOf } from './state.js';

export const FIRST_POLL = 0.025;
export const MAX_POLL = 0.25;

// claimWaiting(pool, { id, attempt, wait, signal }): attempt() runs one
// try and resolves to { row, abandon? } (abandon gives back a claim nobody
// takes). Resolves to the first try's result, or to what a later try found.
export async function claimWaiting(pool, { id, attempt, wait, signal = null }) {
  if (!(wait > 0)) return attempt();
  const state = stateOf(pool);
  if (state.closing || signal?.aborted) return attempt();
  const deadline = Date.now() + wait * 1000;
  // Duplicates that arrive while the key is already waited for join the
  // waiting; those that arrive while the first try of the key is under way
  // take its answer, unless it claimed the key (it is then in progress).
  if (state.groups.has(id)) return state.groups.get(id).join(deadline, signal);
  let first;
  const leading = state.trying.get(id);
  if (leading) {
    first = await leading.catch(() => null);
    if (!first) return claimWaiting(pool, { id, attempt, wait: (deadline - Date.now()) / 1000, signal });
    if (first.row.outcome === 'claimed') first = { row: { ...first.row, outcome: 'in_progress', token: null, retry_after: null } };
  } else {
    const trying = attempt();
    state.trying.set(id, trying);
    try {
      first = await trying;
    } finally {
      state.trying.delete(id);
    }
    if (first.row.outcome !== 'in_progress') return first;
  }
  if (first.row.outcome !== 'in_progress') return { row: first.row };
  if (state.closing || signal?.aborted) return { row: first.row };
  let group = state.groups.get(id);
  const fresh = !group;
  if (fresh) {
    group = new Group(state, id, attempt, first.row);
    state.groups.set(id, group);
  }
  const joined = group.join(deadline, signal);
  if (fresh) group.run();
  return joined;
}

// The request as the server is sent it (JSON.stringify: a Date is its
// string, a Map {}), in canonical form: two requests the server tells apart
// never share a poller.
export const groupId = (mode, scope, key, request, lease) =>
  JSON.stringify([mode, scope, key, lease, canonicalJson(JSON.parse(JSON.stringify(request ?? null)))]);

class Group {
  constructor(state, id, attempt, row) {
    Object.assign(this, { state, id, attempt, last: row });
    this.members = [];
    this.wake = null;
    this.lastError = null;
  }

  join(deadline, signal) {
    return new Promise((resolve, reject) => {
      const member = { deadline, resolve, reject };
      const timer = setTimeout(() => this.leave(member), Math.max(0, deadline - Date.now()));
      const onAbort = () => this.leave(member);
      signal?.addEventListener('abort', onAbort, { once: true });
      member.done = () => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
      };
      this.members.push(member);
    });
  }

  // A member leaves with the last answer seen (in_progress: a 409), or
  // with the error of the latest try when that failed.
  leave(member) {
    const at = this.members.indexOf(member);
    if (at < 0) return;
    this.members.splice(at, 1);
    member.done();
    if (this.lastError) member.reject(this.lastError);
    else member.resolve({ row: this.last });
    if (this.members.length === 0) this.wake?.();
  }

  leaveAll() {
    for (const member of [...this.members]) this.leave(member);
  }

  settle(fn) {
    for (const member of this.members.splice(0)) {
      member.done();
      fn(member);
    }
  }

  async run() {
    let delay = FIRST_POLL * 1000;
    try {
      while (this.members.length > 0 && !this.state.closing) {
        const latest = Math.max(...this.members.map((m) => m.deadline));
        await new Promise((resolve) => {
          const timer = setTimeout(resolve, Math.max(0, Math.min(delay, latest - Date.now())));
          this.wake = () => { clearTimeout(timer); resolve(); };
        });
        this.wake = null;
        delay = Math.min(delay * 2, MAX_POLL * 1000);
        if (this.members.length === 0 || this.state.closing) break;
        let result;
        try {
          result = await this.attempt();
          this.lastError = null;
        } catch (err) {
          // The database failed this try (a restart): nobody is answered,
          // the next try may find the key.
          this.lastError = err;
          continue;
        }
        const { row } = result;
        if (row.outcome === 'in_progress') {
          this.last = row;
        } else if (row.outcome === 'claimed') {
          const member = this.members.shift();
          if (member) {
            member.done();
            member.resolve(result);
          } else {
            await result.abandon?.().catch(() => {});
          }
        } else {
          this.settle((member) => member.resolve({ row }));
          break;
        }
      }
    } finally {
      if (this.state.groups.get(this.id) === this) this.state.groups.delete(this.id);
      this.leaveAll();
    }
  }
}
