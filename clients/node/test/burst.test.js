// Finding: with `wait` on and a small pool, waiting duplicates held the
// pool's connections inside idem_claim(wait => ...), and the owner's
// complete queued behind them (50 requests took 22 s on a pool of 10).
// Here 200 identical POSTs at once, `wait` 5 s, a pool of 5 connections, a
// 300 ms handler that makes no database call, through the Express
// middleware and the web-standard wrapper (each in a server process of its
// own): the handler runs once, the owner answers within its handler time
// + half of `wait`, every duplicate gets the replay or a 409 within `wait`
// + 1 s. Starved behind the waiting duplicates, the owner's complete would
// wait for their waits to end (`wait` at least): the bounds sit between
// that and a loaded machine's figures (1.35 s for the owner, measured while
// three suites shared two cores).
import assert from 'node:assert/strict';
import { after, describe, test } from 'node:test';
import { newKey } from './helpers.js';
import { figures, post, runs as runsOf, startServer, warm } from './server-process.js';

const CROWD = 200;
const WAIT = 5;
const HANDLER_MS = 300;

for (const framework of ['express', 'web']) {
  describe(`a burst through the ${framework} middleware`, () => {
    const server = startServer({ FRAMEWORK: framework, POOL_MAX: '5', WAIT: String(WAIT), HANDLER_MS: String(HANDLER_MS), SCOPE: `burst.${framework}` });
    after(() => server.kill());

    test(`${CROWD} identical POSTs, wait ${WAIT} s, pool max 5`, async (t) => {
      const url = await server.url;
      const key = newKey('burst');
      await post(url, newKey('warm'));   // the first request of a process pays for its loading
      await warm(url, CROWD);
      const answers = await Promise.all(Array.from({ length: CROWD }, () => post(url, key, { item: 'tea' })));
      const runs = await runsOf(url);
      const owners = answers.filter((a) => a.status === 201 && !a.replayed);
      const replays = answers.filter((a) => a.status === 201 && a.replayed);
      const conflicts = answers.filter((a) => a.status === 409);
      const other = answers.filter((a) => ![201, 409].includes(a.status));
      t.diagnostic(`${framework}: owner ${figures(owners.map((a) => a.ms))}; replays ${figures(replays.map((a) => a.ms))}; ` +
        `409 ${figures(conflicts.map((a) => a.ms))}; other ${other.length}`);
      assert.equal(runs[key], 1, 'the handler ran once');
      assert.equal(other.length, 0, other.map((a) => a.status ?? a.error?.message).join(','));
      assert.equal(owners.length, 1);
      assert.ok(owners[0].ms <= HANDLER_MS + WAIT * 500, `the owner answered after ${Math.round(owners[0].ms)} ms`);
      const slowest = Math.max(...[...replays, ...conflicts].map((a) => a.ms));
      assert.ok(slowest <= WAIT * 1000 + 1000, `a duplicate answered after ${Math.round(slowest)} ms`);
      assert.equal(replays.length + conflicts.length, CROWD - 1);
      for (const r of replays) assert.equal(r.text, owners[0].text, 'the replay is the owner\'s response');
    });
  });
}
