/**
 * Sandboxes end to end on the `local` runtime (bubblewrap): lifecycle, boot steps, commands,
 * files, state and diff, audit, SSE, timeouts, tokens, secrets and every error path, over HTTP
 * against the real service.
 */
import assert from 'node:assert/strict';
import { readdir, readFile } from 'node:fs/promises';
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { createTenantKey, startServer, traceEvent, type TestServer } from '../helpers/server.ts';
import { backend } from '../helpers/backend.ts';
import { SPEC, sse } from '../helpers/sandboxes.ts';

const runtime = backend('SVC_TEST_BWRAP', 'sandboxes on the local runtime');

if (runtime) {
  describe('sandboxes on the local runtime', () => {
    let server: TestServer;
    let key: string;
    let other: string;
    const req = (method: string, p: string, body?: unknown, k = key) => server.request(method, p, { key: k, body });
    const create = async (specId: string, body: Record<string, unknown> = {}) => {
      const res = await req('POST', '/v1/sandboxes', { spec_id: specId, ...body });
      assert.equal(res.status, 201, res.text);
      return res.body;
    };
    const putSpec = async (yaml: string, k = key) => {
      const res = await server.request('POST', '/v1/specs', { key: k, body: yaml, headers: { 'content-type': 'application/x-yaml' } });
      assert.equal(res.status, 201, res.text);
      return res.body;
    };

    before(async () => {
      server = await startServer({ SVC_SANDBOX_HOST_ROOTFS: 'true', SVC_RATE_LIMIT_WRITES: '0', SVC_RATE_LIMIT_READS: '0' });
      key = (await createTenantKey(server, 'acme')).key;
      other = (await createTenantKey(server, 'globex')).key;
      await putSpec(SPEC('basic'));
    });
    after(async () => server?.cleanup());

    test('create returns the sandbox ready; GET, list, commands, files, state, diff, destroy', async () => {
      const sb = await create('basic', { metadata: { owner: 'ci' } });
      assert.match(sb.id, /^sb-[0-9a-f]+$/);
      assert.equal(sb.state, 'ready');
      assert.equal(sb.spec_id, 'basic');
      assert.deepEqual(sb.metadata, { owner: 'ci' });
      assert.equal(sb.url, `${server.env.SVC_BASE_URL ?? `http://127.0.0.1:${server.env.SVC_PORT}`}/v1/sandboxes/${sb.id}`);
      assert.deepEqual(sb.services, {});
      assert.equal((await req('GET', `/v1/sandboxes/${sb.id}`)).body.state, 'ready');
      assert.ok((await req('GET', '/v1/sandboxes')).body.some((s: any) => s.id === sb.id));

      const cmd = await req('POST', `/v1/sandboxes/${sb.id}/commands`, { command: 'pwd; echo out; echo err >&2; exit 3' });
      assert.equal(cmd.status, 200, cmd.text);
      assert.equal(cmd.body.stdout, '/workspace\nout\n');
      assert.equal(cmd.body.stderr, 'err\n');
      assert.equal(cmd.body.exit_code, 3);
      assert.equal(typeof cmd.body.duration_ms, 'number');
      assert.equal((await req('GET', `/v1/sandboxes/${sb.id}`)).body.state, 'running');

      const write = await req('POST', `/v1/sandboxes/${sb.id}/files`, { path: '/workspace/src/app.py', content: 'print(1)\n' });
      assert.equal(write.status, 201, write.text);
      const read = await req('GET', `/v1/sandboxes/${sb.id}/files/src/app.py`);
      assert.equal(read.text, 'print(1)\n');
      assert.equal((await req('POST', `/v1/sandboxes/${sb.id}/commands`, { command: 'stat -c %a src/app.py' })).body.stdout, '644\n');
      await req('POST', `/v1/sandboxes/${sb.id}/commands`, { command: 'echo made > by-agent.txt' });
      const state = await req('GET', `/v1/sandboxes/${sb.id}/state`);
      assert.equal(state.status, 200);
      assert.ok(state.body.captured_at);
      assert.equal(state.body.files['src/app.py'].size, 9);
      assert.match(state.body.files['src/app.py'].checksum, /^[0-9a-f]{64}$/);
      assert.equal(state.body.files['.svc/audit.jsonl'], undefined, '.svc is skipped');
      const diff = await req('GET', `/v1/sandboxes/${sb.id}/diff`);
      assert.deepEqual(diff.body, { added: ['by-agent.txt', 'src/app.py'], modified: [], removed: [] });
      assert.equal((await req('DELETE', `/v1/sandboxes/${sb.id}/files/by-agent.txt`)).status, 200);
      assert.equal((await req('GET', `/v1/sandboxes/${sb.id}/files/by-agent.txt`)).status, 404);

      const audit = await req('GET', `/v1/sandboxes/${sb.id}/files/.svc/audit.jsonl`);
      const types = audit.text.trim().split('\n').map((l) => JSON.parse(l).type);
      for (const t of ['process_spawn', 'file_write', 'file_read', 'file_delete']) assert.ok(types.includes(t), `audit has ${t}: ${types}`);

      const del = await req('DELETE', `/v1/sandboxes/${sb.id}`);
      assert.equal(del.status, 200);
      assert.equal((await req('DELETE', `/v1/sandboxes/${sb.id}`)).status, 200, 'idempotent');
      assert.equal((await req('GET', `/v1/sandboxes/${sb.id}`)).status, 404);
      assert.ok(!(await req('GET', '/v1/sandboxes')).body.some((s: any) => s.id === sb.id));
    });

    test('the SSE stream has the nine boot steps in order, commands, audit, and ends with destroyed', async () => {
      const sb = await create('basic');
      await req('POST', `/v1/sandboxes/${sb.id}/commands`, { command: 'true' });
      const url = `${server.url}/v1/sandboxes/${sb.id}/events`;
      const streaming = sse(url, key);
      await new Promise((r) => setTimeout(r, 200));
      await req('DELETE', `/v1/sandboxes/${sb.id}`);
      const events = await streaming;
      const steps = events.filter((e) => e.event_type === 'status' && e.data.step).map((e) => e.data.step);
      assert.deepEqual(steps, ['secrets_resolved', 'container_started', 'services_started', 'fixtures_applied', 'setup_applied', 'network_configured', 'audit_started', 'snapshot_taken', 'ready']);
      assert.equal(events.find((e) => e.data.step === 'secrets_resolved')!.data.count, 0);
      assert.equal(events.find((e) => e.data.step === 'container_started')!.data.runtime, 'local');
      assert.ok(events.some((e) => e.event_type === 'warning'), 'the host rootfs fallback is a warning');
      assert.deepEqual(events.find((e) => e.event_type === 'command')!.data, { command: 'true', exit_code: 0, duration_ms: events.find((e) => e.event_type === 'command')!.data.duration_ms });
      assert.ok(events.some((e) => e.event_type === 'audit' && e.data.type === 'process_spawn'));
      assert.deepEqual(events[events.length - 1], { id: events[events.length - 1].id, event_type: 'status', data: { state: 'destroyed', reason: 'destroyed' } });
      const ids = events.map((e) => Number(e.id));
      assert.deepEqual(ids, [...ids].sort((a, b) => a - b));
      // Resuming with Last-Event-ID gives exactly the rest.
      const rest = await sse(url, key, { 'last-event-id': String(ids[4]) });
      assert.deepEqual(rest.map((e) => Number(e.id)), ids.slice(5));
    });

    test('setup files, commands and env, secrets from request and dashboard, redacted, and the injected variables', async () => {
      assert.equal((await req('PUT', '/v1/secrets/STORED_TOKEN', { value: 'stored-secret-value' })).status, 200);
      await putSpec(SPEC('setup', `secrets:
  STORED_TOKEN: dashboard
setup:
  files:
    - {path: config/app.ini, content: "debug=1\\n"}
  commands:
    - "mkdir -p built && echo ok > built/flag"
  env:
    APP_MODE: test
determinism:
  seed: 42
`));
      const sb = await create('setup', { secrets: { REQUEST_TOKEN: 'request-secret-value' } });
      const out = await req('POST', `/v1/sandboxes/${sb.id}/commands`, { command: 'cat config/app.ini built/flag; echo $APP_MODE $SVC_SANDBOX_ID $SVC_RANDOM_SEED; echo $SVC_BASE_URL; echo $SVC_API_KEY | cut -c1-7; echo $STORED_TOKEN $REQUEST_TOKEN' });
      const lines = out.body.stdout.trim().split('\n');
      assert.deepEqual(lines.slice(0, 3), ['debug=1', 'ok', `test ${sb.id} 42`]);
      assert.match(lines[3], /^http:\/\/127\.0\.0\.1:\d+$/);
      assert.equal(lines[4], 'svc_sb_');
      assert.equal(lines[5], '[REDACTED:STORED_TOKEN] [REDACTED:REQUEST_TOKEN]', 'secret values never come back');
      assert.equal((await req('GET', `/v1/sandboxes/${sb.id}/diff`)).body.added.length, 0, 'setup is before the ready snapshot');

      const audit = await req('GET', `/v1/sandboxes/${sb.id}/files/.svc/audit.jsonl`);
      assert.ok(!audit.text.includes('stored-secret-value') && !audit.text.includes('request-secret-value'), 'no secret in the audit log');
      await req('DELETE', `/v1/sandboxes/${sb.id}`);
      // Nor anywhere on the log (the embedded log's files, or the broker's segments when the suite
      // runs on the distributed deployment): the create request carries the request's secrets sealed.
      const logDir = process.env.SVC_TEST_DEPLOYMENT === 'split' ? process.env.SVC_TEST_KAFKA_DATA_DIR! : path.join(server.dataDir, 'log');
      assert.ok((await readdir(logDir)).length > 0, `${logDir} holds the log`);
      for (const file of await readdir(logDir, { recursive: true })) {
        const bytes = await readFile(path.join(logDir, file)).catch(() => Buffer.alloc(0));
        assert.ok(!bytes.includes('request-secret-value') && !bytes.includes('stored-secret-value'), `no secret value in ${file}`);
      }
    });

    test('a sandbox token reads its own sandbox and nothing else', async () => {
      const a = await create('basic');
      const b = await create('basic');
      const token = (await req('POST', `/v1/sandboxes/${a.id}/commands`, { command: 'printf %s "$SVC_API_KEY" | base64' })).body.stdout;
      const sbKey = Buffer.from(token, 'base64').toString();
      assert.match(sbKey, /^svc_sb_[0-9a-f]+$/);
      assert.equal((await req('GET', `/v1/sandboxes/${a.id}`, undefined, sbKey)).status, 200);
      assert.equal((await req('GET', `/v1/sandboxes/${b.id}`, undefined, sbKey)).status, 403);
      assert.equal((await req('GET', '/v1/traces', undefined, sbKey)).status, 403);
      const traced = await req('POST', `/v1/sandboxes/${a.id}/trace`, { events: [traceEvent({ tool: 'bash' }), traceEvent({ tool: 'bash', status: 'error' })] }, sbKey);
      assert.deepEqual(traced.body, { ingested: 2 });
      const trace = await req('GET', `/v1/sandboxes/${a.id}/trace`, undefined, sbKey);
      assert.equal(trace.body.events.length, 2);
      assert.equal(trace.body.events[0].sandbox_id, a.id);
      assert.equal(trace.body.metrics.total_tool_calls, 2);
      assert.equal(trace.body.metrics.tool_success_rate, 0.5);
      assert.equal(trace.body.metrics.mean_duration_ms, 12);
      assert.equal(trace.body.metrics.p95_duration_ms, 12);
      assert.deepEqual(trace.body.metrics.tool_breakdown.bash, { count: 2, mean_ms: 12, error_rate: 0.5 });
      assert.deepEqual(Object.keys(trace.body.metrics.tool_breakdown), ['bash']);
      await req('DELETE', `/v1/sandboxes/${a.id}`);
      assert.equal((await req('GET', `/v1/sandboxes/${a.id}`, undefined, sbKey)).status, 401, 'the token dies with its sandbox');
      await req('DELETE', `/v1/sandboxes/${b.id}`);
    });

    test('secret values are redacted from the traces a sandbox ingests', async () => {
      const sb = await create('basic', { secrets: { API_TOKEN: 'tok-very-secret-1234' } });
      const event = traceEvent({ tool: 'http', input: 'curl -H "auth: tok-very-secret-1234"', output: 'ok', metadata: { header: 'Bearer tok-very-secret-1234' } });
      assert.equal((await req('POST', `/v1/sandboxes/${sb.id}/trace`, [event])).status, 200);
      const trace = await req('GET', `/v1/sandboxes/${sb.id}/trace`);
      assert.equal(trace.body.events[0].input, 'curl -H "auth: [REDACTED:API_TOKEN]"');
      assert.deepEqual(trace.body.events[0].metadata, { header: 'Bearer [REDACTED:API_TOKEN]' });
      assert.ok(!JSON.stringify(trace.body).includes('tok-very-secret-1234'));
      await req('DELETE', `/v1/sandboxes/${sb.id}`);
    });

    test('from inside, SVC_BASE_URL reaches the service (and only it): an agent posts its own traces', async () => {
      const sb = await create('basic');
      const event = JSON.stringify([traceEvent({ tool: 'from-inside', span_id: 'in-1' })]);
      const post = await req('POST', `/v1/sandboxes/${sb.id}/commands`, {
        command: `printf %s "$SVC_BASE_URL"; echo; curl -sS -X POST "$SVC_BASE_URL/v1/sandboxes/$SVC_SANDBOX_ID/trace" -H "authorization: Bearer $SVC_API_KEY" -H 'content-type: application/json' --data-binary @- <<'EOF'\n${event}\nEOF`,
      });
      assert.equal(post.body.exit_code, 0, post.text);
      const [url, answer] = post.body.stdout.split('\n');
      assert.match(url, /^http:\/\/127\.0\.0\.1:\d+$/);
      assert.deepEqual(JSON.parse(answer), { ingested: 1 });
      const trace = await req('GET', `/v1/sandboxes/${sb.id}/trace`);
      assert.deepEqual(trace.body.events.map((e: { tool: string; sandbox_id: string }) => [e.tool, e.sandbox_id]), [['from-inside', sb.id]]);
      // The service's real address is not reachable from inside: the sandbox has no network.
      const direct = await req('POST', `/v1/sandboxes/${sb.id}/commands`, { command: `curl -sS -m 2 ${server.url}/health` });
      assert.notEqual(direct.body.exit_code, 0, direct.text);
      await req('DELETE', `/v1/sandboxes/${sb.id}`);
      const forwarders = () => readdirSync('/proc').filter((pid) => /^\d+$/.test(pid) && (readFileSafe(`/proc/${pid}/cmdline`) ?? '').includes(`${sb.id}/service.sock`));
      for (let i = 0; i < 50 && forwarders().length > 0; i++) await new Promise((r) => setTimeout(r, 20));
      assert.deepEqual(forwarders(), [], 'the bridge is gone with its sandbox');
    });

    test("an OpenTelemetry exporter with the sandbox token: spans are the sandbox's, redacted; other ingest paths refuse it", async () => {
      const sb = await create('basic', { secrets: { API_TOKEN: 'tok-otel-secret-5678' } });
      const token = (await req('POST', `/v1/sandboxes/${sb.id}/commands`, { command: 'printf %s "$SVC_API_KEY" | base64' })).body.stdout;
      const sbKey = Buffer.from(token, 'base64').toString();
      const span = {
        traceId: '5b8efff798038103d269b633813fc60c',
        spanId: 'eee19b7ec3c1b174',
        name: 'otel.fetch',
        startTimeUnixNano: String(BigInt(Date.now()) * 1_000_000n),
        attributes: [{ key: 'http.request.header.authorization', value: { stringValue: 'Bearer tok-otel-secret-5678' } }],
      };
      const res = await req('POST', '/otel/v1/traces', { resourceSpans: [{ scopeSpans: [{ spans: [span] }] }] }, sbKey);
      assert.equal(res.status, 200, res.text);
      const trace = await req('GET', `/v1/sandboxes/${sb.id}/trace`);
      assert.equal(trace.body.events.length, 1);
      const [event] = trace.body.events;
      assert.equal(event.sandbox_id, sb.id);
      assert.equal(event.tool, 'otel.fetch');
      assert.equal(event.metadata['http.request.header.authorization'], 'Bearer [REDACTED:API_TOKEN]');
      assert.ok(!JSON.stringify(trace.body).includes('tok-otel-secret-5678'));
      assert.equal((await req('POST', '/v1/traces', [traceEvent()], sbKey)).status, 403, 'untagged ingest is for API keys');
      await req('DELETE', `/v1/sandboxes/${sb.id}`);
      assert.equal((await req('POST', '/otel/v1/traces', { resourceSpans: [] }, sbKey)).status, 401, 'the token dies with its sandbox');
    });

    test("the agent's own file activity under watched paths is audited; checkpoints per action; a frozen clock", async () => {
      await putSpec(SPEC('watched', `audit:
  file_system: {watch: ["/"], track: [writes, reads, deletes]}
snapshots:
  checkpoints: per_action
determinism:
  frozen_time: "2030-06-15T12:00:00Z"
`));
      const sb = await create('watched');
      const out = await req('POST', `/v1/sandboxes/${sb.id}/commands`, { command: 'echo hi > note.txt && cat note.txt > /dev/null && rm note.txt; date -u +%Y-%m-%d' });
      assert.equal(out.body.stdout, '2030-06-15\n', 'libfaketime froze the clock');
      const events = sse(`${server.url}/v1/sandboxes/${sb.id}/events`, key);
      await new Promise((r) => setTimeout(r, 500));
      const audit = (await req('GET', `/v1/sandboxes/${sb.id}/files/.svc/audit.jsonl`)).text.trim().split('\n').map((l) => JSON.parse(l));
      const mine = audit.filter((r) => r.details.path === 'note.txt').map((r) => r.type);
      assert.deepEqual([...new Set(mine)].sort(), ['file_delete', 'file_read', 'file_write'], JSON.stringify(audit));
      await req('DELETE', `/v1/sandboxes/${sb.id}`);
      const stream = await events;
      const checkpoint = stream.find((e) => e.event_type === 'checkpoint');
      assert.ok(checkpoint, 'a checkpoint after the command');
      assert.deepEqual(checkpoint.data.diff, { added: [], modified: [], removed: [] });
    });

    test('a command answers when it ends, however long past the reply timeout (up to its own timeout)', async () => {
      const own = await startServer({ SVC_SANDBOX_HOST_ROOTFS: 'true', SVC_REPLY_TIMEOUT: '2s' });
      try {
        await own.request('POST', '/v1/specs', { body: SPEC('slow-command'), headers: { 'content-type': 'application/x-yaml' } });
        const sb = (await own.request('POST', '/v1/sandboxes', { body: { spec_id: 'slow-command' } })).body;
        const slow = await own.request('POST', `/v1/sandboxes/${sb.id}/commands`, { body: { command: 'sleep 4; echo done', timeout: '20s' } });
        assert.equal(slow.status, 200, slow.text);
        assert.equal(slow.body.stdout, 'done\n');
        const killed = await own.request('POST', `/v1/sandboxes/${sb.id}/commands`, { body: { command: 'sleep 30', timeout: '3s' } });
        assert.equal(killed.status, 200, killed.text);
        assert.equal(killed.body.timed_out, true);
      } finally {
        await own.cleanup();
      }
    });

    test('after a kill -9 and restart, the sandboxes of the dead runner are not claimed ready', async () => {
      const own = await startServer({ SVC_SANDBOX_HOST_ROOTFS: 'true' });
      try {
        await own.request('POST', '/v1/specs', { body: SPEC('orphan'), headers: { 'content-type': 'application/x-yaml' } });
        const sb = (await own.request('POST', '/v1/sandboxes', { body: { spec_id: 'orphan' } })).body;
        assert.equal(sb.state, 'ready');
        await own.kill9();
        await own.restart();
        assert.equal((await own.request('GET', `/v1/sandboxes/${sb.id}`)).status, 404);
        assert.deepEqual((await own.request('GET', '/v1/sandboxes')).body, []);
      } finally {
        await own.cleanup();
      }
    });

    test('a fork bomb and a memory hog are contained and reported; the sandbox and the service carry on', async () => {
      await putSpec(SPEC('limited', 'resources:\n  memory: 64Mi\n  pids: 64\n'));
      const sb = await create('limited');
      const events = sse(`${server.url}/v1/sandboxes/${sb.id}/events`, key);
      const bomb = await req('POST', `/v1/sandboxes/${sb.id}/commands`, { command: 'bomb() { bomb | bomb & }; bomb; sleep 1; echo survived', timeout: '5s' });
      assert.equal(bomb.status, 200, bomb.text);
      // The bomb's background processes burn out at the limit on their own; until then a fork may be
      // refused, to the supervisor (126, pids limit) or to the command's own shell (2, Cannot fork).
      const afterBomb = async (command: string) => {
        let res = await req('POST', `/v1/sandboxes/${sb.id}/commands`, { command, timeout: '20s' });
        for (let i = 0; i < 40 && /pids limit|Cannot fork/.test(res.body.stderr); i++) {
          await new Promise((r) => setTimeout(r, 250));
          res = await req('POST', `/v1/sandboxes/${sb.id}/commands`, { command, timeout: '20s' });
        }
        return res;
      };
      const hog = await afterBomb('head -c 200M /dev/zero | tail > /dev/null');
      assert.equal(hog.body.exit_code, 137, hog.text);
      assert.equal(hog.body.oom_killed, true);
      const alive = await afterBomb('echo still here');
      assert.equal(alive.body.stdout, 'still here\n', alive.text);
      assert.equal((await server.request('GET', '/health', { key: null })).status, 200);
      await req('DELETE', `/v1/sandboxes/${sb.id}`);
      const warnings = (await events).filter((e) => e.event_type === 'warning').map((e) => e.data.message);
      assert.ok(warnings.some((m: string) => /process limit/.test(m)), warnings.join('; '));
      assert.ok(warnings.some((m: string) => /out of memory/.test(m)), warnings.join('; '));
    });

    test('another tenant gets 403 on a sandbox id', async () => {
      const sb = await create('basic');
      for (const [method, p] of [['GET', ''], ['POST', '/commands'], ['GET', '/state'], ['DELETE', '']] as const) {
        const res = await req(method, `/v1/sandboxes/${sb.id}${p}`, method === 'POST' ? { command: 'true' } : undefined, other);
        assert.equal(res.status, 403, `${method} ${p}`);
      }
      await req('DELETE', `/v1/sandboxes/${sb.id}`);
    });

    test('command timeout kills the tree (124, timed_out); background returns at once', async () => {
      const sb = await create('basic');
      const started = Date.now();
      const res = await req('POST', `/v1/sandboxes/${sb.id}/commands`, { command: 'sleep 30 & sleep 30', timeout: '1s' });
      assert.equal(res.status, 200);
      assert.equal(res.body.exit_code, 124);
      assert.equal(res.body.timed_out, true);
      assert.ok(Date.now() - started < 10_000);
      const left = await req('POST', `/v1/sandboxes/${sb.id}/commands`, { command: 'ps -e -o comm= | grep -c sleep || true' });
      assert.equal(left.body.stdout.trim(), '0', 'no sleeper survives');
      const bg = await req('POST', `/v1/sandboxes/${sb.id}/commands`, { command: 'sleep 1; echo done > bg.txt', background: true });
      assert.equal(bg.status, 202);
      await new Promise((r) => setTimeout(r, 1500));
      assert.equal((await req('GET', `/v1/sandboxes/${sb.id}/files/bg.txt`)).text, 'done\n');
      await req('DELETE', `/v1/sandboxes/${sb.id}`);
    });

    test('the auto-destroy timer, and POST /timeout to extend it', async () => {
      const sb = await create('basic', { timeout: '2s' });
      const extended = await req('POST', `/v1/sandboxes/${sb.id}/timeout`, { extend: '1s' });
      assert.equal(extended.status, 200, extended.text);
      assert.ok(Date.parse(extended.body.expires_at) - Date.parse(sb.expires_at) >= 1000);
      const events = await sse(`${server.url}/v1/sandboxes/${sb.id}/events`, key);
      assert.deepEqual(events[events.length - 1].data, { state: 'destroyed', reason: 'timeout' });
      assert.equal((await req('GET', `/v1/sandboxes/${sb.id}`)).status, 404);
    });

    test('teardown exports the audit log to the artifact store', async () => {
      await putSpec(SPEC('exporting', `teardown:
  export:
    - {type: audit_log, to: "runs/{{ run_id }}/{{ scenario_id }}/audit.jsonl"}
    - {type: snapshot, to: "runs/{{ run_id }}/state.json"}
`));
      const sb = await create('exporting');
      await req('POST', `/v1/sandboxes/${sb.id}/commands`, { command: 'echo x > x.txt' });
      await req('DELETE', `/v1/sandboxes/${sb.id}`);
      const base = path.join(server.dataDir, 'artifacts', 'acme', 'runs', sb.id);
      const audit = await readFile(path.join(base, 'adhoc', 'audit.jsonl'), 'utf8');
      assert.match(audit, /"process_spawn"/);
      const state = JSON.parse(await readFile(path.join(base, 'state.json'), 'utf8'));
      assert.ok(state.files['x.txt']);
    });

    test('boot failures destroy the partial sandbox and name the step', async () => {
      await putSpec(SPEC('bad-setup', 'setup:\n  commands: ["echo nope >&2; exit 7"]\n'));
      const setup = await req('POST', '/v1/sandboxes', { spec_id: 'bad-setup' });
      assert.equal(setup.status, 400);
      assert.match(setup.body.message, /setup_applied: setup command "echo nope >&2; exit 7" exited with 7: nope/);
      await putSpec(SPEC('missing-secret', 'secrets:\n  NEVER_STORED: dashboard\n'));
      const secret = await req('POST', '/v1/sandboxes', { spec_id: 'missing-secret' });
      assert.equal(secret.status, 400);
      assert.match(secret.body.message, /secrets_resolved: required secret NEVER_STORED is missing/);
      assert.equal((await req('GET', '/v1/sandboxes')).body.filter((s: any) => s.spec_id.startsWith('bad') || s.spec_id.startsWith('missing')).length, 0);
    });

    test('bad input is a clear 4xx', async () => {
      const cases: Array<[string, string, unknown, number, RegExp]> = [
        ['POST', '/v1/sandboxes', {}, 400, /^spec_id:/],
        ['POST', '/v1/sandboxes', { spec_id: 'no-such-spec' }, 400, /^spec_id: no spec "no-such-spec"/],
        ['POST', '/v1/sandboxes', { spec_id: 'basic', timeout: 'forever' }, 400, /^timeout:/],
        ['POST', '/v1/sandboxes', { spec_id: 'basic', metadata: { a: 1 } }, 400, /^metadata\.a:/],
        ['POST', '/v1/sandboxes', { spec_id: 'basic', secrets: { 'bad-name': 'x' } }, 400, /^secrets\.bad-name:/],
        ['GET', '/v1/sandboxes/sb-0000', undefined, 404, /not found/],
      ];
      for (const [method, p, body, status, message] of cases) {
        const res = await req(method, p, body);
        assert.equal(res.status, status, `${method} ${p} ${JSON.stringify(body)}: ${res.text}`);
        assert.match(res.body.message, message);
      }
      const sb = await create('basic');
      const bad: Array<[string, string, unknown, number, RegExp]> = [
        ['POST', `/v1/sandboxes/${sb.id}/commands`, {}, 400, /^command:/],
        ['POST', `/v1/sandboxes/${sb.id}/commands`, { command: 'true', timeout: 'soon' }, 400, /^timeout:/],
        ['POST', `/v1/sandboxes/${sb.id}/files`, { path: '../etc/passwd', content: 'x' }, 400, /\.\./],
        ['POST', `/v1/sandboxes/${sb.id}/files`, { path: 'a.txt' }, 400, /^content:/],
        ['GET', `/v1/sandboxes/${sb.id}/files/nope.txt`, undefined, 404, /not found|no such/i],
        ['POST', `/v1/sandboxes/${sb.id}/timeout`, {}, 400, /^timeout:/],
        ['POST', `/v1/sandboxes/${sb.id}/timeout`, { extend: 'later' }, 400, /^extend:/],
      ];
      for (const [method, p, body, status, message] of bad) {
        const res = await req(method, p, body);
        assert.equal(res.status, status, `${method} ${p} ${JSON.stringify(body)}: ${res.text}`);
        assert.match(res.body.message, message);
      }
      await req('DELETE', `/v1/sandboxes/${sb.id}`);
    });

    test('without the host fallback, a base image missing from the store fails the boot', async () => {
      const strict = await startServer({ SVC_SANDBOX_HOST_ROOTFS: 'false' });
      try {
        await strict.request('POST', '/v1/specs', { body: SPEC('strict'), headers: { 'content-type': 'application/x-yaml' } });
        const res = await strict.request('POST', '/v1/sandboxes', { body: { spec_id: 'strict' } });
        assert.equal(res.status, 400);
        assert.match(res.body.message, /container_started: image could not be pulled: "debian:bookworm"/);
      } finally {
        await strict.cleanup();
      }
    });
  });
}

function readFileSafe(file: string): string | null {
  try {
    return readFileSync(file, 'utf8');
  } catch {
    return null;
  }
}
