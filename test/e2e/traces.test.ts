import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { gzipSync } from 'node:zlib';
import { spawn } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { ADMIN_KEY, createTenantKey, freePort, REPO, startServer, traceEvent, type TestServer } from '../helpers/server.ts';

describe('POST /v1/traces and GET /v1/traces, end to end', () => {
  let server: TestServer;
  let acme: string;
  let globex: string;

  before(async () => {
    server = await startServer();
    acme = (await createTenantKey(server, 'acme')).key;
    globex = (await createTenantKey(server, 'globex')).key;
  });
  after(async () => server?.cleanup());

  test('a GET right after the POST returns sees the events, stamped with the tenant and no sandbox', async () => {
    const events = [traceEvent({ tool: 'rye-first', span_id: 'a1' }), traceEvent({ tool: 'rye-first', span_id: 'a2', parent_span_id: 'a1' })];
    const post = await server.request('POST', '/v1/traces', { key: acme, body: { events } });
    assert.equal(post.status, 200, post.text);
    assert.deepEqual(post.body, { ingested: 2 });
    const get = await server.request('GET', '/v1/traces?tool=rye-first', { key: acme });
    assert.equal(get.status, 200, get.text);
    assert.equal(get.body.count, 2);
    assert.equal(get.body.next_cursor, undefined);
    for (const item of get.body.items) {
      assert.equal(item.tenant, 'acme');
      assert.equal(item.sandbox_id, null);
      assert.equal(item.trace_id, 'a1', 'the trace id is the root span id');
    }
    assert.deepEqual(get.body.items.map((i: any) => i.span_id).sort(), ['a1', 'a2']);
  });

  test('tenants see only their own events', async () => {
    await server.request('POST', '/v1/traces', { key: globex, body: { events: [traceEvent({ tool: 'globex-only' })] } });
    const mine = await server.request('GET', '/v1/traces?tool=globex-only', { key: globex });
    assert.equal(mine.body.count, 1);
    const theirs = await server.request('GET', '/v1/traces?tool=globex-only', { key: acme });
    assert.equal(theirs.status, 200);
    assert.equal(theirs.body.count, 0);
  });

  test('a full event keeps its fields; input beyond 4 KB is truncated', async () => {
    const event = traceEvent({
      ts: '2026-03-01T10:00:00.123456Z',
      event_type: 'llm_call',
      tool: 'openai.create',
      span_id: 'llm-1',
      trace_id: 'trace-xyz',
      duration_ms: 840,
      status: 'error',
      input: 'x'.repeat(10_000),
      output: 'héllo',
      cost: { input_tokens: 120, output_tokens: 30, cache_read_tokens: 5, reasoning_tokens: 7, model: 'gpt-4o', estimated_usd: 0.0123 },
      metadata: { 'gen_ai.system': 'openai', 'gen_ai.usage.input_tokens': 120 },
    });
    assert.equal((await server.request('POST', '/v1/traces', { key: acme, body: { events: [event] } })).status, 200);
    const { body } = await server.request('GET', '/v1/traces?tool=openai.create', { key: acme });
    assert.equal(body.count, 1);
    const item = body.items[0];
    assert.equal(item.ts, '2026-03-01T10:00:00.123456Z');
    assert.equal(item.event_type, 'llm_call');
    assert.equal(item.phase, 'complete');
    assert.equal(item.trace_id, 'trace-xyz');
    assert.equal(item.duration_ms, 840);
    assert.equal(item.status, 'error');
    assert.equal(item.input.length, 4096);
    assert.equal(item.output, 'héllo');
    assert.deepEqual(item.cost, { input_tokens: 120, output_tokens: 30, cache_read_tokens: 5, reasoning_tokens: 7, model: 'gpt-4o', estimated_usd: 0.0123 });
    assert.deepEqual(item.metadata, { 'gen_ai.system': 'openai', 'gen_ai.usage.input_tokens': '120' });
  });

  test('a bare array is accepted too', async () => {
    const res = await server.request('POST', '/v1/traces', { key: acme, body: [traceEvent({ tool: 'bare-array' })] });
    assert.equal(res.status, 200, res.text);
    assert.equal((await server.request('GET', '/v1/traces?tool=bare-array', { key: acme })).body.count, 1);
  });

  test('bad events get a 400 naming the field, and nothing of the batch is stored', async () => {
    const cases: Array<[unknown, RegExp]> = [
      [{ events: [traceEvent({ tool: 'bad-1' }), { ...traceEvent(), ts: 'yesterday' }] }, /^events\[1\]\.ts:/],
      [{ events: [traceEvent({ event_type: 'llm_chat' })] }, /^events\[0\]\.event_type:/],
      [{ events: [traceEvent({ phase: 'middle' })] }, /^events\[0\]\.phase:/],
      [{ events: [traceEvent({ span_id: '' })] }, /^events\[0\]\.span_id:/],
      [{ events: [traceEvent({ duration_ms: -1 })] }, /^events\[0\]\.duration_ms:/],
      [{ events: [traceEvent({ duration_ms: 1.5 })] }, /^events\[0\]\.duration_ms:/],
      [{ events: [traceEvent({ status: 'fine' })] }, /^events\[0\]\.status:/],
      [{ events: [traceEvent({ cost: { input_tokens: 'many' } })] }, /^events\[0\]\.cost\.input_tokens:/],
      [{ events: [traceEvent({ metadata: [1] })] }, /^events\[0\]\.metadata:/],
      [{ events: [traceEvent({ input: 42 })] }, /^events\[0\]\.input:/],
      [{ events: ['not an object'] }, /^events\[0\]:/],
      [{ events: 'nope' }, /^events:/],
      [{}, /^events:/],
      [{ events: Array.from({ length: 1001 }, () => traceEvent()) }, /^events: at most 1000 events per request/],
    ];
    for (const [body, message] of cases) {
      const res = await server.request('POST', '/v1/traces', { key: acme, body });
      assert.equal(res.status, 400, `${JSON.stringify(body).slice(0, 80)} -> ${res.text}`);
      assert.equal(res.body.error, 'bad_request');
      assert.match(res.body.message, message);
    }
    assert.equal((await server.request('GET', '/v1/traces?tool=bad-1', { key: acme })).body.count, 0);
  });

  test('malformed JSON is a 400, not a 500', async () => {
    const res = await server.request('POST', '/v1/traces', { key: acme, body: '{"events": [' });
    assert.equal(res.status, 400);
    assert.equal(res.body.error, 'bad_request');
    assert.match(res.body.message, /^body: invalid JSON/);
  });

  test('a gzip body is inflated; another content type is 415, another encoding 415, an oversized body 413', async () => {
    const body = gzipSync(JSON.stringify({ events: [traceEvent({ tool: 'gzipped' })] }));
    const zipped = await fetch(`${server.url}/v1/traces`, {
      method: 'POST',
      headers: { authorization: `Bearer ${acme}`, 'content-type': 'application/json', 'content-encoding': 'gzip' },
      body,
    });
    assert.equal(zipped.status, 200, await zipped.clone().text());
    assert.deepEqual(await zipped.json(), { ingested: 1 });
    const plain = await server.request('POST', '/v1/traces', {
      key: acme,
      body: JSON.stringify({ events: [traceEvent()] }),
      headers: { 'content-type': 'text/plain' },
    });
    assert.equal(plain.status, 415);
    assert.equal(plain.body.error, 'unsupported_media_type');
    const brotli = await server.request('POST', '/v1/traces', { key: acme, body: { events: [] }, headers: { 'content-encoding': 'br' } });
    assert.equal(brotli.status, 415);
    const huge = await server.request('POST', '/v1/traces', { key: acme, body: `{"events": ["${'x'.repeat(33 * 1024 * 1024)}"]}` });
    assert.equal(huge.status, 413);
    assert.equal(huge.body.error, 'payload_too_large');
    const bomb = gzipSync(Buffer.alloc(40 * 1024 * 1024, 0x20));
    const inflated = await fetch(`${server.url}/v1/traces`, {
      method: 'POST',
      headers: { authorization: `Bearer ${acme}`, 'content-type': 'application/json', 'content-encoding': 'gzip' },
      body: bomb,
    });
    assert.equal(inflated.status, 413, 'the inflated size counts');
  });

  test('exactly 1,000 events are accepted in one request', async () => {
    const events = Array.from({ length: 1000 }, (_, i) => traceEvent({ tool: 'thousand', span_id: `t${i}` }));
    const res = await server.request('POST', '/v1/traces', { key: acme, body: { events } });
    assert.deepEqual(res.body, { ingested: 1000 });
    const page = await server.request('GET', '/v1/traces?tool=thousand&limit=1000', { key: acme });
    assert.equal(page.body.count, 1000);
  });

  test('cursor pagination walks every event once, oldest first, and ends without next_cursor', async () => {
    const base = Date.parse('2026-02-01T00:00:00Z');
    const events = Array.from({ length: 25 }, (_, i) => traceEvent({ tool: 'paged', span_id: `p${i}`, ts: new Date(base + (i % 5) * 1000).toISOString() }));
    await server.request('POST', '/v1/traces', { key: acme, body: { events } });
    const seen: string[] = [];
    let cursor: string | undefined;
    let pages = 0;
    do {
      const res = await server.request('GET', `/v1/traces?tool=paged&limit=10${cursor ? `&cursor=${cursor}` : ''}`, { key: acme });
      assert.equal(res.status, 200, res.text);
      assert.equal(res.body.count, res.body.items.length);
      seen.push(...res.body.items.map((i: any) => i.span_id));
      const ts = res.body.items.map((i: any) => i.ts);
      assert.deepEqual(ts, [...ts].sort(), 'ordered by time');
      cursor = res.body.next_cursor;
      pages++;
    } while (cursor);
    assert.equal(pages, 3);
    assert.equal(seen.length, 25);
    assert.equal(new Set(seen).size, 25);
  });

  test('a cursor stays valid while new events arrive', async () => {
    const base = Date.parse('2026-02-02T00:00:00Z');
    const mk = (i: number) => traceEvent({ tool: 'stable', span_id: `st${i}`, ts: new Date(base + i * 1000).toISOString() });
    await server.request('POST', '/v1/traces', { key: acme, body: { events: [0, 1, 2, 3].map(mk) } });
    const first = await server.request('GET', '/v1/traces?tool=stable&limit=2', { key: acme });
    await server.request('POST', '/v1/traces', { key: acme, body: { events: [4, 5].map(mk) } });
    const second = await server.request('GET', `/v1/traces?tool=stable&limit=10&cursor=${first.body.next_cursor}`, { key: acme });
    assert.deepEqual(
      second.body.items.map((i: any) => i.span_id),
      ['st2', 'st3', 'st4', 'st5'],
    );
  });

  test('filters: event_type and since', async () => {
    await server.request('POST', '/v1/traces', {
      key: acme,
      body: {
        events: [
          traceEvent({ tool: 'filt', event_type: 'tool_use', phase: 'invoked', ts: '2026-04-01T00:00:00Z' }),
          traceEvent({ tool: 'filt', event_type: 'tool_call', ts: '2026-04-02T00:00:00Z' }),
          traceEvent({ tool: 'filt', event_type: 'tool_call', ts: '2026-04-03T00:00:00Z' }),
        ],
      },
    });
    assert.equal((await server.request('GET', '/v1/traces?tool=filt&event_type=tool_use', { key: acme })).body.count, 1);
    assert.equal((await server.request('GET', '/v1/traces?tool=filt&since=2026-04-02T00:00:00Z', { key: acme })).body.count, 2);
    assert.equal((await server.request('GET', '/v1/traces?tool=filt&sandbox_id=sb-unknown', { key: acme })).body.count, 0);
  });

  test('bad query parameters are 400s naming the parameter', async () => {
    const cases: Array<[string, RegExp]> = [
      ['limit=0', /^limit:/],
      ['limit=1001', /^limit: must be at most 1000/],
      ['limit=ten', /^limit:/],
      ['since=yesterday', /^since:/],
      ['event_type=chat', /^event_type:/],
      ['cursor=garbage', /^cursor:/],
      ['tol=bash', /^tol: unknown query parameter/],
    ];
    for (const [query, message] of cases) {
      const res = await server.request('GET', `/v1/traces?${query}`, { key: acme });
      assert.equal(res.status, 400, `${query}: ${res.text}`);
      assert.match(res.body.message, message);
    }
  });

  test('NDJSON streams every matching event, one per line', async () => {
    const events = Array.from({ length: 30 }, (_, i) => traceEvent({ tool: 'nd', span_id: `nd${i}` }));
    await server.request('POST', '/v1/traces', { key: acme, body: { events } });
    const res = await server.request('GET', '/v1/traces?tool=nd&format=ndjson', { key: acme });
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type') ?? '', /application\/x-ndjson/);
    const lines = res.text
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    assert.equal(lines.length, 30);
    const viaAccept = await server.request('GET', '/v1/traces?tool=nd&limit=7', { key: acme, headers: { accept: 'application/x-ndjson' } });
    assert.equal(viaAccept.text.trim().split('\n').length, 7);
  });

  test('a retried batch with client event ids is stored once', async () => {
    const events = [traceEvent({ tool: 'retried', event_id: 'evt-1' }), traceEvent({ tool: 'retried', event_id: 'evt-2' })];
    await server.request('POST', '/v1/traces', { key: acme, body: { events } });
    await server.request('POST', '/v1/traces', { key: acme, body: { events } });
    assert.equal((await server.request('GET', '/v1/traces?tool=retried', { key: acme })).body.count, 2);
  });
});

describe('POST /v1/traces under overload', () => {
  let server: TestServer;
  before(async () => {
    server = await startServer({ SVC_INGEST_MAX_IN_FLIGHT: '2', SVC_RATE_LIMIT_INGEST_EVENTS: '0' });
  });
  after(async () => server?.cleanup());

  test('past the in-flight bound it answers 503 overloaded with Retry-After; every accepted event is stored, no refused one is', async () => {
    const { key } = await createTenantKey(server, 'acme');
    const batches = Array.from({ length: 40 }, (_, b) => ({
      events: Array.from({ length: 500 }, (_, i) =>
        traceEvent({ event_id: `load-${b}-${i}`, span_id: `s${b}-${i}`, tool: `load-${b}`, input: 'x'.repeat(100) }),
      ),
    }));
    const post = (b: number) => server.request('POST', '/v1/traces', { key, body: batches[b] });
    const stored = async (b: number) => (await server.request('GET', `/v1/traces?tool=load-${b}&limit=1000`, { key })).body.count as number;

    const first = await Promise.all(batches.map((_, b) => post(b)));
    const refused = first.flatMap((res, b) => (res.status === 503 ? [b] : []));
    assert.ok(refused.length > 0, 'forty concurrent batches against a bound of two: some are pushed back');
    for (const [b, res] of first.entries()) {
      if (res.status === 503) {
        assert.equal(res.body.error, 'overloaded');
        assert.ok(Number(res.headers.get('retry-after')) >= 1, 'carries Retry-After');
        assert.equal(await stored(b), 0, `refused batch ${b} stored nothing`);
      } else {
        assert.equal(res.status, 200, res.text);
        assert.equal(await stored(b), 500, `accepted batch ${b} is whole`);
      }
    }
    // A client that honours Retry-After and sends within the bound gets everything in, once.
    await new Promise((r) => setTimeout(r, 1000 * Number(first[refused[0]].headers.get('retry-after'))));
    for (const b of refused) assert.equal((await post(b)).status, 200);
    for (let b = 0; b < batches.length; b++) assert.equal(await stored(b), 500, `batch ${b}`);
  });
});

describe('`svc start` (tsx registered in-process, not by --import)', () => {
  test('ingests through its worker threads like npm start', async () => {
    const port = await freePort();
    const dataDir = await mkdtemp(path.join(os.tmpdir(), 'svc-start-'));
    const child = spawn(process.execPath, [path.join(REPO, 'bin', 'svc.cjs'), 'start'], {
      env: {
        ...process.env,
        SVC_PORT: String(port),
        SVC_HOST: '127.0.0.1',
        SVC_DATA_DIR: dataDir,
        SVC_API_KEY: ADMIN_KEY,
        SVC_LOG_LEVEL: 'warn',
        SVC_TRACE_RETENTION: 'forever',
      },
      stdio: 'ignore',
    });
    try {
      const url = `http://127.0.0.1:${port}`;
      for (let i = 0; i < 600; i++) {
        if (
          await fetch(`${url}/health`).then(
            (r) => r.ok,
            () => false,
          )
        )
          break;
        await new Promise((r) => setTimeout(r, 100));
      }
      const headers = { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json' };
      const posted = await fetch(`${url}/v1/traces`, { method: 'POST', headers, body: JSON.stringify([traceEvent({ tool: 'svc-start' })]) });
      assert.equal(posted.status, 200, await posted.clone().text());
      const listed = await (await fetch(`${url}/v1/traces?tool=svc-start`, { headers })).json();
      assert.equal(listed.count, 1);
    } finally {
      child.kill('SIGTERM');
      await new Promise((r) => child.once('exit', r));
      await rm(dataDir, { recursive: true, force: true });
    }
  });
});
