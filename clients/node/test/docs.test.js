// Every ```js example of docs/clients-node.md runs as a program against the
// cluster and exits 0 (except those marked <!-- illustrative -->). They run
// from a folder inside the package, so that they import 'pg-idempotency'
// as users do.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, describe, test } from 'node:test';
import { promisify } from 'node:util';

const page = fileURLToPath(new URL('../../../docs/clients-node.md', import.meta.url));

export function examples(markdown, language) {
  const found = [];
  const pattern = new RegExp(`(<!-- illustrative -->\\n)?\`\`\`${language}\\n([\\s\\S]*?)\`\`\`\\n`, 'g');
  for (const match of markdown.matchAll(pattern)) {
    if (!match[1]) found.push({ line: markdown.slice(0, match.index).split('\n').length + 1, code: match[2] });
  }
  return found;
}

describe('docs/clients-node.md', () => {
  const folder = mkdtempSync(fileURLToPath(new URL('./docs-', import.meta.url)));
  after(() => rmSync(folder, { recursive: true, force: true }));
  const found = examples(readFileSync(page, 'utf8'), 'js');

  test('has examples', () => assert.ok(found.length >= 4, `${found.length} examples`));
  for (const { line, code } of found) {
    test(`the example at line ${line} runs`, async () => {
      const file = join(folder, `line-${line}.mjs`);
      writeFileSync(file, code);
      const { stdout } = await promisify(execFile)(process.execPath, [file], { timeout: 60_000 })
        .catch((err) => assert.fail(`exit ${err.code}:\n${err.stdout}${err.stderr}`));
      assert.ok(stdout.length > 0, 'it prints what it shows');
    });
  }
});
