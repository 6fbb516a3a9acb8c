/**
 * Red team: a sandbox's secret values. They leaked through trace metadata keys (values were
 * redacted, keys not), as the beginning of a value cut by a limit (the 1 MiB capture of a
 * command's output, the trace field limit), and in plain text on disk: the command text on
 * svc.sandbox-requests, file contents on svc.sandbox-replies, traces on svc.traces and the chDB
 * parts. Now every string of a trace event is redacted, text is redacted before it is cut and a
 * cut drops a secret's beginning, and the requests and replies are sealed on the log: a copy of
 * the data dir holds neither the value nor its first half. The files API returns a file the
 * agent wrote as it is (the agent's data, docs/sandboxes.md).
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { readdir, readFile } from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { adminSql, createTenantKey, startServer, traceEvent, type TestServer } from '../helpers/server.ts';
import { backend } from '../helpers/backend.ts';

const SECRET = `sr-${randomBytes(16).toString('hex')}`;
/** A leak of the first half is a leak too (a value cut at a limit). */
const HALF = SECRET.slice(0, Math.ceil(SECRET.length / 2));
const MIB = 1024 * 1024;
const CHUNK = 64 * 1024;
const FIELD = 4096;

const SPEC = `version: 1
id: leaky
base: debian:bookworm
task:
  prompt: leak the token
invariants:
  tests_pass:
    check: {type: command_exit, command: "true"}
audit:
  stdout_capture: true
`;

/** Names what of `text` would leak: the value or its first half. */
function leaks(text: string | Buffer): string[] {
  return [SECRET, HALF].filter((s) => text.includes(s));
}

async function sse(url: string, key: string): Promise<string> {
  const res = await fetch(url, { headers: { authorization: `Bearer ${key}`, accept: 'text/event-stream' }, signal: AbortSignal.timeout(20_000) });
  assert.equal(res.status, 200);
  return res.text();
}

/** Every file under dir (the log's segments, the chDB parts, everything). */
async function files(dir: string): Promise<string[]> {
  const entries = await readdir(dir, { recursive: true, withFileTypes: true });
  return entries.filter((e) => e.isFile()).map((e) => path.join(e.parentPath, e.name));
}

const runtime = backend('SVC_TEST_BWRAP', 'red team: secrets');

if (runtime) {
  describe('red team: no secret value (nor its beginning) in traces, output cuts, answers or the data dir', () => {
    let server: TestServer;
    let key: string;
    let sandboxId: string;
    let sbKey: string;
    /** Audit records of the sandbox seen in its audit log, to wait for in the store. */
    let auditRecords = 0;
    const req = (method: string, p: string, body?: unknown, k = key) => server.request(method, p, { key: k, body });
    const run = async (command: string) => {
      const res = await req('POST', `/v1/sandboxes/${sandboxId}/commands`, { command });
      assert.equal(res.status, 200, res.text);
      return res.body as { command: string; stdout: string; stderr: string; exit_code: number };
    };

    before(async () => {
      server = await startServer({
        SVC_SANDBOX_HOST_ROOTFS: 'true',
        SVC_RATE_LIMIT_WRITES: '0',
        SVC_RATE_LIMIT_READS: '0',
        SVC_STDOUT_CHUNK_BYTES: String(CHUNK),
        SVC_TRACE_FIELD_BYTES: String(FIELD),
      });
      key = (await createTenantKey(server, 'acme')).key;
      const spec = await server.request('POST', '/v1/specs', { key, body: SPEC, headers: { 'content-type': 'application/x-yaml' } });
      assert.equal(spec.status, 201, spec.text);
      const sb = await req('POST', '/v1/sandboxes', { spec_id: 'leaky', secrets: { LEAKY_TOKEN: SECRET } });
      assert.equal(sb.status, 201, sb.text);
      sandboxId = sb.body.id;
      sbKey = (await run('printf %s "$SVC_API_KEY"')).stdout;
      assert.match(sbKey, /^svc_sb_/);
    });
    after(async () => server?.cleanup());

    test('a trace posted with the sandbox token: keys, values, names, ids and a field cut at its limit are redacted', async () => {
      const event = traceEvent({
        tool: `t-${SECRET}`,
        span_id: `s-${SECRET}`,
        input: 'i'.repeat(FIELD - HALF.length) + SECRET,
        output: `out ${SECRET}`,
        cost: { model: SECRET },
        metadata: { [SECRET]: SECRET, [`k-${SECRET}`]: { nested: SECRET } },
      });
      const res = await req('POST', `/v1/sandboxes/${sandboxId}/trace`, [event], sbKey);
      assert.equal(res.status, 200, res.text);
      const trace = await req('GET', `/v1/sandboxes/${sandboxId}/trace`);
      const [stored] = trace.body.events;
      assert.equal(stored.metadata['[REDACTED:LEAKY_TOKEN]'], '[REDACTED:LEAKY_TOKEN]');
      assert.equal(stored.metadata['k-[REDACTED:LEAKY_TOKEN]'], '{"nested":"[REDACTED:LEAKY_TOKEN]"}');
      assert.equal(stored.tool, 't-[REDACTED:LEAKY_TOKEN]');
      assert.ok(Buffer.byteLength(stored.input) <= FIELD);
      assert.deepEqual(leaks(JSON.stringify(trace.body)), []);
    });

    test('OTLP spans posted with the sandbox token: attribute keys, values cut at the limit, names and status messages are redacted', async () => {
      const span = {
        traceId: '5b8efff798038103d269b633813fc60c',
        spanId: 'eee19b7ec3c1b174',
        name: `n-${SECRET}`,
        startTimeUnixNano: String(BigInt(Date.now()) * 1_000_000n),
        status: { code: 2, message: `failed with ${SECRET}` },
        attributes: [
          { key: SECRET, value: { stringValue: SECRET } },
          { key: 'input.value', value: { stringValue: 'o'.repeat(FIELD - HALF.length) + SECRET } },
        ],
      };
      const res = await req(
        'POST',
        '/otel/v1/traces',
        { resourceSpans: [{ resource: { attributes: [{ key: `r-${SECRET}`, value: { stringValue: SECRET } }] }, scopeSpans: [{ spans: [span] }] }] },
        sbKey,
      );
      assert.equal(res.status, 200, res.text);
      const trace = await req('GET', `/v1/sandboxes/${sandboxId}/trace`);
      const otel = trace.body.events.find((e: { span_id: string }) => e.span_id === 'eee19b7ec3c1b174');
      assert.equal(otel.tool, 'n-[REDACTED:LEAKY_TOKEN]');
      assert.equal(otel.metadata['[REDACTED:LEAKY_TOKEN]'], '[REDACTED:LEAKY_TOKEN]');
      assert.deepEqual(leaks(JSON.stringify(trace.body)), []);
    });

    test("a command's output cut by the 1 MiB capture and by the audit's chunks, and its text, are redacted", async () => {
      const big = await run(`head -c ${MIB - HALF.length} /dev/zero | tr '\\0' x; printf %s "$LEAKY_TOKEN"`);
      assert.equal(big.exit_code, 0);
      assert.ok(big.stdout.length >= MIB - HALF.length && big.stdout.length <= MIB, `the capture is cut at 1 MiB (${big.stdout.length})`);
      assert.deepEqual(leaks(big.stdout), [], 'no beginning of the value at the capture cut');

      const chunked = await run(`head -c ${CHUNK - HALF.length} /dev/zero | tr '\\0' y; printf %s "$LEAKY_TOKEN"; echo`);
      assert.equal(chunked.stdout, `${'y'.repeat(CHUNK - HALF.length)}[REDACTED:LEAKY_TOKEN]\n`);

      const literal = await run(`echo ${SECRET} > /dev/null; echo done`);
      assert.equal(literal.command, 'echo [REDACTED:LEAKY_TOKEN] > /dev/null; echo done');

      const audit = await req('GET', `/v1/sandboxes/${sandboxId}/files/.svc/audit.jsonl`);
      assert.equal(audit.status, 200);
      const records = audit.text
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l));
      assert.ok(records.filter((r) => r.type === 'stdout').length >= 2, 'stdout is in chunks');
      auditRecords = records.length;
      assert.deepEqual(leaks(audit.text), []);
    });

    test("the files API returns the agent's file as it is", async () => {
      await run('printf %s "$LEAKY_TOKEN" > note.txt');
      assert.equal((await req('GET', `/v1/sandboxes/${sandboxId}/files/note.txt`)).text, SECRET);
      assert.equal((await req('POST', `/v1/sandboxes/${sandboxId}/files`, { path: 'config.env', content: `TOKEN=${SECRET}\n` })).status, 201);
      assert.equal((await req('GET', `/v1/sandboxes/${sandboxId}/files/config.env`)).text, `TOKEN=${SECRET}\n`);
    });

    test('after all that: no answer, event, table row or file of the data dir holds the value or its first half', async () => {
      assert.equal((await req('DELETE', `/v1/sandboxes/${sandboxId}`)).status, 200);
      const events = await sse(`${server.url}/v1/sandboxes/${sandboxId}/events`, key);
      assert.match(events, /"state":"destroyed"/);
      assert.deepEqual(leaks(events), [], 'sandbox events');
      const traces = await req('GET', `/v1/traces?sandbox_id=${sandboxId}`);
      assert.ok(traces.body.items.length >= 2);
      assert.deepEqual(leaks(traces.text), [], 'trace query');

      // Every row of every table, as ClickHouse decodes it (the parts on disk are compressed).
      const sql = (query: string) => adminSql<any>(server, query, { h: HALF, id: sandboxId });
      // The sink is behind the log: wait until the sandbox's last event and its audit are in the store.
      const count = async (query: string) => Number((await sql(query))[0].n);
      for (let i = 0; i < 200; i++) {
        const ended = await count('SELECT count() AS n FROM sandbox_events WHERE SandboxId = {id:String} AND position(Data, \'"destroyed"\') > 0');
        if (ended > 0 && (await count('SELECT count() AS n FROM audit_events WHERE SandboxId = {id:String}')) >= auditRecords) break;
        await new Promise((r) => setTimeout(r, 100));
      }
      assert.ok(
        auditRecords > 10 && (await count('SELECT count() AS n FROM audit_events WHERE SandboxId = {id:String}')) >= auditRecords,
        'the audit rows are there to search',
      );
      const tables = (await sql("SELECT name FROM system.tables WHERE database = currentDatabase() AND engine LIKE '%MergeTree'")).map((t) => t.name as string);
      assert.ok(tables.includes('trace_events') && tables.includes('audit_events') && tables.includes('sandbox_events'), `${tables}`);
      for (const table of tables) {
        assert.equal(
          await count(`SELECT count() AS n FROM ${table} WHERE position(formatRow('TSV', *), {h:String}) > 0`),
          0,
          `rows of ${table} hold the value or its first half`,
        );
      }

      // And the bytes on disk: the log's segments, the chDB directory, everything.
      const found: string[] = [];
      for (const file of await files(server.dataDir)) {
        const bytes = await readFile(file).catch(() => null);
        if (bytes && leaks(bytes).length > 0) found.push(`${path.relative(server.dataDir, file)}: ${leaks(bytes).join(', ')}`);
      }
      assert.deepEqual(found, []);
    });
  });
}
