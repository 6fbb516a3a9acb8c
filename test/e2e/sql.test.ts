/**
 * The analysts' SQL endpoint (/v1/admin/sql, docs/analysts.md) over HTTP: ClickHouse's HTTP
 * interface as curl, @clickhouse/client and Grafana's ClickHouse plugin (clickhouse-go, protocol
 * HTTP) use it; admin only; read-only and limited; the otel_traces view under Grafana's own
 * trace-view query.
 */
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { gunzipSync } from 'node:zlib';
import { ClickHouseLogLevel, createClient } from '@clickhouse/client';
import { Session } from 'chdb';
import { ClickHouseStore } from '../../services/kernel/store/clickhouse-store.ts';
import { StoreQueryError } from '../../services/kernel/store/store.ts';
import { ADMIN_KEY, createTenantKey, startServer, traceEvent, type TestServer } from '../helpers/server.ts';

/**
 * Grafana's trace-view query over the OTel span table, copied unchanged from the expectation of
 * the test 'generates trace ID query with OTel enabled' in grafana/clickhouse-datasource,
 * src/data/sqlGenerator.test.ts at commit 1d04063a31fb30f9582cd0b3aeaacb7d350b0dcf (the parts
 * joined with ' ', as the test does). A test input, not code: the trace id is the fixture's.
 */
const GRAFANA_TRACE_QUERY = [
  `WITH 'abcdefg' as __gf_trace_id, (SELECT min(Start) FROM "default"."otel_traces_trace_id_ts" WHERE TraceId = __gf_trace_id) as __gf_trace_start,`,
  `(SELECT max(End) + 1 FROM "default"."otel_traces_trace_id_ts" WHERE TraceId = __gf_trace_id) as __gf_trace_end`,
  'SELECT "TraceId" as traceID, "SpanId" as spanID, "ParentSpanId" as parentSpanID,',
  '"ServiceName" as serviceName, "SpanName" as operationName, multiply(toUnixTimestamp64Nano("Timestamp"), 0.000001) as startTime,',
  'multiply("Duration", 0.000001) as duration,',
  `arrayMap(key -> map('key', key, 'value',"SpanAttributes"[key]),`,
  `mapKeys("SpanAttributes")) as tags,`,
  `arrayMap(key -> map('key', key, 'value',"ResourceAttributes"[key]), mapKeys("ResourceAttributes")) as serviceTags,`,
  `if("StatusCode" IN ('Error', 'STATUS_CODE_ERROR'), 2, 0) as statusCode`,
  `FROM "default"."otel_traces" WHERE traceID = __gf_trace_id AND "Timestamp" >= __gf_trace_start AND "Timestamp" <= __gf_trace_end`,
].join(' ');

/** clickhouse-go's HTTP transport: its protocol revision (lib/proto/const.go, DBMS_TCP_PROTOCOL_VERSION). */
const CLICKHOUSE_GO_REVISION = 54460;

const basic = (user: string, password: string) => `Basic ${Buffer.from(`${user}:${password}`).toString('base64')}`;

// ---- A minimal Native decoder (the types these tests read), as clickhouse-go decodes a block ----

class Reader {
  pos = 0;
  constructor(readonly buf: Buffer) {}
  uvarint(): number {
    let result = 0;
    for (let shift = 0; ; shift += 7) {
      const b = this.buf[this.pos++];
      result += (b & 0x7f) * 2 ** shift;
      if ((b & 0x80) === 0) return result;
    }
  }
  string(): string {
    const n = this.uvarint();
    const s = this.buf.toString('utf8', this.pos, this.pos + n);
    this.pos += n;
    return s;
  }
  u64(): number {
    const v = Number(this.buf.readBigUInt64LE(this.pos));
    this.pos += 8;
    return v;
  }
}

function typeArgs(type: string): string[] {
  const inner = type.slice(type.indexOf('(') + 1, -1);
  const out: string[] = [];
  let depth = 0;
  let start = 0;
  for (let i = 0; i < inner.length; i++) {
    if (inner[i] === '(') depth++;
    else if (inner[i] === ')') depth--;
    else if (inner[i] === ',' && depth === 0) {
      out.push(inner.slice(start, i).trim());
      start = i + 1;
    }
  }
  out.push(inner.slice(start).trim());
  return out;
}

function readPrefix(type: string, r: Reader): void {
  if (type.startsWith('LowCardinality(')) r.u64();
  else if (type.startsWith('Array(')) readPrefix(typeArgs(type)[0], r);
  else if (type.startsWith('Map(')) for (const t of typeArgs(type)) readPrefix(t, r);
}

function readColumn(type: string, n: number, r: Reader): unknown[] {
  const out: unknown[] = [];
  if (type === 'String') for (let i = 0; i < n; i++) out.push(r.string());
  else if (type === 'UInt8') for (let i = 0; i < n; i++) out.push(r.buf[r.pos++]);
  else if (type === 'UInt32') for (let i = 0; i < n; i++, r.pos += 4) out.push(r.buf.readUInt32LE(r.pos));
  else if (type === 'UInt64') for (let i = 0; i < n; i++) out.push(String(r.u64()));
  else if (type === 'Float64') for (let i = 0; i < n; i++, r.pos += 8) out.push(r.buf.readDoubleLE(r.pos));
  else if (type.startsWith('LowCardinality(')) {
    const flags = r.u64();
    const width = [1, 2, 4, 8][flags & 0xff];
    const keys = flags & 0x200 ? readColumn(typeArgs(type)[0], r.u64(), r) : [];
    const count = r.u64();
    for (let i = 0; i < count; i++, r.pos += width) out.push(keys[r.buf.readUIntLE(r.pos, Math.min(width, 6))]);
  } else if (type.startsWith('Array(') || type.startsWith('Map(')) {
    const offsets: number[] = [];
    for (let i = 0; i < n; i++) offsets.push(r.u64());
    const total = offsets.at(-1) ?? 0;
    let items: unknown[];
    if (type.startsWith('Array(')) items = readColumn(typeArgs(type)[0], total, r);
    else {
      const [k, v] = typeArgs(type);
      const keys = readColumn(k, total, r);
      const values = readColumn(v, total, r);
      items = keys.map((key, i) => [key, values[i]]);
    }
    let start = 0;
    for (const end of offsets) {
      const slice = items.slice(start, end);
      out.push(type.startsWith('Map(') ? Object.fromEntries(slice as Array<[string, unknown]>) : slice);
      start = end;
    }
  } else throw new Error(`test decoder: type ${type} not handled`);
  return out;
}

/** Rows of a Native stream, decoded for a client of `revision` (block info and custom flags when > 0). */
function decodeNative(buf: Buffer, revision: number): { names: string[]; types: string[]; rows: Array<Record<string, unknown>> } {
  const r = new Reader(buf);
  const rows: Array<Record<string, unknown>> = [];
  let names: string[] = [];
  let types: string[] = [];
  while (r.pos < buf.length) {
    if (revision > 0) {
      // block info: field 1 (is_overflows: bool), field 2 (bucket_num: Int32), 0
      for (let field = r.uvarint(); field !== 0; field = r.uvarint()) r.pos += field === 1 ? 1 : 4;
    }
    const columns = r.uvarint();
    const count = r.uvarint();
    names = [];
    types = [];
    const data: unknown[][] = [];
    for (let c = 0; c < columns; c++) {
      names.push(r.string());
      types.push(r.string());
      if (revision >= 54454) assert.equal(r.buf[r.pos++], 0, 'no custom serialization');
      if (count > 0) {
        readPrefix(types[c], r);
        data.push(readColumn(types[c], count, r));
      } else data.push([]);
    }
    for (let i = 0; i < count; i++) rows.push(Object.fromEntries(names.map((name, c) => [name, data[c][i]])));
  }
  return { names, types, rows };
}

describe('the SQL endpoint, end to end', () => {
  let server: TestServer;
  let tenantKey: string;
  const sqlUrl = () => `${server.url}/v1/admin/sql`;
  const admin = { authorization: basic('default', ADMIN_KEY) };
  const post = async (sql: string, query = '', headers: Record<string, string> = admin) => {
    const res = await fetch(`${sqlUrl()}/${query ? `?${query}` : ''}`, { method: 'POST', headers, body: sql });
    const body = Buffer.from(await res.arrayBuffer());
    return { status: res.status, headers: res.headers, body, text: body.toString('utf8') };
  };
  const get = async (query: string, headers: Record<string, string> = admin) => {
    const res = await fetch(`${sqlUrl()}/?${query}`, { headers });
    const body = Buffer.from(await res.arrayBuffer());
    return { status: res.status, headers: res.headers, body, text: body.toString('utf8') };
  };
  const json = async (sql: string) => {
    const res = await post(sql, 'default_format=JSONEachRow');
    assert.equal(res.status, 200, res.text);
    return res.text
      .split('\n')
      .filter(Boolean)
      .map((line) => JSON.parse(line));
  };
  /** What must not change under a refused statement. */
  const snapshot = async () => ({
    tables: await json("SELECT name, engine FROM system.tables WHERE database = 'default' ORDER BY name"),
    traceEvents: await json('SELECT count() AS n FROM trace_events'),
    setting: await json("SELECT getSetting('readonly') AS r, getSetting('max_execution_time') AS t"),
  });

  before(async () => {
    server = await startServer({
      SVC_RATE_LIMIT_READS: '0',
      SVC_RATE_LIMIT_WRITES: '0',
      SVC_SQL_MAX_EXECUTION_TIME: '2s',
      SVC_SQL_MAX_MEMORY: '200000000',
      ...(process.env.SVC_TEST_BWRAP ? { SVC_SANDBOX_HOST_ROOTFS: 'true' } : {}),
    });
    tenantKey = (await createTenantKey(server, 'acme')).key;
    const res = await server.request('POST', '/v1/traces', { key: tenantKey, body: { events: [traceEvent({ span_id: 'seed' })] } });
    assert.equal(res.status, 200, res.text);
  });
  after(async () => server?.cleanup());

  test('admin only: no key 401, a bad key 401, a tenant key 403; the admin key in every ClickHouse client style', async () => {
    const none = await get('query=SELECT%201', {});
    assert.equal(none.status, 401);
    assert.equal(none.headers.get('x-clickhouse-exception-code'), '194');
    assert.match(none.text, /^Code: 194\. DB::Exception: .*admin key.*\(REQUIRED_PASSWORD\)\n$/);
    const bad = await get('query=SELECT%201', { authorization: basic('default', 'not-the-key-0123456789') });
    assert.equal(bad.status, 401);
    assert.match(bad.text, /^Code: 516\. DB::Exception: .*\(AUTHENTICATION_FAILED\)/);
    const tenantStyles: Array<Record<string, string>> = [
      { authorization: basic('default', tenantKey) },
      { authorization: `Bearer ${tenantKey}` },
      { 'x-clickhouse-user': 'default', 'x-clickhouse-key': tenantKey },
    ];
    for (const headers of tenantStyles) {
      const res = await get('query=SELECT%201', headers);
      assert.equal(res.status, 403, JSON.stringify(headers));
      assert.equal(res.headers.get('x-clickhouse-exception-code'), '497');
      assert.match(res.text, /^Code: 497\. DB::Exception: .*admin key.*\(ACCESS_DENIED\)\n$/);
    }
    assert.equal((await get(`query=SELECT%201&user=default&password=${tenantKey}`, {})).status, 403);
    // The admin key: Basic (any user), X-ClickHouse-User/Key, user/password parameters, Bearer.
    for (const [query, headers] of [
      ['', { authorization: basic('default', ADMIN_KEY) }],
      ['', { authorization: basic('grafana', ADMIN_KEY) }],
      ['', { 'x-clickhouse-user': 'default', 'x-clickhouse-key': ADMIN_KEY }],
      [`&user=default&password=${ADMIN_KEY}`, {}],
      ['', { authorization: `Bearer ${ADMIN_KEY}` }],
    ] as Array<[string, Record<string, string>]>) {
      const res = await get(`query=SELECT%201${query}`, headers);
      assert.equal(res.status, 200, `${query} ${JSON.stringify(headers)}: ${res.text}`);
      assert.equal(res.text, '1\n');
    }
    // /ping answers like ClickHouse's, without a key.
    const ping = await fetch(`${sqlUrl()}/ping`);
    assert.equal(ping.status, 200);
    assert.equal(await ping.text(), 'Ok.\n');
  });

  test('a sandbox token is refused', { skip: process.env.SVC_TEST_BWRAP ? false : 'SVC_TEST_BWRAP is unset (no sandboxes here)' }, async () => {
    const spec = 'version: 1\nid: sql-probe\nbase: debian:bookworm\ntask:\n  prompt: x\ninvariants:\n  ok:\n    check: {type: command_exit, command: "true"}\n';
    const put = await server.request('POST', '/v1/specs', { key: tenantKey, body: spec, headers: { 'content-type': 'application/x-yaml' } });
    assert.ok(put.status === 201 || put.status === 200, put.text);
    const sb = await server.request('POST', '/v1/sandboxes', { key: tenantKey, body: { spec_id: 'sql-probe' } });
    assert.equal(sb.status, 201, sb.text);
    try {
      const out = await server.request('POST', `/v1/sandboxes/${sb.body.id}/commands`, {
        key: tenantKey,
        body: { command: 'printf %s "$SVC_API_KEY" | base64' },
      });
      const token = Buffer.from(out.body.stdout, 'base64').toString();
      assert.match(token, /^svc_sb_/);
      for (const headers of [{ authorization: `Bearer ${token}` }, { authorization: basic('default', token) }] as Array<Record<string, string>>) {
        const res = await get('query=SELECT%201', headers);
        assert.equal(res.status, 403, res.text);
        assert.match(res.text, /\(ACCESS_DENIED\)/);
      }
    } finally {
      await server.request('DELETE', `/v1/sandboxes/${sb.body.id}`, { key: tenantKey });
    }
  });

  test('every write, state change, file or network access and limit change is refused, and nothing changes', async () => {
    const before = await snapshot();
    const outfile = join(mkdtempSync(join(tmpdir(), 'svc-sql-')), 'out.txt');
    const refused: Array<[string, RegExp]> = [
      ["INSERT INTO trace_events (TenantId, EventId) VALUES ('x', 'y')", /READONLY/],
      ['CREATE TABLE evil (a UInt8) ENGINE = Memory', /READONLY/],
      ['CREATE TEMPORARY TABLE evil (a UInt8)', /READONLY/],
      ['DROP TABLE trace_events', /READONLY/],
      ['ALTER TABLE trace_events DELETE WHERE 1', /READONLY/],
      ['ALTER TABLE trace_events MODIFY TTL toDateTime(Timestamp) + INTERVAL 1 DAY', /READONLY/],
      ['TRUNCATE TABLE trace_events', /READONLY/],
      ['DELETE FROM trace_events WHERE 1', /READONLY/],
      ['RENAME TABLE trace_events TO gone', /READONLY/],
      ['SYSTEM DROP MARK CACHE', /READONLY/],
      ['SYSTEM STOP MERGES', /READONLY/],
      ['KILL QUERY WHERE 1', /READONLY/],
      ['OPTIMIZE TABLE trace_events FINAL', /READONLY/],
      ['SET readonly = 0', /READONLY/],
      ['SET max_execution_time = 1000', /READONLY/],
      ['USE system', /READONLY/],
      ['SELECT 1 SETTINGS readonly = 0', /Cannot modify 'readonly' setting in readonly mode.*\(READONLY\)/],
      ['SELECT 1 SETTINGS max_execution_time = 1000', /Cannot modify 'max_execution_time' setting in readonly mode/],
      ['SELECT 1 SETTINGS max_memory_usage = 0', /Cannot modify 'max_memory_usage' setting in readonly mode/],
      ["SELECT * FROM file('/etc/passwd', 'LineAsString')", /file\(\) reads files or the network/],
      ["SELECT * FROM `file`('/etc/passwd', 'LineAsString')", /reads files or the network/],
      ["DESCRIBE TABLE file('/etc/passwd', 'LineAsString')", /reads files or the network/],
      ["SELECT file('/etc/passwd')", /reads files or the network/],
      ["SELECT * FROM url('http://127.0.0.1:1/', 'LineAsString')", /url\(\) reads files or the network/],
      ["SELECT * FROM s3('http://127.0.0.1:1/bucket/x.csv', 'CSV', 'a String')", /s3\(\) reads/],
      ["SELECT * FROM remote('127.0.0.1:9000', system.one)", /remote\(\) reads/],
      ["SELECT * FROM mysql('127.0.0.1:1', 'db', 't', 'u', 'p')", /mysql\(\) reads/],
      ["SELECT * FROM executable('ls', 'TSV', 'a String')", /executable\(\) reads/],
      ["SELECT * FROM filesystem('/')", /filesystem\(\) reads/],
      ["SELECT * FROM input('a String')", /input\(\) reads/],
      [`SELECT 1 INTO OUTFILE '${outfile}'`, /INTO OUTFILE/],
      ['SELECT 1; DROP TABLE trace_events', /Multi-statements are not allowed.*\(SYNTAX_ERROR\)/],
      ['SELECT 1; KILL QUERY WHERE 1', /Multi-statements/],
    ];
    for (const [sql, message] of refused) {
      const res = await post(sql);
      assert.ok(res.status >= 400 && res.status < 500, `${sql}: ${res.status} ${res.text}`);
      assert.match(res.text, /^Code: \d+\. DB::Exception: .+\n$/, sql);
      assert.match(res.text, message, sql);
      assert.equal(res.headers.get('x-clickhouse-exception-code'), /^Code: (\d+)/.exec(res.text)![1]);
    }
    // Settings in the URL: the read-only mode stays, the limits can be lowered, not lifted.
    for (const query of ['readonly=0', 'max_memory_usage_for_user=0', 'allow_ddl=1', 'send_logs_level=trace']) {
      const res = await post('SELECT 1', query);
      assert.equal(res.status, 403, `${query}: ${res.text}`);
      assert.match(res.text, /Cannot modify '\w+' setting in readonly mode\. \(READONLY\)/);
    }
    assert.equal(existsSync(outfile), false);
    rmSync(join(outfile, '..'), { recursive: true, force: true });
    assert.deepEqual(await snapshot(), before);
    assert.deepEqual(before.setting, [{ r: 1, t: 2 }]);
  });

  test('formats: JSON, JSONEachRow, TabSeparated, CSV, Native as chDB writes it; FORMAT wins over default_format', async () => {
    const sql = "SELECT number AS n, toString(number) AS s, [number, number * 2] AS a, map('k', toString(number)) AS m FROM numbers(3)";
    const tsv = await post(sql);
    assert.equal(tsv.status, 200);
    assert.equal(tsv.headers.get('x-clickhouse-format'), 'TabSeparated');
    assert.match(tsv.headers.get('content-type')!, /tab-separated-values/);
    assert.equal(tsv.text, "0\t0\t[0,0]\t{'k':'0'}\n1\t1\t[1,2]\t{'k':'1'}\n2\t2\t[2,4]\t{'k':'2'}\n");
    const csv = await post(`${sql} FORMAT CSV`, 'default_format=JSONEachRow');
    assert.equal(csv.headers.get('x-clickhouse-format'), 'CSV');
    assert.equal(csv.text.split('\n')[1], `1,"1","[1,2]","{'k':'1'}"`);
    const each = await post(sql, 'default_format=JSONEachRow');
    assert.equal(each.headers.get('x-clickhouse-format'), 'JSONEachRow');
    assert.deepEqual(JSON.parse(each.text.split('\n')[2]), { n: '2', s: '2', a: ['2', '4'], m: { k: '2' } });
    const full = await post(`${sql} FORMAT JSON`);
    assert.equal(full.headers.get('x-clickhouse-format'), 'JSON');
    const doc = JSON.parse(full.text);
    assert.deepEqual(
      doc.meta.map((m: { name: string }) => m.name),
      ['n', 's', 'a', 'm'],
    );
    assert.equal(doc.rows, 3);
    // Binary formats: the engine's bytes, untouched.
    const dir = mkdtempSync(join(tmpdir(), 'svc-sql-chdb-'));
    const local = new Session(dir);
    try {
      for (const format of ['Native', 'RowBinaryWithNamesAndTypes']) {
        const expected = Buffer.from((await local.queryAsync(sql, { format })).bytes());
        const viaDefault = await post(sql, `default_format=${format}`);
        assert.equal(viaDefault.status, 200);
        assert.equal(viaDefault.headers.get('content-type'), 'application/octet-stream');
        assert.ok(viaDefault.body.equals(expected), `${format} bytes differ`);
        const viaClause = await post(`${sql} FORMAT ${format}`, 'default_format=JSON');
        assert.ok(viaClause.body.equals(expected), `${format} (FORMAT clause) bytes differ`);
      }
      // Native for a client that announces its revision (clickhouse-go): the same values, framed for it.
      const framed = await post(sql, `default_format=Native&client_protocol_version=${CLICKHOUSE_GO_REVISION}`);
      assert.equal(framed.status, 200);
      const plain = decodeNative(Buffer.from((await local.queryAsync(sql, { format: 'Native' })).bytes()), 0);
      assert.deepEqual(decodeNative(framed.body, CLICKHOUSE_GO_REVISION), plain);
      assert.deepEqual(plain.rows[1], { n: '1', s: '1', a: ['1', '2'], m: { k: '1' } });
    } finally {
      local.close();
      rmSync(dir, { recursive: true, force: true });
    }
    // Compression as ClickHouse does it: enable_http_compression=1 and Accept-Encoding.
    const res = await fetch(`${sqlUrl()}/?enable_http_compression=1`, { method: 'POST', headers: { ...admin, 'accept-encoding': 'gzip' }, body: 'SELECT 42' });
    assert.equal(res.headers.get('content-encoding'), 'gzip');
    assert.equal(await res.text(), '42\n'); // fetch decodes gzip
    const raw = await new Promise<Buffer>((resolve, reject) => {
      import('node:http').then(({ request }) => {
        const url = new URL(`${sqlUrl()}/?enable_http_compression=1&query=SELECT%2042`);
        const req = request(url, { headers: { ...admin, 'accept-encoding': 'gzip' } }, (r) => {
          const chunks: Buffer[] = [];
          r.on('data', (c) => chunks.push(c));
          r.on('end', () => resolve(Buffer.concat(chunks)));
        });
        req.on('error', reject);
        req.end();
      });
    });
    assert.equal(gunzipSync(raw).toString(), '42\n');
  });

  test('queries: GET ?query=, POST body, the two joined; param_ binding; URL settings; database; headers', async () => {
    assert.equal((await get('query=SELECT%20number%20FROM%20numbers(3)%20WHERE')).status, 400);
    const joined = await post('number > 0', 'query=SELECT%20number%20FROM%20numbers(3)%20WHERE');
    assert.equal(joined.status, 200, joined.text);
    assert.equal(joined.text, '1\n2\n');
    const bound = await post(
      'SELECT {x:UInt32} + 1 AS y, {arr:Array(String)} AS a, {s:String} AS s FORMAT JSONEachRow',
      `param_x=41&param_arr=${encodeURIComponent("['a','b']")}&param_s=${encodeURIComponent("it's")}`,
    );
    assert.equal(bound.status, 200, bound.text);
    assert.deepEqual(JSON.parse(bound.text), { y: '42', a: ['a', 'b'], s: "it's" });
    const missing = await post('SELECT {x:UInt32}');
    assert.equal(missing.status, 400);
    assert.match(missing.text, /^Code: 456\. .*\(UNKNOWN_QUERY_PARAMETER\)\n$/);
    const badValue = await post('SELECT {x:UInt32}', 'param_x=abc');
    assert.equal(badValue.status, 400);
    assert.match(badValue.text, /\(BAD_QUERY_PARAMETER\)/);
    // Settings from the URL; the limits may be lowered, never lifted.
    const settings = await post(
      "SELECT getSetting('max_threads') AS threads, getSetting('readonly') AS ro, getSetting('max_execution_time') AS t, getSetting('max_memory_usage') AS mem FORMAT JSONEachRow",
      'max_threads=1&max_execution_time=1000&max_memory_usage=100000&readonly=1',
    );
    assert.equal(settings.status, 200, settings.text);
    assert.deepEqual(JSON.parse(settings.text), { threads: 1, ro: 1, t: 2, mem: 100000 });
    const lower = await post("SELECT getSetting('max_execution_time') AS t FORMAT JSONEachRow", 'max_execution_time=1');
    assert.deepEqual(JSON.parse(lower.text), { t: 1 });
    const unknown = await post('SELECT 1', 'no_such_setting=1');
    assert.equal(unknown.status, 404);
    assert.match(unknown.text, /^Code: 115\. .*no_such_setting.*\(UNKNOWN_SETTING\)/);
    // database
    const db = await post('SELECT currentDatabase() AS d, count() > 0 AS has FROM tables', 'database=system&default_format=JSONEachRow');
    assert.equal(db.status, 200, db.text);
    assert.deepEqual(JSON.parse(db.text), { d: 'system', has: 1 });
    const noDb = await post('SELECT 1', 'database=nope');
    assert.equal(noDb.status, 404);
    assert.match(noDb.text, /\(UNKNOWN_DATABASE\)/);
    // Response headers clients read.
    const res = await post('SELECT 1', 'query_id=my-query-1');
    assert.equal(res.headers.get('x-clickhouse-query-id'), 'my-query-1');
    assert.equal(res.headers.get('x-clickhouse-timezone'), 'UTC');
    assert.ok(res.headers.get('x-clickhouse-server-display-name'));
    const summary = JSON.parse(res.headers.get('x-clickhouse-summary')!);
    assert.equal(typeof summary.read_rows, 'string');
    assert.equal(typeof summary.elapsed_ns, 'string');
  });

  test('limits: max_execution_time answers TIMEOUT_EXCEEDED quickly; the memory and result limits hold', async () => {
    for (const sql of ['SELECT count() FROM numbers(1e12)', 'SELECT count() FROM system.numbers WHERE sleepEachRow(0)']) {
      const started = Date.now();
      const res = await post(sql);
      const ms = Date.now() - started;
      assert.equal(res.status, 400, res.text);
      assert.equal(res.headers.get('x-clickhouse-exception-code'), '159');
      // ClickHouse names the processor it stopped in when the limit hits inside one (`: While executing NumbersRange`).
      assert.match(res.text, /^Code: 159\. DB::Exception: Timeout exceeded: elapsed .*maximum: 2000 ms(: While executing \w+)?\. \(TIMEOUT_EXCEEDED\)\n$/);
      assert.ok(ms < 6000, `answered after ${ms} ms`);
    }
    const memory = await post('SELECT groupArray(number) FROM numbers(100000000)');
    assert.equal(memory.status, 400, memory.text);
    assert.match(memory.text, /^Code: 241\. .*memory limit exceeded.*\(MEMORY_LIMIT_EXCEEDED\)\n$/i);
    const result = await post('SELECT number FROM numbers(100000)', 'max_result_bytes=1000');
    assert.equal(result.status, 400);
    assert.match(result.text, /\(TOO_MANY_ROWS_OR_BYTES\)/);
    // The service's own reads and writes are not held up meanwhile.
    const slow = post('SELECT count() FROM numbers(1e12)');
    const started = Date.now();
    const api = await server.request('GET', '/v1/traces?limit=1', { key: tenantKey });
    assert.equal(api.status, 200);
    assert.ok(Date.now() - started < 1000, 'an API read waited behind an analyst query');
    await slow;
  });

  test('bad input: clear 4xx errors in ClickHouse form, never a 500', async () => {
    const cases: Array<[string, number, RegExp]> = [
      ['SELEC 1', 400, /^Code: 62\. .*Syntax error/],
      ['SELECT (', 400, /^Code: 62\./],
      ['', 400, /Empty query/],
      ['   -- only a comment', 400, /Empty query/],
      ["SELECT 'unterminated", 400, /^Code: 62\./],
      ['SELECT * FROM no_such_table', 404, /^Code: 60\. .*\(UNKNOWN_TABLE\)/],
      ['SELECT no_such_function(1)', 404, /^Code: 46\./],
      ['SELECT 1 FORMAT NoSuchFormat', 404, /\(UNKNOWN_FORMAT\)/],
      ["SELECT toUInt8('x')", 400, /^Code: \d+\./],
      ['\u0000\u0001binary', 400, /^Code: 62\./],
    ];
    for (const [sql, status, message] of cases) {
      const res = await post(sql);
      assert.equal(res.status, status, `${JSON.stringify(sql)}: ${res.text}`);
      assert.match(res.text, message, sql);
    }
    assert.equal((await post('SELECT 1', 'default_format=Nope')).status, 404);
    assert.equal((await post('SELECT 1', 'compress=1')).status, 400);
    assert.equal((await post('SELECT 1', 'client_protocol_version=abc')).status, 400);
    const put = await fetch(`${sqlUrl()}/`, { method: 'PUT', headers: admin, body: 'SELECT 1' });
    assert.equal(put.status, 405);
    const elsewhere = await fetch(`${sqlUrl()}/replicas_status`, { headers: admin });
    assert.equal(elsewhere.status, 404);
    // A JSON content type is not parsed as JSON here.
    const typed = await post('SELECT 7', '', { ...admin, 'content-type': 'application/json' });
    assert.equal(typed.text, '7\n');
  });

  test('@clickhouse/client connects with url and pathname and queries the tables', async () => {
    const client = createClient({
      url: server.url,
      pathname: '/v1/admin/sql',
      username: 'default',
      password: ADMIN_KEY,
      log: { level: ClickHouseLogLevel.OFF },
    });
    try {
      assert.equal((await client.ping()).success, true);
      const rows = await (
        await client.query({
          query: 'SELECT TenantId, count() AS n FROM trace_events WHERE TenantId = {tenant:String} GROUP BY TenantId',
          query_params: { tenant: 'acme' },
          format: 'JSONEachRow',
        })
      ).json<{ TenantId: string; n: string }>();
      assert.equal(rows.length, 1);
      assert.equal(rows[0].TenantId, 'acme');
      assert.ok(Number(rows[0].n) >= 1);
      const tables = await (await client.query({ query: 'SHOW TABLES', format: 'JSONEachRow' })).json<{ name: string }>();
      for (const t of [
        'trace_events',
        'otel_traces',
        'otel_traces_trace_id_ts',
        'sandboxes',
        'experiments',
        'run_scores',
        'scores',
        'agent_snapshots',
        'dead_letters',
      ]) {
        assert.ok(
          tables.some((r) => r.name === t),
          `${t} is listed`,
        );
      }
      await assert.rejects(
        client.command({ query: 'DROP TABLE trace_events' }),
        (err: Error & { code?: string; type?: string }) => err.code === '164' && err.type === 'READONLY',
      );
      await assert.rejects(client.query({ query: 'SELECT * FROM nope', format: 'JSONEachRow' }), (err: Error & { code?: string }) => err.code === '60');
    } finally {
      await client.close();
    }
  });

  test("Grafana's trace-view query, sent as clickhouse-go sends it, returns the spans ingested", async () => {
    const t0 = Date.parse('2026-11-01T10:00:00.000Z');
    const at = (ms: number) => new Date(t0 + ms).toISOString();
    const trace = 'abcdefg';
    const res = await server.request('POST', '/v1/traces', {
      key: tenantKey,
      body: {
        events: [
          traceEvent({ trace_id: trace, span_id: 'root', ts: at(0), phase: 'start', tool: 'agent', duration_ms: 0, metadata: { task: 'fix' } }),
          traceEvent({
            trace_id: trace,
            span_id: 'llm',
            parent_span_id: 'root',
            ts: at(10),
            phase: 'complete',
            event_type: 'llm_call',
            tool: 'openai.create',
            duration_ms: 40,
            metadata: { model: 'gpt-4o' },
          }),
          traceEvent({
            trace_id: trace,
            span_id: 'bash',
            parent_span_id: 'root',
            ts: at(60),
            phase: 'complete',
            tool: 'bash',
            duration_ms: 25,
            status: 'error',
          }),
          traceEvent({ trace_id: trace, span_id: 'open', parent_span_id: 'bash', ts: at(70), phase: 'start', tool: 'grep', duration_ms: 0 }),
          // another trace: not in the result
          traceEvent({ trace_id: 'other', span_id: 'x', ts: at(5) }),
        ],
      },
    });
    assert.equal(res.status, 200, res.text);
    const end = await server.request('POST', '/v1/traces', {
      key: tenantKey,
      body: {
        events: [
          traceEvent({
            trace_id: trace,
            span_id: 'root',
            ts: at(500),
            phase: 'end',
            tool: 'agent',
            duration_ms: 500,
            status: 'ok',
            metadata: { outcome: 'done' },
          }),
        ],
      },
    });
    assert.equal(end.status, 200, end.text);

    // clickhouse-go (conn_http.go): POST to the path with default_format=Native and
    // client_protocol_version, the query as the body, Basic auth from the URL's user info, and
    // Accept-Encoding: gzip (Grafana's plugin sets gzip compression for HTTP).
    const goRequest = async (sql: string) => {
      const r = await fetch(`${sqlUrl()}?database=default&default_format=Native&client_protocol_version=${CLICKHOUSE_GO_REVISION}`, {
        method: 'POST',
        headers: {
          authorization: basic('default', ADMIN_KEY),
          'accept-encoding': 'gzip',
          'user-agent': 'clickhouse-go/2 (lv:go/1.24; os:linux) grafana-datasource',
        },
        body: sql,
      });
      const body = Buffer.from(await r.arrayBuffer());
      assert.equal(r.status, 200, body.toString());
      return body;
    };
    // Its connect-time hello and its ping.
    const hello = decodeNative(await goRequest('SELECT displayName(), version(), revision(), timezone()'), CLICKHOUSE_GO_REVISION);
    assert.equal(hello.rows.length, 1);
    const revision = Number(Object.values(hello.rows[0])[2]);
    assert.ok(revision >= 54454, `server revision ${revision}`);
    const ping = decodeNative(await goRequest('SELECT 1'), revision);
    assert.deepEqual(ping.names, ['1']);

    const native = decodeNative(await goRequest(GRAFANA_TRACE_QUERY), revision);
    assert.deepEqual(native.names, [
      'traceID',
      'spanID',
      'parentSpanID',
      'serviceName',
      'operationName',
      'startTime',
      'duration',
      'tags',
      'serviceTags',
      'statusCode',
    ]);
    const bySpan = Object.fromEntries(native.rows.map((r) => [r.spanID, r]));
    assert.deepEqual(Object.keys(bySpan).sort(), ['bash', 'llm', 'open', 'root']);
    const tags = (pairs: Record<string, string>) => Object.entries(pairs).map(([key, value]) => ({ key, value }));
    const expected = {
      root: { parentSpanID: '', operationName: 'agent', startTime: t0, duration: 500, tags: tags({ task: 'fix', outcome: 'done' }), statusCode: 0 },
      llm: { parentSpanID: 'root', operationName: 'openai.create', startTime: t0 + 10, duration: 40, tags: tags({ model: 'gpt-4o' }), statusCode: 0 },
      bash: { parentSpanID: 'root', operationName: 'bash', startTime: t0 + 60, duration: 25, tags: [], statusCode: 2 },
      open: { parentSpanID: 'bash', operationName: 'grep', startTime: t0 + 70, duration: 0, tags: [], statusCode: 0 },
    };
    for (const [span, want] of Object.entries(expected)) {
      const row = bySpan[span];
      assert.equal(row.traceID, trace);
      assert.equal(row.serviceName, '');
      assert.deepEqual(row.serviceTags, []);
      assert.equal(row.parentSpanID, want.parentSpanID, span);
      assert.equal(row.operationName, want.operationName, span);
      assert.ok(Math.abs((row.startTime as number) - want.startTime) < 0.001, `${span} startTime ${row.startTime}`);
      assert.ok(Math.abs((row.duration as number) - want.duration) < 1e-9, `${span} duration ${row.duration}`);
      assert.deepEqual(
        (row.tags as Array<Record<string, string>>).map((t) => ({ key: t.key, value: t.value })).sort((a, b) => a.key.localeCompare(b.key)),
        want.tags.sort((a, b) => a.key.localeCompare(b.key)),
        span,
      );
      assert.equal(row.statusCode, want.statusCode, span);
    }
    // The same query in JSON gives the same rows.
    const jsonRows = await json(GRAFANA_TRACE_QUERY);
    assert.equal(jsonRows.length, native.rows.length);
    for (const row of jsonRows) {
      const n = bySpan[row.spanID];
      assert.equal(row.parentSpanID, n.parentSpanID);
      assert.equal(row.operationName, n.operationName);
      assert.equal(row.startTime, n.startTime);
      assert.equal(row.duration, n.duration);
      assert.deepEqual(row.tags, n.tags);
    }
    // otel_traces' own columns for the in-progress span.
    const [open] = await json("SELECT InProgress, StatusCode, Duration, TenantId FROM otel_traces WHERE TraceId = 'abcdefg' AND SpanId = 'open'");
    assert.deepEqual(open, { InProgress: 1, StatusCode: 'Unset', Duration: '0', TenantId: 'acme' });
  });
});

describe("analyst queries on libuv's default pool (a process started without bin/threadpool.cjs)", () => {
  let server: TestServer;
  before(async () => {
    server = await startServer({ UV_THREADPOOL_SIZE: '4', SVC_RATE_LIMIT_READS: '0', SVC_RATE_LIMIT_WRITES: '0' });
  });
  after(async () => server?.cleanup());

  test("as many analyst queries as may run at once (4, the pool's threads) do not hold up the log: a durable ingest is answered while they sleep", async () => {
    const key = (await createTenantKey(server, 'acme')).key;
    const settled: string[] = [];
    const sleeping = Array.from({ length: 4 }, (_, i) =>
      fetch(`${server.url}/v1/admin/sql/`, { method: 'POST', headers: { authorization: basic('default', ADMIN_KEY) }, body: 'SELECT sleep(3)' }).then(
        async (res) => {
          settled.push(`query ${i}: ${res.status}`);
          return res.text();
        },
      ),
    );
    await new Promise((resolve) => setTimeout(resolve, 500)); // the four are in the engine or queued for it
    // Answered once the log holds the events: needs the file system (append, fsync), not the engine.
    const ingest = await server.request('POST', '/v1/traces', { key, headers: { prefer: 'respond-async' }, body: { events: [traceEvent()] } });
    settled.push(`ingest: ${ingest.status}`);
    await Promise.all(sleeping);
    assert.equal(settled[0], 'ingest: 202', `the durable ingest waited behind the analysts' queries: ${settled.join(', ')}`);
    assert.deepEqual(
      settled.slice(1).map((s) => s.replace(/^query \d/, 'query')),
      ['query: 200', 'query: 200', 'query: 200', 'query: 200'],
    );
  });
});

describe('the SQL path proxied to a ClickHouse server (SVC_STORE=clickhouse)', () => {
  const url = process.env.SVC_TEST_CLICKHOUSE_URL;
  test('the engine bytes in the asked format, readonly and the limits enforced by the server', {
    skip: url ? false : 'SVC_TEST_CLICKHOUSE_URL is unset (npm test starts a ClickHouse server)',
  }, async () => {
    const store = new ClickHouseStore({ url: url! });
    const enforced: Array<[string, string]> = [
      ['readonly', '1'],
      ['max_execution_time', '2'],
      ['max_memory_usage', '200000000'],
      ['max_result_bytes', '1000000'],
    ];
    const run = (sql: string, format = 'TabSeparated', extra: Array<[string, string]> = []) =>
      store.rawQuery({ sql, format, settings: [...extra, ...enforced], params: {}, queryId: `q-${Math.random()}` });
    try {
      assert.equal(Buffer.from((await run('SELECT 1 AS x, 2 AS y')).bytes).toString(), '1\t2\n');
      assert.equal(Buffer.from((await run('SELECT 1 AS x FORMAT JSONEachRow', 'TabSeparated')).bytes).toString(), '{"x":1}\n');
      const native = Buffer.from((await run('SELECT 1 AS x', 'Native')).bytes);
      assert.deepEqual(decodeNative(native, 0).rows, [{ x: 1 }]);
      assert.equal(
        Buffer.from(
          (await run("SELECT name, value FROM system.settings WHERE name IN ('readonly', 'max_threads') ORDER BY name", 'TabSeparated', [['max_threads', '1']]))
            .bytes,
        ).toString(),
        'max_threads\t1\nreadonly\t1\n',
      );
      for (const sql of ['CREATE TABLE sql_probe (a UInt8) ENGINE = Memory', 'SELECT 1 SETTINGS readonly = 0', 'SELECT 1 SETTINGS max_execution_time = 1000']) {
        await assert.rejects(
          run(sql),
          (err: unknown) => err instanceof StoreQueryError && err.clickhouseCode === 164 && /^Code: 164\. DB::Exception: /.test(err.message),
          sql,
        );
      }
      await assert.rejects(run('SELECT count() FROM system.numbers'), (err: unknown) => err instanceof StoreQueryError && err.clickhouseCode === 159);
      await assert.rejects(run('SELECT * FROM nope'), (err: unknown) => err instanceof StoreQueryError && err.clickhouseCode === 60);
      await assert.rejects(run('SELECT no_such_function()'), (err: unknown) => err instanceof StoreQueryError && err.clickhouseCode === 46);
      await assert.rejects(
        store.rawQuery({ sql: 'SELECT 1', format: 'TabSeparated', settings: enforced, params: {}, queryId: 'q', database: 'another_db' }),
        (err: unknown) => err instanceof StoreQueryError && err.clickhouseCode === 81,
      );
    } finally {
      await store.close();
    }
  });
});
