/** The pure parts of the store kernel: splitting migration files, naming rules, value encoding. */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { encodeJsonEachRow, formatDateTime, normalizeParams, parseJsonEachRow, toJsonEachRow } from '../../services/kernel/store/encoding.ts';
import { loadMigrations, MIGRATIONS_DIR, splitStatements } from '../../services/kernel/store/migrations.ts';

test('splitStatements splits at `;` + end of line and drops comment lines and blanks', () => {
  const sql = `-- header comment
CREATE TABLE a (x String DEFAULT 'a;b')
ENGINE = MergeTree ORDER BY x;

-- between
ALTER TABLE a ADD COLUMN IF NOT EXISTS y UInt8 ;  
  -- indented comment
SELECT 1
`;
  assert.deepEqual(splitStatements(sql), [
    "CREATE TABLE a (x String DEFAULT 'a;b')\nENGINE = MergeTree ORDER BY x",
    'ALTER TABLE a ADD COLUMN IF NOT EXISTS y UInt8',
    'SELECT 1',
  ]);
  assert.deepEqual(splitStatements('-- only a comment\n\n'), []);
});

test('loadMigrations orders the project files and checks names and versions', () => {
  const names = loadMigrations(MIGRATIONS_DIR).map((m) => `${m.version}:${m.name}`);
  assert.deepEqual(names.slice(0, 3), ['1:0001_schema_migrations', '2:0002_trace_events', '3:0003_dead_letters']);
  const dir = mkdtempSync(join(tmpdir(), 'svc-mig-unit-'));
  try {
    writeFileSync(join(dir, '0001_a.sql'), 'SELECT 1;');
    writeFileSync(join(dir, 'notes.txt'), 'ignored');
    assert.equal(loadMigrations(dir).length, 1);
    writeFileSync(join(dir, '0001_b.sql'), 'SELECT 2;');
    assert.throws(() => loadMigrations(dir), /0001_a and 0001_b\.sql: same version 0001/);
    rmSync(join(dir, '0001_b.sql'));
    writeFileSync(join(dir, '2_Bad-Name.sql'), 'SELECT 2;');
    assert.throws(() => loadMigrations(dir), /2_Bad-Name\.sql: name must be NNNN_lowercase_name\.sql/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('values are encoded the same way for both adapters', async () => {
  assert.equal(formatDateTime(new Date('2026-01-02T03:04:05.678Z')), '2026-01-02 03:04:05.678');
  assert.equal(formatDateTime(new Date('2026-01-02T03:04:05Z')), '2026-01-02 03:04:05');
  assert.equal(normalizeParams(undefined), undefined);
  assert.equal(normalizeParams({}), undefined);
  assert.deepEqual(normalizeParams({ a: 1n, d: new Date(0), arr: [2n, 'x'], s: 's', n: null }), {
    a: '1',
    d: '1970-01-01 00:00:00',
    arr: ['2', 'x'],
    s: 's',
    n: null,
  });
  const rows = [{ a: 1n, d: new Date('2026-01-02T03:04:05.5Z'), m: { k: 'v' }, n: null }];
  const text = toJsonEachRow(rows);
  assert.equal(text, '{"a":"1","d":"2026-01-02 03:04:05.500","m":{"k":"v"},"n":null}\n');
  assert.deepEqual(parseJsonEachRow(text + '\n'), [{ a: '1', d: '2026-01-02 03:04:05.500', m: { k: 'v' }, n: null }]);
  const many = Array.from({ length: 1234 }, (_, i) => ({ i }));
  assert.equal((await encodeJsonEachRow(many)).toString(), toJsonEachRow(many));
});

test('a column empty in every row of a compact batch is left out; one value anywhere keeps it', async () => {
  const { encodeJsonCompactEachRow } = await import('../../services/kernel/store/encoding.ts');
  const rows = [
    { a: 1, empty: '', zero: 0, map: {}, list: [], nul: null, some: '' },
    { a: 2, empty: '', zero: 0, map: {}, list: [], nul: null, some: 'x' },
  ];
  const { columns, payload } = await encodeJsonCompactEachRow(rows);
  assert.deepEqual(columns, ['a', 'some']);
  assert.equal(payload.toString(), '[1,""]\n[2,"x"]\n');
});
