import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { createTenantKey, startServer, traceEvent, type TestServer } from '../helpers/server.ts';

describe('Idempotency-Key', () => {
  let server: TestServer;
  let key: string;
  before(async () => {
    server = await startServer();
    key = (await createTenantKey(server, 'acme')).key;
  });
  after(async () => server?.cleanup());

  test('a retry with the same key returns the cached response without re-running, also after a restart', async () => {
    const body = { events: [traceEvent({ tool: 'idem' })] };
    const headers = { 'idempotency-key': 'retry-1' };
    const first = await server.request('POST', '/v1/traces', { key, body, headers });
    assert.equal(first.status, 200);
    assert.equal(first.headers.get('idempotent-replayed'), null);
    const second = await server.request('POST', '/v1/traces', { key, body, headers });
    assert.equal(second.status, 200);
    assert.deepEqual(second.body, first.body);
    assert.equal(second.headers.get('idempotent-replayed'), 'true');
    assert.equal((await server.request('GET', '/v1/traces?tool=idem', { key })).body.count, 1, 'ran once');

    await server.stop();
    await server.restart();
    const third = await server.request('POST', '/v1/traces', { key, body, headers });
    assert.equal(third.headers.get('idempotent-replayed'), 'true', 'the cache survives a restart');
    assert.equal((await server.request('GET', '/v1/traces?tool=idem', { key })).body.count, 1);
  });

  test('the same key with a different body is a 409; another API key has its own namespace', async () => {
    const headers = { 'idempotency-key': 'retry-2' };
    await server.request('POST', '/v1/traces', { key, body: { events: [traceEvent({ tool: 'idem-2' })] }, headers });
    const reuse = await server.request('POST', '/v1/traces', { key, body: { events: [traceEvent({ tool: 'idem-other' })] }, headers });
    assert.equal(reuse.status, 409);
    assert.equal(reuse.body.error, 'conflict');
    const other = (await createTenantKey(server, 'other')).key;
    const fresh = await server.request('POST', '/v1/traces', { key: other, body: { events: [traceEvent({ tool: 'idem-other' })] }, headers });
    assert.equal(fresh.status, 200);
    assert.equal(fresh.headers.get('idempotent-replayed'), null);
  });

  test('a client error is replayed too, and a bad header is a 400', async () => {
    const headers = { 'idempotency-key': 'bad-body' };
    const first = await server.request('POST', '/v1/traces', { key, body: { events: 'x' }, headers });
    assert.equal(first.status, 400);
    const again = await server.request('POST', '/v1/traces', { key, body: { events: 'x' }, headers });
    assert.equal(again.status, 400);
    assert.equal(again.headers.get('idempotent-replayed'), 'true');
    const long = await server.request('POST', '/v1/traces', { key, body: { events: [] }, headers: { 'idempotency-key': 'k'.repeat(300) } });
    assert.equal(long.status, 400);
    assert.match(long.body.message, /^Idempotency-Key header:/);
  });
});

describe('rate limits', () => {
  let server: TestServer;
  let key: string;
  before(async () => {
    server = await startServer({ SVC_RATE_LIMIT_READS: '5', SVC_RATE_LIMIT_WRITES: '2', SVC_RATE_LIMIT_INGEST_EVENTS: '50' });
    key = (await createTenantKey(server, 'limited')).key;
  });
  after(async () => server?.cleanup());

  test('reads past the limit get 429 with Retry-After; another key has its own bucket', async () => {
    const statuses: number[] = [];
    let limited: Awaited<ReturnType<TestServer['request']>> | null = null;
    for (let i = 0; i < 12; i++) {
      const res = await server.request('GET', '/v1/traces?limit=1', { key });
      statuses.push(res.status);
      if (res.status === 429) limited = res;
    }
    assert.ok(statuses.includes(200));
    assert.ok(limited, `expected a 429 among ${statuses}`);
    assert.equal(limited.body.error, 'rate_limited');
    assert.ok(Number(limited.headers.get('retry-after')) >= 1);
    const other = (await createTenantKey(server, 'unlimited-neighbour')).key;
    assert.equal((await server.request('GET', '/v1/traces?limit=1', { key: other })).status, 200);
  });

  test('ingest is limited in events per second, not requests', async () => {
    const ok = await server.request('POST', '/v1/traces', { key, body: { events: Array.from({ length: 40 }, () => traceEvent()) } });
    assert.equal(ok.status, 200, ok.text);
    const over = await server.request('POST', '/v1/traces', { key, body: { events: Array.from({ length: 40 }, () => traceEvent()) } });
    assert.equal(over.status, 429);
    assert.match(over.body.message, /trace events per second/);
    assert.ok(Number(over.headers.get('retry-after')) >= 1);
  });
});

describe('errors, metrics and durability', () => {
  let server: TestServer;
  let key: string;
  before(async () => {
    server = await startServer({ SVC_LOG_FSYNC: 'always' });
    key = (await createTenantKey(server, 'acme')).key;
  });
  after(async () => server?.cleanup());

  test('an unknown route is a 404 in the error shape', async () => {
    const res = await server.request('GET', '/v1/nothing-here', { key });
    assert.equal(res.status, 404);
    assert.deepEqual(res.body, { message: 'no route GET /v1/nothing-here', error: 'not_found' });
  });

  test('GET /metrics exposes ingest, consumer lag, sink batches and sandboxes by state', async () => {
    await server.request('POST', '/v1/traces', { key, body: { events: [traceEvent()] } });
    const res = await server.request('GET', '/metrics');
    assert.equal(res.status, 200);
    assert.match(res.text, /svc_ingested_events_total\{endpoint="\/v1\/traces"\} \d+/);
    for (const stage of ['decode', 'append', 'visible'])
      assert.match(res.text, new RegExp(`svc_ingest_stage_duration_seconds_count\\{stage="${stage}"\\} [1-9]`), stage);
    assert.match(res.text, /svc_consumer_lag_records\{group="sink\.trace_events",topic="svc\.traces"\} \d+/);
    assert.match(res.text, /svc_sink_batch_items_count\{table="trace_events"\} [1-9]/);
    assert.match(res.text, /svc_sink_insert_duration_seconds_bucket/);
    assert.match(res.text, /svc_sandboxes\{state="running"\} 0/);
    assert.match(res.text, /svc_http_requests_total/);
  });

  test('acknowledged events survive kill -9', async () => {
    const events = Array.from({ length: 50 }, (_, i) => traceEvent({ tool: 'kill9', span_id: `k${i}` }));
    assert.equal((await server.request('POST', '/v1/traces', { key, body: { events } })).status, 200);
    await server.kill9();
    await server.restart();
    assert.equal((await server.request('GET', '/v1/traces?tool=kill9', { key })).body.count, 50);
  });
});
