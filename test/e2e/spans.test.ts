/** GET /v1/traces/:id, GET /v1/spans and GET /v1/agents/:name/traces over HTTP. */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { backend } from '../helpers/backend.ts';
import { makeBundle, uploadAgent } from '../helpers/bundles.ts';
import { createTenantKey, startServer, traceEvent, type TestServer } from '../helpers/server.ts';

describe('spans and trace reads, end to end', () => {
  let server: TestServer;
  let acme: string;
  let globex: string;
  const post = async (key: string, events: unknown[]) => {
    const res = await server.request('POST', '/v1/traces', { key, body: { events } });
    assert.equal(res.status, 200, res.text);
  };
  const get = (key: string, p: string, headers?: Record<string, string>) => server.request('GET', p, { key, headers });

  before(async () => {
    server = await startServer({ SVC_RATE_LIMIT_READS: '0', SVC_RATE_LIMIT_WRITES: '0', SVC_TRACE_RETENTION: '7d' });
    acme = (await createTenantKey(server, 'acme')).key;
    globex = (await createTenantKey(server, 'globex')).key;
  });
  after(async () => server?.cleanup());

  test('a start and its end make one span; a start alone is in progress; a complete event is a span', async () => {
    // Recent: the server runs with a 7-day retention.
    const t0 = Math.floor(Date.now() / 1000) * 1000 - 600_000;
    const at = (ms: number) => new Date(t0 + ms).toISOString();
    await post(acme, [
      traceEvent({ ts: at(0), span_id: 'root-1', phase: 'start', event_type: 'tool_call', tool: 'agent', input: 'task', duration_ms: 0, metadata: { a: '1' } }),
      traceEvent({
        ts: at(10),
        span_id: 'llm-1',
        parent_span_id: 'root-1',
        phase: 'complete',
        event_type: 'llm_call',
        tool: 'openai.create',
        duration_ms: 40,
        cost: { model: 'gpt-4o', input_tokens: 10, output_tokens: 2 },
      }),
      traceEvent({ ts: at(20), span_id: 'open-1', parent_span_id: 'root-1', phase: 'start', tool: 'bash' }),
    ]);
    // The end arrives in a later request.
    await post(acme, [
      traceEvent({
        ts: at(500),
        span_id: 'root-1',
        phase: 'end',
        event_type: 'tool_call',
        tool: 'agent',
        output: 'done',
        duration_ms: 500,
        status: 'error',
        metadata: { b: '2' },
      }),
    ]);
    const res = await get(acme, '/v1/traces/root-1');
    assert.equal(res.status, 200, res.text);
    assert.equal(res.body.count, 3);
    assert.equal(res.body.next_cursor, undefined);
    const byId = Object.fromEntries(res.body.items.map((s: any) => [s.span_id, s]));
    assert.deepEqual(Object.keys(byId).sort(), ['llm-1', 'open-1', 'root-1']);
    const root = byId['root-1'];
    assert.equal(root.trace_id, 'root-1');
    assert.equal(root.root_span_id, 'root-1');
    assert.equal(root.parent_span_id, null);
    assert.equal(root.status, 'error');
    assert.equal(Date.parse(root.start), t0);
    assert.equal(Date.parse(root.end), t0 + 500);
    assert.equal(root.duration_ms, 500);
    assert.equal(root.input, 'task');
    assert.equal(root.output, 'done');
    assert.deepEqual(root.metadata, { a: '1', b: '2' });
    assert.equal(byId['open-1'].status, 'in_progress');
    assert.equal(byId['open-1'].end, null);
    assert.equal(byId['open-1'].duration_ms, null);
    assert.equal(byId['open-1'].root_span_id, 'root-1');
    const llm = byId['llm-1'];
    assert.equal(llm.phase, 'complete');
    assert.equal(llm.status, 'ok');
    assert.equal(Date.parse(llm.end), t0 + 50);
    assert.equal(llm.cost.model, 'gpt-4o');
    assert.equal(llm.sandbox_id, null);
  });

  test('a trace split over requests is joined at query time through its parent chain', async () => {
    await post(acme, [traceEvent({ span_id: 'chain-root' }), traceEvent({ span_id: 'chain-a', parent_span_id: 'chain-root' })]);
    // Stored with trace id chain-a (the chain leaves this request), then chain-b (two levels down).
    await post(acme, [traceEvent({ span_id: 'chain-b', parent_span_id: 'chain-a' })]);
    await post(acme, [traceEvent({ span_id: 'chain-c', parent_span_id: 'chain-b' })]);
    const res = await get(acme, '/v1/traces/chain-root');
    assert.deepEqual(res.body.items.map((s: any) => s.span_id).sort(), ['chain-a', 'chain-b', 'chain-c', 'chain-root']);
    for (const s of res.body.items) {
      assert.equal(s.trace_id, 'chain-root');
      assert.equal(s.root_span_id, 'chain-root');
    }
    const spans = await get(acme, '/v1/spans?trace_id=chain-root');
    assert.equal(spans.body.count, 4);
    // An explicit trace id is kept, and its root is the parentless span.
    await post(acme, [
      traceEvent({ span_id: 'otel-root', trace_id: 'T-1' }),
      traceEvent({ span_id: 'otel-kid', parent_span_id: 'otel-root', trace_id: 'T-1' }),
    ]);
    const otel = await get(acme, '/v1/traces/T-1');
    assert.equal(otel.body.count, 2);
    for (const s of otel.body.items) assert.deepEqual([s.trace_id, s.root_span_id], ['T-1', 'otel-root']);
    assert.equal((await get(acme, '/v1/spans?root_span_id=otel-root')).body.count, 2);
    assert.equal((await get(acme, '/v1/spans?root_span=otel-root')).body.count, 2);
  });

  test('every filter of /v1/spans', async () => {
    await post(acme, [
      traceEvent({ span_id: 'f-root', tool: 'f-tool-a', event_type: 'tool_call' }),
      traceEvent({ span_id: 'f-1', parent_span_id: 'f-root', tool: 'f-tool-b', event_type: 'tool_use', phase: 'invoked' }),
      traceEvent({ span_id: 'f-2', parent_span_id: 'f-root', tool: 'f-tool-b', event_type: 'llm_call' }),
      traceEvent({ span_id: 'f-3', parent_span_id: 'f-1', tool: 'f-tool-a', event_type: 'tool_call' }),
    ]);
    const ids = async (q: string) => {
      const res = await get(acme, `/v1/spans?${q}`);
      assert.equal(res.status, 200, res.text);
      return res.body.items.map((s: any) => s.span_id).sort();
    };
    assert.deepEqual(await ids('trace_id=f-root'), ['f-1', 'f-2', 'f-3', 'f-root']);
    assert.deepEqual(await ids('span_id=f-2'), ['f-2']);
    assert.deepEqual(await ids('parent_span_id=f-root'), ['f-1', 'f-2']);
    assert.deepEqual(await ids('root_span_id=f-root'), ['f-1', 'f-2', 'f-3', 'f-root']);
    assert.deepEqual(await ids('root_span=f-root&tool=f-tool-a'), ['f-3', 'f-root']);
    assert.deepEqual(await ids('tool=f-tool-b'), ['f-1', 'f-2']);
    assert.deepEqual(await ids('trace_id=f-root&event_type=tool_use'), ['f-1']);
    assert.deepEqual(await ids('trace_id=nope'), []);
  });

  test('walking every page yields every span once while new events arrive; NDJSON streams them all', async () => {
    const base = Date.now() - 60_000;
    const events = Array.from({ length: 25 }, (_, i) =>
      traceEvent({ ts: new Date(base + i).toISOString(), span_id: `w-${i}`, tool: 'walk', phase: i % 2 ? 'start' : 'complete' }),
    );
    await post(acme, events);
    const seen: string[] = [];
    let cursor: string | undefined;
    let round = 0;
    do {
      const res = await get(acme, `/v1/spans?tool=walk&limit=4${cursor ? `&cursor=${cursor}` : ''}`);
      assert.equal(res.status, 200, res.text);
      assert.ok(res.body.count <= 4);
      seen.push(...res.body.items.map((s: any) => s.span_id));
      cursor = res.body.next_cursor;
      // New spans and the ends of open spans keep arriving during the walk.
      round++;
      await post(acme, [traceEvent({ span_id: `w-new-${round}`, tool: 'walk' }), traceEvent({ span_id: `w-${round * 2 - 1}`, tool: 'walk', phase: 'end' })]);
    } while (cursor);
    assert.equal(new Set(seen).size, seen.length, 'no span twice');
    for (let i = 0; i < 25; i++) assert.ok(seen.includes(`w-${i}`), `w-${i} seen`);
    const nd = await get(acme, '/v1/spans?tool=walk', { accept: 'application/x-ndjson' });
    assert.equal(nd.status, 200);
    assert.match(nd.headers.get('content-type') ?? '', /application\/x-ndjson/);
    const lines = nd.text
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    assert.equal(lines.length, 25 + round);
    assert.equal(lines.filter((s) => s.status === 'in_progress').length, 12 - Math.min(round, 12));
    const limited = await get(acme, '/v1/traces/root-1?format=ndjson&limit=2');
    assert.equal(limited.text.trim().split('\n').length, 2);
  });

  test('limit bounds and bad inputs are 400 naming the field', async () => {
    const cases: Array<[string, string]> = [
      ['/v1/spans?limit=1001', 'limit'],
      ['/v1/spans?limit=0', 'limit'],
      ['/v1/spans?limit=x', 'limit'],
      ['/v1/spans?cursor=bogus', 'cursor'],
      ['/v1/spans?bogus=1', 'bogus'],
      ['/v1/spans?tool=', 'tool'],
      ['/v1/spans?event_type=nope', 'event_type'],
      ['/v1/spans?root_span_id=a&root_span=b', 'root_span'],
      ['/v1/traces/root-1?limit=5000', 'limit'],
      ['/v1/traces/root-1?tool=x', 'tool'],
      [`/v1/spans?cursor=${Buffer.from(JSON.stringify(['x', 'y'])).toString('base64url')}`, 'cursor'],
    ];
    for (const [p, field] of cases) {
      const res = await get(acme, p);
      assert.equal(res.status, 400, `${p}: ${res.text}`);
      assert.match(JSON.stringify(res.body), new RegExp(field), p);
    }
    assert.equal((await get(acme, '/v1/spans?limit=1000')).status, 200);
    assert.equal((await get(acme, '/v1/traces/root-1?limit=1')).body.count, 1);
  });

  test('tenants see only their own spans and traces', async () => {
    assert.equal((await get(globex, '/v1/traces/root-1')).status, 404);
    assert.equal((await get(globex, '/v1/spans?trace_id=root-1')).body.count, 0);
    assert.equal((await get(globex, '/v1/spans?span_id=root-1')).body.count, 0);
    assert.equal((await get(globex, '/v1/spans?root_span_id=otel-root')).body.count, 0);
    await post(globex, [traceEvent({ span_id: 'root-1', tool: 'globex-tool' })]);
    const mine = await get(globex, '/v1/traces/root-1');
    assert.deepEqual(
      mine.body.items.map((s: any) => s.tool),
      ['globex-tool'],
    );
    const theirs = await get(acme, '/v1/spans?tool=globex-tool');
    assert.equal(theirs.body.count, 0);
    assert.equal((await get(acme, '/v1/traces/unknown-trace')).status, 404);
  });

  test('agent traces: unknown or foreign agent 404, bad version 400, metrics of an agent without events', async () => {
    const bundle = await makeBundle({ 'run.sh': '#!/bin/sh\necho hi\n' });
    for (let i = 0; i < 2; i++) assert.equal((await uploadAgent(server, acme, { name: 'helper', entrypoint: ['sh', 'run.sh'] }, bundle)).status, 201);
    const res = await get(acme, '/v1/agents/helper/traces');
    assert.equal(res.status, 200, res.text);
    assert.deepEqual(res.body, {
      items: [],
      count: 0,
      metrics: { total_tool_calls: 0, tool_success_rate: 1, p50_duration_ms: 0, p95_duration_ms: 0, tool_breakdown: {} },
    });
    assert.equal((await get(acme, '/v1/agents/helper/traces?version=2&limit=5')).status, 200);
    assert.equal((await get(acme, '/v1/agents/helper/traces?version=3')).status, 404);
    for (const q of ['version=abc', 'version=0', 'limit=1001', 'nope=1']) assert.equal((await get(acme, `/v1/agents/helper/traces?${q}`)).status, 400, q);
    assert.equal((await get(acme, '/v1/agents/nobody/traces')).status, 404);
    assert.equal((await get(globex, '/v1/agents/helper/traces')).status, 404);
  });
});

// Only an experiment run's sandbox tags trace events with an agent, so this needs the local runtime.
const runtime = backend('SVC_TEST_BWRAP', 'agent traces from experiment runs on the local runtime');

if (runtime) {
  describe('GET /v1/agents/:name/traces with events from runs of two versions', () => {
    let server: TestServer;
    let key: string;
    const req = (method: string, p: string, body?: unknown, headers?: Record<string, string>) => server.request(method, p, { key, body, headers });
    // Hands its sandbox token to the test, waits for the go, then succeeds.
    const script =
      'echo "$SVC_API_KEY" > "$SVC_WORKSPACE/token.txt"; i=0; while [ ! -f "$SVC_WORKSPACE/go.txt" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done';

    before(async () => {
      server = await startServer({ SVC_SANDBOX_HOST_ROOTFS: 'true', SVC_RATE_LIMIT_WRITES: '0', SVC_RATE_LIMIT_READS: '0' });
      key = (await createTenantKey(server, 'acme')).key;
    });
    after(async () => server?.cleanup());

    /** Runs one experiment of `snapshotId` whose agent posts `events` through its sandbox. */
    const runWith = async (specId: string, snapshotId: string, events: unknown[]) => {
      const yaml = `version: 1\nid: ${specId}\nbase: debian:bookworm\ntask: {prompt: trace}\nagent: {type: snapshot, snapshot_id: ${snapshotId}}\ninvariants:\n  go: {check: {type: file_exists, path: go.txt}}\n`;
      assert.equal((await req('POST', '/v1/specs', yaml, { 'content-type': 'application/x-yaml' })).status, 201);
      const created = await req('POST', '/v1/experiments', { name: specId, spec_id: specId });
      assert.equal(created.status, 201, created.text);
      const id = created.body.id;
      assert.equal((await req('POST', `/v1/experiments/${id}/run`)).status, 202);
      let sandbox: any;
      for (let i = 0; i < 300 && !sandbox; i++) {
        sandbox = (await req('GET', '/v1/sandboxes')).body.find((s: any) => s.metadata?.['svc.experiment_id'] === id);
        if (!sandbox) await new Promise((r) => setTimeout(r, 100));
      }
      assert.ok(sandbox, 'the run has a live sandbox');
      let token = '';
      for (let i = 0; i < 300 && !token; i++) {
        const file = await req('GET', `/v1/sandboxes/${sandbox.id}/files/token.txt`);
        if (file.status === 200) token = String(file.text).trim();
        else await new Promise((r) => setTimeout(r, 100));
      }
      const posted = await server.request('POST', `/v1/sandboxes/${sandbox.id}/trace`, { key: token, body: { events } });
      assert.equal(posted.status, 200, posted.text);
      assert.equal((await req('POST', `/v1/sandboxes/${sandbox.id}/files`, { path: 'go.txt', content: 'go' })).status, 201);
      for (let i = 0; i < 900; i++) {
        const status = (await req('GET', `/v1/experiments/${id}`)).body.status;
        if (['completed', 'failed', 'cancelled'].includes(status)) return;
        await new Promise((r) => setTimeout(r, 100));
      }
      assert.fail(`experiment ${id} did not finish`);
    };

    test('events of each version, the version filter, metrics and pages', async () => {
      const bundle = await makeBundle({ 'run.sh': `#!/bin/sh\n${script}\n` });
      const v1 = await uploadAgent(server, key, { name: 'tracer', entrypoint: ['sh', 'run.sh'] }, bundle);
      const v2 = await uploadAgent(server, key, { name: 'tracer', entrypoint: ['sh', 'run.sh'] }, bundle);
      assert.equal(v2.body.version, 2);
      await runWith('tracer-v1', v1.body.id, [
        traceEvent({ tool: 'bash', event_type: 'tool_use', duration_ms: 10 }),
        traceEvent({ tool: 'bash', event_type: 'tool_use', duration_ms: 30, status: 'error' }),
        traceEvent({ tool: 'chat', event_type: 'llm_call', duration_ms: 900 }),
      ]);
      await runWith('tracer-v2', v2.body.id, [
        traceEvent({ tool: 'grep', event_type: 'tool_call', duration_ms: 20, span_id: 'g1', phase: 'start' }),
        traceEvent({ tool: 'grep', event_type: 'tool_call', duration_ms: 20, span_id: 'g1', phase: 'end' }),
      ]);
      const all = await req('GET', '/v1/agents/tracer/traces');
      assert.equal(all.status, 200, all.text);
      assert.equal(all.body.count, 5);
      for (const e of all.body.items) assert.equal(e.agent, 'tracer');
      assert.equal(all.body.metrics.total_tool_calls, 3, 'the llm call is not a tool call; a start/end pair counts once');
      assert.equal(all.body.metrics.tool_success_rate, 2 / 3);
      assert.deepEqual(Object.keys(all.body.metrics.tool_breakdown).sort(), ['bash', 'grep']);
      assert.equal(all.body.metrics.tool_breakdown.bash.count, 2);
      assert.equal(all.body.metrics.tool_breakdown.bash.success_rate, 0.5);
      assert.equal(all.body.metrics.tool_breakdown.grep.p50_ms, 20);
      const one = await req('GET', '/v1/agents/tracer/traces?version=1');
      assert.equal(one.body.count, 3);
      for (const e of one.body.items) assert.equal(e.agent_snapshot_id, v1.body.id);
      assert.equal(one.body.metrics.total_tool_calls, 2);
      assert.equal(one.body.metrics.p95_duration_ms >= 10, true);
      const two = await req('GET', '/v1/agents/tracer/traces?version=2&limit=1');
      assert.equal(two.body.count, 1);
      assert.ok(two.body.next_cursor);
      const rest = await req('GET', `/v1/agents/tracer/traces?version=2&limit=1&cursor=${two.body.next_cursor}`);
      assert.equal(rest.body.count, 1);
      assert.equal(rest.body.next_cursor, undefined);
      const other = (await createTenantKey(server, 'globex')).key;
      assert.equal((await server.request('GET', '/v1/agents/tracer/traces', { key: other })).status, 404);
    });
  });
}
