/** The settings table of the README and the error list of docs/errors.md match their catalogs, both ways. */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { SETTINGS } from '../../services/kernel/config.ts';
import { ERROR_CODES } from '../../services/kernel/errors.ts';
import { REPO } from '../helpers/server.ts';

test('the README lists exactly the settings of config.ts, with their defaults', () => {
  const readme = readFileSync(path.join(REPO, 'README.md'), 'utf8');
  const rows = [...readme.matchAll(/^\| `(SVC_[A-Z0-9_]+)` \| (.+?) \|/gm)].map((m) => [m[1], m[2]] as const);
  const documented = new Map(rows);
  for (const s of Object.values(SETTINGS)) {
    assert.ok(documented.has(s.env), `${s.env} is missing from the README's settings table`);
    assert.equal(documented.get(s.env), s.default === null ? '—' : `\`${s.default}\``, `${s.env}: default differs`);
  }
  const known = new Set(Object.values(SETTINGS).map((s) => s.env));
  for (const env of documented.keys()) assert.ok(known.has(env), `${env} is in the README but not a setting`);
});

test('the per-service tables of docs/operations.md name every setting of config.ts, and only settings', () => {
  const doc = readFileSync(path.join(REPO, 'docs', 'operations.md'), 'utf8');
  const section = /^## Settings per service\n([\s\S]*?)^## /m.exec(doc)?.[1];
  assert.ok(section, 'docs/operations.md has a "Settings per service" section');
  const named = new Set([...section.matchAll(/`(SVC_[A-Z0-9_]+)`/g)].map((m) => m[1]));
  const known = new Set(Object.values(SETTINGS).map((s) => s.env));
  for (const env of known) assert.ok(named.has(env), `${env} is in no table of docs/operations.md's "Settings per service"`);
  for (const env of named) assert.ok(known.has(env), `${env} is in docs/operations.md but not a setting`);
});

test('docs/errors.md lists exactly the error codes of the catalog, with their statuses', () => {
  const doc = readFileSync(path.join(REPO, 'docs', 'errors.md'), 'utf8');
  const rows = new Map([...doc.matchAll(/^\| `([a-z_]+)` \| (\d{3}) \|/gm)].map((m) => [m[1], Number(m[2])]));
  assert.deepEqual(new Map(Object.entries(ERROR_CODES)), rows);
});
