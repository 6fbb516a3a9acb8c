/**
 * Red team: reading another tenant's rows through SQL. The analysts' endpoint (/v1/admin/sql)
 * reads every tenant's tables, so only the admin key may use it. Pins: tenant B's key and the
 * token an agent holds in B's sandbox, in every way a ClickHouse client sends a password (and
 * from inside the sandbox, as the agent would), get 403 ACCESS_DENIED for every query that would
 * reach tenant A's rows (table functions, system tables, SETTINGS, comments, several statements,
 * subqueries), and the answer carries none of them; and the tenants' own read endpoints bind
 * their filters as parameters, so SQL in a filter finds nothing of A. The same query with the
 * admin key does find A's row: the marker is there to be found.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { backend } from '../helpers/backend.ts';
import { SPEC, storeSpec } from '../helpers/sandboxes.ts';
import { ADMIN_KEY, createTenantKey, startServer, traceEvent, type TestServer } from '../helpers/server.ts';

const MARKER = `tenant-a-secret-${Date.now()}`;
const basic = (user: string, password: string) => `Basic ${Buffer.from(`${user}:${password}`).toString('base64')}`;

const QUERIES = [
  `SELECT * FROM trace_events WHERE Input LIKE '%${MARKER}%'`,
  'SELECT * FROM otel_traces',
  `SELECT * FROM merge(currentDatabase(), '.*')`,
  "SELECT * FROM remote('127.0.0.1', default.trace_events)",
  "SELECT * FROM url('http://127.0.0.1:9/x', 'JSONEachRow', 'a String')",
  "SELECT * FROM file('/etc/passwd', 'LineAsString')",
  'SELECT query FROM system.query_log',
  'SELECT name FROM system.tables',
  'SELECT 1 SETTINGS readonly = 0',
  '/* tenant = B */ SELECT * FROM trace_events -- only mine',
  'SELECT 1; SELECT * FROM trace_events',
  "SELECT count() FROM (SELECT * FROM trace_events WHERE TenantId != 'b')",
  'SELECT sleep(3)',
];

const runtime = backend('SVC_TEST_BWRAP', 'SQL against another tenant on the local runtime');

describe("red team: SQL that reaches another tenant's rows", { skip: !runtime }, () => {
  let server: TestServer;
  let keyB: string;
  let sandboxB: string;
  let tokenB: string;

  const sql = async (query: string, headers: Record<string, string>, params = '') => {
    const res = await fetch(`${server.url}/v1/admin/sql/?${params}`, { method: 'POST', headers, body: query });
    return { status: res.status, text: await res.text() };
  };

  before(async () => {
    server = await startServer({ SVC_SANDBOX_HOST_ROOTFS: 'true', SVC_RATE_LIMIT_WRITES: '0', SVC_RATE_LIMIT_READS: '0' });
    const keyA = (await createTenantKey(server, 'tenant-a')).key;
    keyB = (await createTenantKey(server, 'tenant-b')).key;
    const ingested = await server.request('POST', '/v1/traces', {
      key: keyA,
      body: { events: [traceEvent({ tool: MARKER, input: MARKER, metadata: { note: MARKER } })] },
    });
    assert.equal(ingested.status, 200, ingested.text);
    await storeSpec(server, keyB, SPEC('sql-red'));
    const sb = await server.request('POST', '/v1/sandboxes', { key: keyB, body: { spec_id: 'sql-red' } });
    assert.equal(sb.status, 201, sb.text);
    sandboxB = sb.body.id;
    tokenB = (await server.request('POST', `/v1/sandboxes/${sandboxB}/commands`, { key: keyB, body: { command: 'printf %s "$SVC_API_KEY"' } })).body.stdout;
    assert.match(tokenB, /^svc_sb_/);
    // The marker is stored, and the admin's SQL finds it: what the refusals below keep from B.
    for (let i = 0; ; i++) {
      const admin = await sql(QUERIES[0]!, { authorization: `Bearer ${ADMIN_KEY}` });
      if (admin.status === 200 && admin.text.includes(MARKER)) break;
      assert.ok(i < 100, `the admin never saw the marker: ${admin.status} ${admin.text.slice(0, 300)}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  });
  after(async () => server?.cleanup());

  test("tenant B's key and B's sandbox token, in every credential style: 403 for every query, nothing of A", async () => {
    for (const [who, secret] of [
      ['tenant key', keyB],
      ['sandbox token', tokenB],
    ] as const) {
      const styles: Array<[Record<string, string>, string]> = [
        [{ authorization: `Bearer ${secret}` }, ''],
        [{ authorization: basic('default', secret) }, ''],
        [{ authorization: basic('admin', secret) }, ''],
        [{ 'x-clickhouse-user': 'default', 'x-clickhouse-key': secret }, ''],
        [{}, `user=default&password=${encodeURIComponent(secret)}`],
        [{ authorization: `Bearer ${secret}` }, 'readonly=0&max_execution_time=0&database=system'],
      ];
      for (const [headers, params] of styles) {
        for (const query of QUERIES) {
          const started = Date.now();
          const res = await sql(query, headers, params);
          const what = `${who} ${JSON.stringify(Object.keys(headers))} ${params}: ${query}`;
          assert.equal(res.status, 403, `${what}: ${res.text.slice(0, 300)}`);
          assert.match(res.text, /^Code: 497\. DB::Exception: .*\(ACCESS_DENIED\)\n$/, what);
          assert.ok(!res.text.includes(MARKER), what);
          assert.ok(Date.now() - started < 2000, `${what}: refused before it ran`);
        }
      }
    }
  });

  test('from inside the sandbox, as its agent would: refused', async () => {
    const command = `curl -s -o /dev/null -w '%{http_code}' -u "default:$SVC_API_KEY" "$SVC_BASE_URL/v1/admin/sql/" --data-binary "SELECT * FROM trace_events WHERE Input LIKE '%${MARKER}%'"; echo; curl -s -H "Authorization: Bearer $SVC_API_KEY" "$SVC_BASE_URL/v1/admin/sql/?query=SELECT+Input+FROM+trace_events"`;
    const res = await server.request('POST', `/v1/sandboxes/${sandboxB}/commands`, { key: keyB, body: { command } });
    assert.equal(res.status, 200, res.text);
    const [status, body] = String(res.body.stdout).split('\n');
    assert.equal(status, '403', res.body.stdout);
    assert.match(body ?? '', /\(ACCESS_DENIED\)/, res.body.stdout);
    assert.ok(!String(res.body.stdout).includes(MARKER));
  });

  test("SQL in the tenants' own filters is a value, not SQL: nothing of A", async () => {
    const injections = [`' OR 1=1 --`, `x' OR TenantId != 'tenant-b`, `') OR ('1'='1`, `{tenant:String}`, `\\' OR 1=1 #`];
    for (const bad of injections) {
      const q = encodeURIComponent(bad);
      for (const path of [`/v1/traces?tool=${q}`, `/v1/traces?agent=${q}`, `/v1/traces?experiment_id=${q}`, `/v1/traces/spans?tool=${q}`, `/v1/traces/${q}`]) {
        const res = await server.request('GET', path, { key: keyB });
        assert.ok(res.status === 200 || res.status === 400 || res.status === 404, `${path}: ${res.status} ${res.text.slice(0, 300)}`);
        assert.ok(!res.text.includes(MARKER), `${path} answered A's row: ${res.text.slice(0, 300)}`);
        if (res.status === 200) assert.equal(res.body.items.length, 0, `${path}: ${res.text.slice(0, 300)}`);
      }
    }
  });
});
