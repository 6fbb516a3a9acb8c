/**
 * The client SDK (packages/sdk) against the real service: real `openai` and `@anthropic-ai/sdk`
 * clients, wrapped, talk to local servers that speak each API's wire format (JSON and SSE, with
 * tool calls); the events they report are read back through GET /v1/traces. Also the tracer's
 * span tree, its fire-and-forget behaviour toward a dead or hung destination, and the typed
 * resource methods.
 */
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, describe, test } from 'node:test';
import { createClient, SvcError, Tracer, wrapAnthropic, wrapOpenAI, type StoredTraceEvent } from '../../packages/sdk/src/index.ts';
import { makeBundle, sha256 } from '../helpers/bundles.ts';
import { createTenantKey, freePort, startServer, type TestServer } from '../helpers/server.ts';

const WEATHER_TOOL_OPENAI = [
  { type: 'function' as const, function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } },
];
const WEATHER_TOOL_ANTHROPIC = [{ name: 'get_weather', input_schema: { type: 'object' as const, properties: { city: { type: 'string' } } } }];

function sse(res: http.ServerResponse, frames: string[]): void {
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' });
  for (const f of frames) res.write(f);
  res.end();
}

/** OpenAI chat completions: a tool call when the request offers tools; usage in the last chunk when streamed. */
function openaiHandler(body: any, res: http.ServerResponse): void {
  const model = body.model === 'gpt-4o' ? 'gpt-4o-2024-08-06' : body.model;
  const withTools = Array.isArray(body.tools) && body.tools.length > 0;
  if (!body.stream) {
    const message = withTools
      ? {
          role: 'assistant',
          content: null,
          tool_calls: [
            { id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } },
            { id: 'call_2', type: 'function', function: { name: 'get_time', arguments: '{"tz":"CET"}' } },
          ],
        }
      : { role: 'assistant', content: 'Hello there' };
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(
      JSON.stringify({
        id: 'chatcmpl-1',
        object: 'chat.completion',
        created: 1_700_000_000,
        model,
        choices: [{ index: 0, message, finish_reason: withTools ? 'tool_calls' : 'stop', logprobs: null }],
        usage: {
          prompt_tokens: 100,
          completion_tokens: 20,
          total_tokens: 120,
          prompt_tokens_details: { cached_tokens: 40 },
          completion_tokens_details: { reasoning_tokens: 0 },
        },
      }),
    );
    return;
  }
  const chunk = (choices: unknown[], usage: unknown = null) =>
    `data: ${JSON.stringify({ id: 'chatcmpl-2', object: 'chat.completion.chunk', created: 1_700_000_000, model, choices, usage })}\n\n`;
  sse(res, [
    chunk([
      {
        index: 0,
        delta: {
          role: 'assistant',
          content: null,
          tool_calls: [{ index: 0, id: 'call_9', type: 'function', function: { name: 'get_weather', arguments: '' } }],
        },
        finish_reason: null,
      },
    ]),
    chunk([{ index: 0, delta: { tool_calls: [{ index: 0, function: { arguments: '{"city":' } }] }, finish_reason: null }]),
    chunk([{ index: 0, delta: { tool_calls: [{ index: 0, function: { arguments: '"Oslo"}' } }] }, finish_reason: null }]),
    chunk([{ index: 0, delta: {}, finish_reason: 'tool_calls' }]),
    chunk([], { prompt_tokens: 50, completion_tokens: 10, total_tokens: 60 }),
    'data: [DONE]\n\n',
  ]);
}

/** Anthropic messages: text, plus a tool_use block when the request offers tools; streamed as the named SSE events of the Messages API. */
function anthropicHandler(body: any, res: http.ServerResponse): void {
  const model = body.model;
  const withTools = Array.isArray(body.tools) && body.tools.length > 0;
  if (!body.stream) {
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(
      JSON.stringify({
        id: 'msg_1',
        type: 'message',
        role: 'assistant',
        model,
        content: [
          { type: 'text', text: 'Let me check.' },
          ...(withTools ? [{ type: 'tool_use', id: 'toolu_1', name: 'get_weather', input: { city: 'Paris' } }] : []),
        ],
        stop_reason: withTools ? 'tool_use' : 'end_turn',
        stop_sequence: null,
        usage: { input_tokens: 200, output_tokens: 30, cache_read_input_tokens: 0, cache_creation_input_tokens: 0 },
      }),
    );
    return;
  }
  const ev = (type: string, data: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;
  sse(res, [
    ev('message_start', {
      message: {
        id: 'msg_2',
        type: 'message',
        role: 'assistant',
        model,
        content: [],
        stop_reason: null,
        stop_sequence: null,
        usage: { input_tokens: 200, output_tokens: 1 },
      },
    }),
    ev('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
    ev('ping', {}),
    ev('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'Checking' } }),
    ev('content_block_stop', { index: 0 }),
    ev('content_block_start', { index: 1, content_block: { type: 'tool_use', id: 'toolu_2', name: 'get_weather', input: {} } }),
    ev('content_block_delta', { index: 1, delta: { type: 'input_json_delta', partial_json: '{"city": ' } }),
    ev('content_block_delta', { index: 1, delta: { type: 'input_json_delta', partial_json: '"Oslo"}' } }),
    ev('content_block_stop', { index: 1 }),
    ev('message_delta', { delta: { stop_reason: 'tool_use', stop_sequence: null }, usage: { output_tokens: 40 } }),
    ev('message_stop', {}),
  ]);
}

async function listen(handler: (req: http.IncomingMessage, res: http.ServerResponse) => void): Promise<{ url: string; server: http.Server }> {
  const server = http.createServer(handler);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server };
}

function jsonRoute(routes: Record<string, (body: any, res: http.ServerResponse) => void>) {
  return (req: http.IncomingMessage, res: http.ServerResponse) => {
    let raw = '';
    req.on('data', (d) => (raw += d));
    req.on('end', () => {
      const route = routes[`${req.method} ${req.url}`];
      if (!route) {
        res.writeHead(404).end();
        return;
      }
      route(JSON.parse(raw || '{}'), res);
    });
  };
}

const near = (actual: number, expected: number) => assert.ok(Math.abs(actual - expected) < 1e-12, `${actual} != ${expected}`);

describe('client SDK', () => {
  let server: TestServer;
  let fakeOpenAI: { url: string; server: http.Server };
  let fakeAnthropic: { url: string; server: http.Server };
  let hanging: { url: string; server: http.Server };
  let tenants = 0;

  /** A fresh tenant per test, so listing all its events sees only that test's. */
  async function tenant() {
    const { key } = await createTenantKey(server, `sdk-${++tenants}`);
    const tracer = new Tracer({ baseUrl: server.url, apiKey: key, flushIntervalMs: 60_000 });
    const client = createClient({ baseUrl: server.url, apiKey: key });
    const events = async (): Promise<StoredTraceEvent[]> => (await client.traces.list({ limit: 1000 })).items;
    return { key, tracer, client, events };
  }

  const openai = (tracer: Tracer) => wrapOpenAI(new OpenAI({ apiKey: 'sk-test', baseURL: `${fakeOpenAI.url}/v1`, maxRetries: 0 }), { tracer });
  const anthropic = (tracer: Tracer) => wrapAnthropic(new Anthropic({ apiKey: 'sk-ant-test', baseURL: fakeAnthropic.url, maxRetries: 0 }), { tracer });

  before(async () => {
    server = await startServer({ SVC_RATE_LIMIT_WRITES: '0', SVC_RATE_LIMIT_READS: '0' });
    fakeOpenAI = await listen(jsonRoute({ 'POST /v1/chat/completions': openaiHandler }));
    fakeAnthropic = await listen(jsonRoute({ 'POST /v1/messages': anthropicHandler }));
    // Accepts the request and never answers: a hung trace destination.
    hanging = await listen(() => {});
  });
  after(async () => {
    fakeOpenAI?.server.close();
    fakeAnthropic?.server.close();
    hanging?.server.closeAllConnections();
    hanging?.server.close();
    await server?.cleanup();
  });

  test('wrapped OpenAI: one llm_call per call with tokens, cost and gen_ai metadata; one tool_use per tool call under it', async () => {
    const { tracer, events } = await tenant();
    const client = openai(tracer);
    const plain = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(plain.choices[0].message.content, 'Hello there', 'the wrapper returns what the client returns');
    const withTools = await client.chat.completions.create({
      model: 'my-local-model',
      messages: [{ role: 'user', content: 'weather?' }],
      tools: WEATHER_TOOL_OPENAI,
    });
    assert.equal(withTools.choices[0].message.tool_calls?.length, 2);
    await tracer.shutdown();

    const all = await events();
    const llm = all.filter((e) => e.event_type === 'llm_call');
    assert.equal(llm.length, 2);
    const known = llm.find((e) => e.cost?.model === 'gpt-4o-2024-08-06')!;
    assert.equal(known.tool, 'openai.create');
    assert.equal(known.phase, 'complete');
    assert.equal(known.status, 'ok');
    assert.equal(known.cost!.input_tokens, 100);
    assert.equal(known.cost!.output_tokens, 20);
    assert.equal(known.cost!.cache_read_tokens, 40);
    // 60 uncached x $2.50 + 40 cached x $1.25 + 20 out x $10, per million.
    near(known.cost!.estimated_usd, 0.0004);
    assert.equal(known.metadata!['gen_ai.system'], 'openai');
    assert.equal(known.metadata!['gen_ai.request.model'], 'gpt-4o');
    assert.equal(known.metadata!['gen_ai.response.model'], 'gpt-4o-2024-08-06');
    assert.equal(known.metadata!['gen_ai.usage.input_tokens'], '100');
    assert.equal(known.metadata!['gen_ai.usage.output_tokens'], '20');
    assert.ok(known.duration_ms >= 0);

    const unknown = llm.find((e) => e.cost?.model === 'my-local-model')!;
    assert.equal(unknown.cost!.estimated_usd, 0, 'an unknown model costs 0');
    const tools = all.filter((e) => e.event_type === 'tool_use');
    assert.deepEqual(tools.map((t) => t.tool).sort(), ['get_time', 'get_weather']);
    for (const t of tools) {
      assert.equal(t.phase, 'invoked');
      assert.equal(t.parent_span_id, unknown.span_id, 'a tool_use hangs under the llm_call that asked for it');
      assert.equal(t.trace_id, unknown.trace_id);
    }
    assert.deepEqual(JSON.parse(tools.find((t) => t.tool === 'get_weather')!.input!), { city: 'Paris' });
  });

  test('wrapped OpenAI, streamed: reported when the stream ends, with usage and tool-call arguments accumulated from chunks', async () => {
    const { tracer, events } = await tenant();
    const client = openai(tracer);
    const stream = await client.chat.completions.create({
      model: 'gpt-4o-mini',
      messages: [{ role: 'user', content: 'weather?' }],
      tools: WEATHER_TOOL_OPENAI,
      stream: true,
      stream_options: { include_usage: true },
    });
    let chunks = 0;
    for await (const _ of stream) {
      chunks++;
      assert.equal(tracer.pending, 0, 'nothing is reported before the stream completes');
    }
    assert.equal(chunks, 5, 'the caller sees every chunk');
    await tracer.shutdown();
    const all = await events();
    const llm = all.filter((e) => e.event_type === 'llm_call');
    assert.equal(llm.length, 1);
    assert.equal(llm[0].cost!.input_tokens, 50);
    assert.equal(llm[0].cost!.output_tokens, 10);
    near(llm[0].cost!.estimated_usd, (50 * 0.15 + 10 * 0.6) / 1e6);
    const tools = all.filter((e) => e.event_type === 'tool_use');
    assert.equal(tools.length, 1);
    assert.equal(tools[0].tool, 'get_weather');
    assert.equal(tools[0].input, '{"city":"Oslo"}');
    assert.equal(tools[0].parent_span_id, llm[0].span_id);
  });

  test('wrapped Anthropic, plain and streamed: tokens, cost, tool_use under its llm_call', async () => {
    const { tracer, events } = await tenant();
    const client = anthropic(tracer);
    const message = await client.messages.create({
      model: 'claude-sonnet-4-20250514',
      max_tokens: 100,
      messages: [{ role: 'user', content: 'weather?' }],
      tools: WEATHER_TOOL_ANTHROPIC,
    });
    assert.equal(message.content[1].type, 'tool_use');
    const stream = await client.messages.create({
      model: 'claude-sonnet-4-20250514',
      max_tokens: 100,
      messages: [{ role: 'user', content: 'weather?' }],
      tools: WEATHER_TOOL_ANTHROPIC,
      stream: true,
    });
    const types: string[] = [];
    for await (const event of stream) types.push(event.type);
    assert.equal(types.at(-1), 'message_stop');
    await client.messages.create({ model: 'some-finetune', max_tokens: 10, messages: [{ role: 'user', content: 'hi' }] });
    await tracer.shutdown();

    const all = await events();
    const llm = all.filter((e) => e.event_type === 'llm_call');
    assert.equal(llm.length, 3);
    for (const e of llm) {
      assert.equal(e.tool, 'anthropic.create');
      assert.equal(e.metadata!['gen_ai.system'], 'anthropic');
    }
    const [plain, streamed] = llm.filter((e) => e.cost!.model === 'claude-sonnet-4-20250514').sort((a, b) => a.cost!.output_tokens - b.cost!.output_tokens);
    assert.equal(plain.cost!.input_tokens, 200);
    assert.equal(plain.cost!.output_tokens, 30);
    near(plain.cost!.estimated_usd, (200 * 3 + 30 * 15) / 1e6);
    assert.equal(streamed.cost!.input_tokens, 200);
    assert.equal(streamed.cost!.output_tokens, 40, 'output tokens from message_delta');
    near(streamed.cost!.estimated_usd, (200 * 3 + 40 * 15) / 1e6);
    assert.equal(streamed.metadata!['gen_ai.usage.output_tokens'], '40');
    assert.equal(llm.find((e) => e.cost!.model === 'some-finetune')!.cost!.estimated_usd, 0);

    const tools = all.filter((e) => e.event_type === 'tool_use');
    assert.equal(tools.length, 2);
    const plainTool = tools.find((t) => t.parent_span_id === plain.span_id)!;
    const streamedTool = tools.find((t) => t.parent_span_id === streamed.span_id)!;
    assert.deepEqual(JSON.parse(plainTool.input!), { city: 'Paris' });
    assert.deepEqual(JSON.parse(streamedTool.input!), { city: 'Oslo' });
    assert.equal(streamedTool.tool, 'get_weather');
  });

  test('traced() spans form a tree: start and end events, shared trace id, errors marked, model calls nested', async () => {
    const { tracer, events } = await tenant();
    const client = openai(tracer);
    await tracer.traced(
      'plan',
      async () => {
        await tracer.traced('fetch', async () => client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] }));
        await assert.rejects(
          tracer.traced('explode', () => {
            throw new Error('boom');
          }),
          /boom/,
        );
      },
      { event_type: 'tool_call', input: { goal: 'test' } },
    );
    await tracer.shutdown();

    const all = await events();
    const spanOf = (name: string, phase: string) => all.find((e) => e.tool === name && e.phase === phase)!;
    const root = spanOf('plan', 'start');
    assert.equal(root.parent_span_id, null);
    assert.equal(root.input, '{"goal":"test"}');
    assert.equal(spanOf('plan', 'end').span_id, root.span_id);
    assert.equal(spanOf('fetch', 'start').parent_span_id, root.span_id);
    assert.equal(spanOf('explode', 'start').parent_span_id, root.span_id);
    assert.equal(spanOf('explode', 'end').status, 'error');
    assert.equal(spanOf('explode', 'end').output, 'boom');
    assert.equal(spanOf('fetch', 'end').status, 'ok');
    const llm = all.find((e) => e.event_type === 'llm_call')!;
    assert.equal(llm.parent_span_id, spanOf('fetch', 'start').span_id, 'a model call inside a span is its child');
    assert.equal(all.length, 7, '3 spans x start/end + 1 llm_call');
    for (const e of all) assert.equal(e.trace_id, root.span_id, 'one trace, named by its root span');
  });

  test('a resent batch counts once (client-made event ids)', async () => {
    const { client, events } = await tenant();
    const batch = [
      {
        event_id: 'evt-fixed-1',
        ts: new Date().toISOString(),
        event_type: 'tool_call' as const,
        tool: 'resent',
        phase: 'complete' as const,
        span_id: 'r1',
        trace_id: 'r1',
        duration_ms: 1,
        status: 'ok' as const,
      },
    ];
    assert.deepEqual(await client.traces.ingest(batch), { ingested: 1 });
    await client.traces.ingest(batch);
    assert.equal((await events()).filter((e) => e.tool === 'resent').length, 1);
  });

  test('a dead or hung destination never throws and never slows a traced or wrapped call', async () => {
    const closed = `http://127.0.0.1:${await freePort()}`;
    for (const baseUrl of [closed, hanging.url]) {
      const tracer = new Tracer({ baseUrl, apiKey: 'svc_live_x', batchSize: 1, flushIntervalMs: 60_000, requestTimeoutMs: 1_000 });
      const client = openai(tracer);
      const started = performance.now();
      const value = await tracer.traced('work', async () => {
        await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }] });
        return 42;
      });
      const elapsed = performance.now() - started;
      assert.equal(value, 42);
      // batchSize 1 started a post on every event; a hung one would hold the call for 1 s.
      assert.ok(elapsed < 500, `the traced call took ${elapsed} ms`);
      await tracer.shutdown(); // resolves, does not throw
      assert.ok(tracer.pending > 0, 'undelivered events stay queued for a retry');
    }
  });

  test('the queue is bounded: past maxQueue the oldest events are dropped and counted', () => {
    const tracer = new Tracer({ baseUrl: 'http://127.0.0.1:9', apiKey: 'k', maxQueue: 5, batchSize: 1000, flushIntervalMs: 60_000 });
    for (let i = 0; i < 8; i++) tracer.emit({ event_type: 'tool_call', tool: `t${i}`, phase: 'complete' });
    assert.equal(tracer.pending, 5);
    assert.equal(tracer.dropped, 3);
    void tracer.shutdown();
  });

  test('destination: the sandbox endpoint with SVC_SANDBOX_ID, else /v1/traces with a key, else nothing', async () => {
    assert.equal(new Tracer({ baseUrl: 'http://svc:8080/', apiKey: 'svc_sb_ab', sandboxId: 'sb-12' }).endpoint, 'http://svc:8080/v1/sandboxes/sb-12/trace');
    assert.equal(new Tracer({ baseUrl: 'http://svc:8080', apiKey: 'svc_live_ab', sandboxId: '' }).endpoint, 'http://svc:8080/v1/traces');
    const off = new Tracer({ baseUrl: 'http://svc:8080', apiKey: '', sandboxId: '' });
    assert.equal(off.endpoint, null);
    off.emit({ event_type: 'tool_call', tool: 'x', phase: 'complete' });
    assert.equal(off.pending, 0, 'a disabled tracer queues nothing');
    assert.equal(await off.traced('still-runs', () => 'ran'), 'ran');
  });

  test('typed resource methods: specs, agents, experiments, traces; errors are SvcError', async () => {
    const { client } = await tenant();
    const yaml = `version: 1\nid: sdk-spec\nbase: debian:bookworm\ntask: {prompt: go}\nagent: {type: cli, command: "echo hi > out.txt"}\ninvariants:\n  ok: {check: {type: file_exists, path: out.txt}}\n`;
    const stored = await client.specs.put(yaml);
    assert.equal(stored.version, 1);
    assert.equal((await client.specs.put(yaml)).version, 2, 'uploading an existing id bumps its version');
    assert.equal((await client.specs.get('sdk-spec')).version, 2);
    assert.equal((await client.specs.get('sdk-spec', 1)).version, 1);
    assert.equal((await client.specs.list()).count, 1);

    const bundle = await makeBundle({ 'main.py': 'print("hi")\n' });
    const v1 = await client.agents.upload(bundle, { name: 'coder', entrypoint: ['python', 'main.py'], tag: 'stable' });
    assert.equal(v1.version, 1);
    assert.equal(v1.digest, sha256(bundle));
    const v2 = await client.agents.upload(
      (async function* () {
        yield bundle.subarray(0, 10);
        yield bundle.subarray(10);
      })(),
      { name: 'coder', entrypoint: ['python', 'main.py'] },
    );
    assert.equal(v2.version, 2, 'a streamed bundle uploads too');
    assert.equal((await client.agents.latest('coder')).version, 2);
    assert.equal((await client.agents.byTag('coder', 'stable')).version, 1);
    assert.equal((await client.agents.version('coder', 1)).id, v1.id);
    assert.deepEqual(
      (await client.agents.versions('coder')).items.map((s) => s.version),
      [1, 2],
    );
    assert.equal((await client.agents.list()).items.length, 1);
    assert.equal((await client.agents.snapshot(v1.id)).name, 'coder');

    const exp = await client.experiments.create({ name: 'sdk-exp', spec_id: 'sdk-spec' });
    assert.match(exp.id, /^exp-/);
    assert.equal(exp.status, 'created');
    assert.ok((await client.experiments.list()).items.some((e) => e.id === exp.id));
    assert.ok(await client.experiments.get(exp.id));

    const missing = await client.specs.get('never-uploaded').catch((err: unknown) => err);
    assert.ok(missing instanceof SvcError);
    assert.equal(missing.status, 404);
    assert.equal(missing.error, 'not_found');
    assert.ok(missing.message.length > 0);

    await client.agents.deleteSnapshot(v2.id);
    assert.equal((await client.agents.latest('coder')).version, 1);
    assert.deepEqual(await client.specs.delete('sdk-spec'), { id: 'sdk-spec', deleted: true });
    await assert.rejects(client.specs.get('sdk-spec'), (err: unknown) => err instanceof SvcError && err.status === 404);

    const unauthorised = createClient({ baseUrl: server.url, apiKey: 'svc_live_wrong' });
    await assert.rejects(unauthorised.specs.list(), (err: unknown) => err instanceof SvcError && err.status === 401);
  });
});
