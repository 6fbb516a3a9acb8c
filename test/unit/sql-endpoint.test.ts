/** The SQL endpoint's query checks (services/api/sql/check.ts) and Native framing (sql/native.ts). */
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { Session } from 'chdb';
import { checkQuery } from '../../services/api/sql/check.ts';
import { SqlError, fromEngineError } from '../../services/api/sql/sql-errors.ts';
import { nativeForRevision, parseType } from '../../services/api/sql/native.ts';

const refusedWith = (sql: string, code: number) => () =>
  assert.throws(
    () => checkQuery(sql),
    (err: unknown) => err instanceof SqlError && err.code === code,
    sql,
  );

test('reads are allowed; the FORMAT clause is found, not a column named format', () => {
  assert.deepEqual(checkQuery('SELECT 1'), { format: null });
  assert.deepEqual(checkQuery('  (SELECT 1) ;  '), { format: null });
  assert.deepEqual(checkQuery('WITH 1 AS x SELECT x FORMAT JSONEachRow'), { format: 'JSONEachRow' });
  assert.deepEqual(checkQuery('SELECT 1 FORMAT CSV SETTINGS max_threads = 1'), { format: 'CSV' });
  assert.deepEqual(checkQuery('SELECT format FROM t'), { format: null });
  assert.deepEqual(checkQuery("SELECT format('{}', 1) FROM (SELECT 1 FORMAT JSON)"), { format: null });
  for (const sql of ['SHOW TABLES', 'DESCRIBE TABLE trace_events', 'DESC otel_traces', 'EXPLAIN SELECT 1', 'EXISTS TABLE t']) checkQuery(sql);
  // Words in strings, quoted identifiers used as columns, and comments are not calls.
  checkQuery("SELECT 'file(x)', \"url\" FROM t -- file('/etc/passwd')\n");
  checkQuery('SELECT 1 /* s3( /* nested */ remote( */');
  checkQuery("SELECT $$ file('/x') $$, $tag$it's$tag$");
  checkQuery("SELECT 1 # url('x')\n");
  checkQuery("SELECT 'it''s', 'a\\'b', numbers FROM numbers(10)");
});

test('writes, state changes, several statements, file and network access are refused', () => {
  for (const sql of [
    'INSERT INTO t VALUES (1)',
    'create table t (a UInt8) engine = Memory',
    'DROP TABLE t',
    'ALTER TABLE t DELETE WHERE 1',
    'TRUNCATE t',
    'SYSTEM FLUSH LOGS',
    'KILL QUERY WHERE 1',
    'OPTIMIZE TABLE t',
    'SET readonly = 0',
    'USE system',
    '(INSERT INTO t VALUES (1))',
  ]) {
    refusedWith(sql, 164)();
  }
  refusedWith('SELECT 1; DROP TABLE t', 62)();
  refusedWith('SELECT 1;;SELECT 2', 62)();
  for (const sql of [
    "SELECT * FROM file('/etc/passwd')",
    "SELECT * FROM FILE ('/etc/passwd')",
    "SELECT * FROM `file`('/etc/passwd')",
    'SELECT * FROM "file"(\'/etc/passwd\')',
    "SELECT * FROM file/* c */('/etc/passwd')",
    "SELECT file('/etc/passwd')",
    "SELECT arrayMap(x -> file(x), ['/etc/passwd'])",
    "SELECT * FROM url('http://x/', CSV)",
    "SELECT * FROM s3Cluster('c', 'http://x/b/k')",
    "SELECT * FROM remoteSecure('h:9440', system.one)",
    "SELECT * FROM icebergS3('http://x/b')",
    "DESCRIBE TABLE file('/etc/passwd')",
    "SELECT 1 INTO OUTFILE '/tmp/x'",
    "SELECT 1 into  outfile '/tmp/x' APPEND",
  ]) {
    refusedWith(sql, 164)();
  }
  refusedWith('SELEC 1', 62)();
  refusedWith('', 62)();
  refusedWith("SELECT 'open", 62)();
  refusedWith('SELECT /* open', 62)();
});

test("engine errors lose chDB's nesting; the status follows ClickHouse's mapping", () => {
  const err = fromEngineError(
    73,
    'Code: 73. DB::Exception: Code: 73. DB::Exception: Unknown format Nope. (UNKNOWN_FORMAT) (version 26.7.2.1). (UNKNOWN_FORMAT)',
  );
  assert.equal(err.text(), 'Code: 73. DB::Exception: Unknown format Nope. (UNKNOWN_FORMAT)\n');
  assert.equal(err.status, 404);
  assert.equal(fromEngineError(159, 'Code: 159. DB::Exception: Timeout exceeded: elapsed 2000.1 ms, maximum: 2000 ms. (TIMEOUT_EXCEEDED)').status, 400);
  assert.equal(fromEngineError(164, "Code: 164. DB::Exception: Cannot modify 'readonly' setting in readonly mode. (READONLY)").status, 403);
});

test('type names split at their top-level commas', () => {
  assert.deepEqual(parseType("Map(LowCardinality(String), Array(Tuple(a String, b Enum8('x,y' = 1))))"), {
    name: 'Map',
    args: ['LowCardinality(String)', "Array(Tuple(a String, b Enum8('x,y' = 1)))"],
  });
  assert.deepEqual(parseType('String'), { name: 'String', args: [] });
});

test('Native framed for a client revision: block info and a flag byte per column, the data untouched', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'svc-native-'));
  const session = new Session(dir);
  try {
    const sql = `SELECT number AS n, toString(number) AS s, toNullable(if(number % 2 = 0, NULL, toString(number))) AS ns,
        toLowCardinality(toString(number % 3)) AS lc, CAST(if(number % 2 = 0, NULL, 'x'), 'LowCardinality(Nullable(String))') AS lcn,
        [toLowCardinality('a'), toLowCardinality(toString(number))] AS alc, map('k', number) AS m, (number, 'x') AS t,
        CAST((1, 'a'), 'Tuple(a UInt8, b String)') AS named, toDecimal64(number, 3) AS d, toFixedString('ab', 2) AS fs,
        toDateTime64('2026-01-01 00:00:00', 9, 'UTC') AS ts, generateUUIDv4() AS u, CAST('a', 'Enum8(\\'a\\' = 1, \\'b\\' = 2)') AS e,
        [[1, 2], [3]] AS nested, toIPv4('1.2.3.4') AS ip, [map('a', [1])] AS deep, 'last' AS last
      FROM numbers(2500) SETTINGS max_block_size = 1000`;
    const plain = Buffer.from((await session.queryAsync(sql, { format: 'Native' })).bytes());
    const framed = Buffer.from(nativeForRevision(plain, 54460));
    // Three blocks of 18 columns: 8 bytes of block info each, one flag byte per column.
    assert.equal(framed.length, plain.length + 3 * 8 + 3 * 18);
    assert.equal(nativeForRevision(plain, 0), plain);
    // The last column of the last block ends the stream: every column before it was walked right.
    assert.equal(framed.subarray(-'last'.length).toString(), 'last');
    assert.ok(framed.subarray(0, 8).equals(Buffer.from([1, 0, 2, 0xff, 0xff, 0xff, 0xff, 0])));
    // An empty result is one header block.
    const empty = Buffer.from((await session.queryAsync('SELECT 1 AS x WHERE 0', { format: 'Native' })).bytes());
    assert.equal(nativeForRevision(empty, 54460).length, empty.length === 0 ? 0 : empty.length + 8 + 1);
    // A type it cannot walk is a clear error.
    const dynamic = Buffer.from((await session.queryAsync('SELECT 1::Dynamic AS x', { format: 'Native' })).bytes());
    assert.throws(
      () => nativeForRevision(dynamic, 54460),
      (err: unknown) => err instanceof SqlError && err.code === 48 && /Dynamic/.test(err.message),
    );
  } finally {
    session.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
