/**
 * The tiers (test/tiers.mjs) together are `npm test`: every folder under test/ that holds test
 * files belongs to exactly one tier, so no test runs in two tiers or in none.
 */
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { TIERS } from '../tiers.mjs';

const TEST_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');

test('every folder of test files is in exactly one tier', () => {
  const folders = new Set(
    fs
      .readdirSync(TEST_DIR, { recursive: true, encoding: 'utf8' })
      .filter((f) => /\.test\.(ts|mts|js|mjs)$/.test(f) && !f.split(path.sep).includes('node_modules'))
      .map((f) => f.split(path.sep)[0]!),
  );
  const tiersOf = (folder: string) =>
    Object.entries(TIERS)
      .filter(([, dirs]) => dirs.includes(folder))
      .map(([tier]) => tier);
  for (const folder of folders)
    assert.equal(tiersOf(folder).length, 1, `test/${folder} is in tiers [${tiersOf(folder).join(', ')}]: it must be in exactly one (test/tiers.mjs)`);
  for (const [tier, dirs] of Object.entries(TIERS)) {
    for (const dir of dirs) assert.ok(folders.has(dir), `tier ${tier} names test/${dir}, which holds no test files`);
  }
});
