/**
 * The service on the Kafka backend: the same vertical slice (keys, trace ingest with
 * read-your-writes, idempotency after a restart) with the event log on a real broker and the
 * built-in schema registry on its `_schemas` topic. Each run gets its own SVC_LOG_NAMESPACE, so
 * it shares the broker with other test files without seeing their records.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, describe, test } from 'node:test';
import { backend } from '../helpers/backend.ts';
import { createTenantKey, startServer, traceEvent, type TestServer } from '../helpers/server.ts';

const NAME = 'the service on Kafka';
const brokers = backend('SVC_TEST_KAFKA_BROKERS', NAME);

if (brokers) {
  describe(NAME, () => {
    const namespace = `e2e-${randomBytes(4).toString('hex')}.`;
    let server: TestServer;
    let key: string;
    before(async () => {
      server = await startServer({ SVC_LOG_BACKEND: 'kafka', SVC_KAFKA_BROKERS: brokers, SVC_LOG_NAMESPACE: namespace });
      key = (await createTenantKey(server, 'acme')).key;
    });
    after(async () => server?.cleanup());

    test('health names the Kafka backend', async () => {
      const res = await server.request('GET', '/health', { key: null });
      assert.equal(res.status, 200);
      assert.deepEqual(res.body.log, { backend: 'kafka', ok: true });
    });

    const events = Array.from({ length: 300 }, (_, i) => traceEvent({ tool: 'on-kafka', span_id: `k${i}` }));

    test('a GET right after the POST sees the events', async () => {
      const post = await server.request('POST', '/v1/traces', { key, body: { events }, headers: { 'idempotency-key': 'kafka-1' } });
      assert.equal(post.status, 200, post.text);
      const get = await server.request('GET', '/v1/traces?tool=on-kafka&limit=1000', { key });
      assert.equal(get.body.count, 300);
    });

    test('keys, traces and the idempotency cache survive a restart; replays add no rows', async () => {
      assert.equal(await server.stop(), 0);
      await server.restart();
      assert.equal((await server.request('GET', '/v1/traces?tool=on-kafka&limit=1000', { key })).body.count, 300);
      const retry = await server.request('POST', '/v1/traces', {
        key,
        body: { events },
        headers: { 'idempotency-key': 'kafka-1' },
      });
      assert.equal(retry.headers.get('idempotent-replayed'), 'true');
      assert.equal((await server.request('GET', '/v1/traces?tool=on-kafka&limit=1000', { key })).body.count, 300);
    });

    test('the built-in registry serves the subjects of the catalog, under the namespace', async () => {
      const res = await server.request('GET', '/schema-registry/subjects');
      assert.equal(res.status, 200);
      assert.ok(res.body.includes(`${namespace}svc.traces-value`), JSON.stringify(res.body));
    });
  });
}
