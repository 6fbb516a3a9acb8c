/**
 * Trace ingest answered as soon as the log holds the events (`Prefer: respond-async`), with a
 * visibility token to wait on (GET /v1/traces/visibility): on every ingest endpoint, with bad
 * tokens and waits as 400s, the default answer unchanged without the preference, and nothing
 * acknowledged lost nor stored twice across a kill -9 of the service right after the answers.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, describe, test } from 'node:test';
import { adminSql, createTenantKey, startServer, traceEvent, type TestServer } from '../helpers/server.ts';

describe('ingest answered once durable (Prefer: respond-async)', () => {
  let server: TestServer;
  let key: string;
  const ASYNC = { prefer: 'respond-async' };

  before(async () => {
    server = await startServer({ SVC_RATE_LIMIT_WRITES: '0', SVC_RATE_LIMIT_READS: '0' });
    key = (await createTenantKey(server, 'acme')).key;
  });
  after(() => server?.cleanup());

  test('POST /v1/traces: 202 with Preference-Applied and a token, which becomes visible; without the preference the answer is as before', async () => {
    const tool = `async-${randomBytes(4).toString('hex')}`;
    const res = await server.request('POST', '/v1/traces', { key, headers: ASYNC, body: { events: [traceEvent({ tool }), traceEvent({ tool })] } });
    assert.equal(res.status, 202, res.text);
    assert.equal(res.headers.get('preference-applied'), 'respond-async');
    const token = res.headers.get('svc-visibility-token');
    assert.match(token ?? '', /^v1\./);
    assert.deepEqual(res.body, { ingested: 2, visibility_token: token });
    const seen = await server.request('GET', `/v1/traces/visibility?token=${encodeURIComponent(token!)}&wait=10s`, { key });
    assert.deepEqual([seen.status, seen.body], [200, { visible: true }]);
    const listed = await server.request('GET', `/v1/traces?tool=${tool}`, { key });
    assert.equal(listed.body.count, 2, listed.text);

    const plain = await server.request('POST', '/v1/traces', { key, body: { events: [traceEvent({ tool })] } });
    assert.equal(plain.status, 200, plain.text);
    assert.equal(plain.headers.get('preference-applied'), null);
    assert.deepEqual(plain.body, { ingested: 1 });
    // Read-your-writes without the preference: queryable when answered.
    assert.equal((await server.request('GET', `/v1/traces?tool=${tool}`, { key })).body.count, 3);
  });

  test('OTLP answers 200 (as OTLP/HTTP requires) with the token in its headers', async () => {
    const span = {
      traceId: 'ab'.repeat(16),
      spanId: 'cd'.repeat(8),
      name: 'async-span',
      startTimeUnixNano: '1700000000000000000',
      endTimeUnixNano: '1700000000100000000',
    };
    const body = { resourceSpans: [{ resource: { attributes: [] }, scopeSpans: [{ spans: [span] }] }] };
    const res = await server.request('POST', '/otel/v1/traces', { key, headers: ASYNC, body });
    assert.equal(res.status, 200, res.text);
    assert.equal(res.headers.get('preference-applied'), 'respond-async');
    const token = res.headers.get('svc-visibility-token')!;
    assert.deepEqual((await server.request('GET', `/v1/traces/visibility?token=${encodeURIComponent(token)}&wait=10s`, { key })).body, { visible: true });
  });

  test('bad tokens and waits are 400s naming the parameter; a token never written is not visible', async () => {
    for (const token of ['', 'nope', 'v1.', 'v1.!!!', `v1.${Buffer.from('0:x').toString('base64url')}`]) {
      const res = await server.request('GET', `/v1/traces/visibility?token=${encodeURIComponent(token)}`, { key });
      assert.equal(res.status, 400, `${token}: ${res.text}`);
      assert.match(res.body.message, /^token: /);
    }
    const future = `v1.${Buffer.from('0:999999999').toString('base64url')}`;
    for (const wait of ['soon', '1h']) {
      const res = await server.request('GET', `/v1/traces/visibility?token=${future}&wait=${wait}`, { key });
      assert.equal(res.status, 400, res.text);
      assert.match(res.body.message, /^wait: /);
    }
    const notYet = await server.request('GET', `/v1/traces/visibility?token=${future}&wait=200ms`, { key });
    assert.deepEqual([notYet.status, notYet.body], [200, { visible: false }]);
  });

  test('kill -9 right after 100 acknowledged requests: after the restart every acknowledged event is there, once', { timeout: 120_000 }, async () => {
    const tool = `crash-${randomBytes(4).toString('hex')}`;
    const tokens: string[] = [];
    let acknowledged = 0;
    await Promise.all(
      Array.from({ length: 8 }, async (_, worker) => {
        for (let i = worker; i < 100; i += 8) {
          const events = Array.from({ length: 20 }, (__, j) => traceEvent({ tool, span_id: `r${i}e${j}` }));
          let res = await server.request('POST', '/v1/traces', { key, headers: ASYNC, body: { events } });
          // Past SVC_INGEST_MAX_LAG the service pushes back: a client waits as Retry-After says and posts again.
          while (res.status === 503) {
            assert.equal(res.body.error, 'overloaded', res.text);
            await new Promise((r) => setTimeout(r, Number(res.headers.get('retry-after')) * 1000));
            res = await server.request('POST', '/v1/traces', { key, headers: ASYNC, body: { events } });
          }
          assert.equal(res.status, 202, res.text);
          acknowledged += res.body.ingested;
          tokens.push(res.body.visibility_token);
        }
      }),
    );
    await server.kill9();
    await server.restart();
    for (const token of tokens) {
      const seen = await server.request('GET', `/v1/traces/visibility?token=${encodeURIComponent(token)}&wait=20s`, { key });
      assert.deepEqual(seen.body, { visible: true }, token);
    }
    const [row] = await adminSql(server, `SELECT count() AS n, uniqExact(EventId) AS distinct_ids FROM trace_events FINAL WHERE SpanName = '${tool}'`);
    assert.equal(acknowledged, 2000);
    assert.deepEqual({ n: Number(row!.n), ids: Number(row!.distinct_ids) }, { n: 2000, ids: 2000 }, 'every acknowledged event, once');
  });
});
