// The documentation runs as written, as the roles it names.
// - Every ```js example of docs/clients-node.md runs as a program against
//   the cluster and exits 0 (except those marked <!-- illustrative -->),
//   from a folder inside the package so that it imports 'pg-idempotency'
//   as users do, connected as `app`. With DOCS_DATABASE (node.sh sets it)
//   that is a database where `app` has only grant_application: what more
//   an example needs, the page must grant in an SQL block before it.
// - Each ```sql block that is not illustrative runs, in page order, as the
//   role its <!-- role: NAME --> marker names.
// - In docs/clients-node.md and clients/node/README.md every sql and sh
//   block has that marker right before its fence (with any other markers)
//   and a sentence before them that names the role.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, describe, test } from 'node:test';
import { promisify } from 'node:util';
import pg from 'pg';

const page = fileURLToPath(new URL('../../../docs/clients-node.md', import.meta.url));
const readme = fileURLToPath(new URL('../README.md', import.meta.url));
const ROLES = new Set(['postgres', 'app', 'relay', 'monitoring']);

// The fenced blocks of a page: { language, line, code, markers, prose },
// markers being the <!-- ... --> lines right before the fence (blank lines
// aside), prose the paragraph before those.
export function blocks(markdown) {
  const lines = markdown.split('\n');
  const found = [];
  for (let i = 0; i < lines.length; i += 1) {
    const fence = /^```(\w*)\s*$/.exec(lines[i]);
    if (!fence) continue;
    let end = i + 1;
    while (end < lines.length && lines[end] !== '```') end += 1;
    const markers = [];
    let j = i - 1;
    for (; j >= 0 && (lines[j].trim() === '' || /^<!--.*-->$/.test(lines[j].trim())); j -= 1) {
      if (lines[j].trim()) markers.unshift(lines[j].trim());
    }
    const prose = [];
    for (; j >= 0 && lines[j].trim() !== ''; j -= 1) prose.unshift(lines[j]);
    found.push({ language: fence[1], line: i + 2, code: lines.slice(i + 1, end).join('\n') + '\n', markers, prose: prose.join(' ') });
    i = end;
  }
  return found;
}

const roleOf = (block) => /^<!-- role: (\S+) -->$/.exec(block.markers.find((m) => m.startsWith('<!-- role:')) ?? '')?.[1] ?? null;
const illustrative = (block) => block.markers.includes('<!-- illustrative -->');

for (const [name, file] of [['docs/clients-node.md', page], ['clients/node/README.md', readme]]) {
  test(`${name}: every sql and sh block names its role, in a marker and in a sentence before it`, () => {
    const shell = blocks(readFileSync(file, 'utf8')).filter((b) => b.language === 'sql' || b.language === 'sh');
    assert.ok(shell.length > 0);
    for (const block of shell) {
      const role = roleOf(block);
      assert.ok(ROLES.has(role), `line ${block.line}: no <!-- role: NAME --> marker (NAME one of ${[...ROLES].join(', ')})`);
      assert.equal(block.markers.at(-1) === `<!-- role: ${role} -->` || block.markers.includes('<!-- illustrative -->'), true,
        `line ${block.line}: the role marker is not right before the fence`);
      const names = role === 'postgres' ? /`postgres`|superuser/ : new RegExp(`\`${role}\``);
      assert.match(block.prose, names, `line ${block.line}: the sentence before the block does not say it runs as ${role}`);
    }
  });
}

describe('docs/clients-node.md', () => {
  const folder = mkdtempSync(fileURLToPath(new URL('./docs-', import.meta.url)));
  after(() => rmSync(folder, { recursive: true, force: true }));
  const env = { ...process.env, ...(process.env.DOCS_DATABASE ? { PGDATABASE: process.env.DOCS_DATABASE } : {}) };
  const found = blocks(readFileSync(page, 'utf8')).filter((b) => ['js', 'sql'].includes(b.language) && !illustrative(b));

  test('has examples', () => assert.ok(found.filter((b) => b.language === 'js').length >= 4, `${found.length} examples`));
  for (const block of found) {
    if (block.language === 'sql') {
      test(`the SQL at line ${block.line} runs as ${roleOf(block)}`, async () => {
        const client = new pg.Client({ user: roleOf(block), database: env.PGDATABASE });
        await client.connect();
        try {
          await client.query(block.code);
        } finally {
          await client.end();
        }
      });
      continue;
    }
    test(`the example at line ${block.line} runs`, async () => {
      const file = join(folder, `line-${block.line}.mjs`);
      writeFileSync(file, block.code);
      const { stdout } = await promisify(execFile)(process.execPath, [file], { timeout: 60_000, env })
        .catch((err) => assert.fail(`exit ${err.code}:\n${err.stdout}${err.stderr}`));
      assert.ok(stdout.length > 0, 'it prints what it shows');
    });
  }
});
