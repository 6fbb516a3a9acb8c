/**
 * Processes of a distributed deployment start in any order on documented settings (issue 14,
 * docs/operations.md "Settings per service"): each its own `svc run` process on the real broker,
 * with its own data dir and namespace. An actor started before the api waits for the api's
 * built-in registry and registers its subjects with the service key, under the default write
 * limit of 10 per second; a registry that answers 429 or 5xx is retried; a process that cannot
 * reach Kafka or ClickHouse says which and retries instead of exiting; a wrong service key stops
 * the process with the setting named.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import http from 'node:http';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { backend } from '../helpers/backend.ts';
import { ADMIN_KEY, freePort } from '../helpers/server.ts';
import { runSvc, type SvcProcess } from '../helpers/svc-process.ts';

const NAME = 'distributed processes start in any order';
const brokers = backend('SVC_TEST_KAFKA_BROKERS', NAME);

const SERVICE_KEY = 'service-key-for-the-test-0123';
const basic = (key: string) => `Basic ${Buffer.from(`svc:${key}`).toString('base64')}`;

if (brokers) {
  describe(NAME, () => {
    const ns = `dist-${randomBytes(4).toString('hex')}.`;
    const dirs: string[] = [];
    const processes: SvcProcess[] = [];
    let apiPort: number;
    let api: SvcProcess;
    const apiUrl = () => `http://127.0.0.1:${apiPort}`;

    /** A process of this deployment, with its own data dir. */
    async function start(services: string[], env: Record<string, string> = {}): Promise<SvcProcess> {
      const dir = await mkdtemp(path.join(os.tmpdir(), 'svc-dist-'));
      dirs.push(dir);
      const p = runSvc(services, { SVC_LOG_BACKEND: 'kafka', SVC_KAFKA_BROKERS: brokers!, SVC_LOG_NAMESPACE: ns, SVC_SERVICE_KEY: SERVICE_KEY, SVC_DATA_DIR: dir, ...env });
      processes.push(p);
      return p;
    }
    const registryOfApi = () => ({ SVC_SCHEMA_REGISTRY_URL: `${apiUrl()}/schema-registry` });

    before(async () => {
      apiPort = await freePort();
    });
    after(async () => {
      await Promise.all(processes.map((p) => p.kill9()));
      await Promise.all(dirs.map((d) => rm(d, { recursive: true, force: true })));
    });

    test('an actor started before the api waits for its registry, then registers its subjects with the service key', async () => {
      const scorer = await start(['scorer'], registryOfApi());
      await scorer.waitFor(new RegExp(`cannot reach the schema registry at http://127.0.0.1:${apiPort}/schema-registry yet; retrying`));
      assert.equal(scorer.exit(), null, 'the scorer waits, it does not exit');

      // The api on default limits: 10 writes per second per key, which ~20 registrations at once pass.
      api = await start(['api', 'sink'], { SVC_API_KEY: ADMIN_KEY, SVC_SECRETS_KEY: 'ab'.repeat(32), SVC_PORT: String(apiPort), SVC_HOST: '127.0.0.1' });
      await api.waitFor(/"msg":"started"/);
      await scorer.waitFor(/"msg":"started"/);
      await scorer.waitFor(/"msg":"the schema registry at [^"]+ is reachable"/);
      assert.doesNotMatch(scorer.output(), /\b429\b|rate limit/);
    });

    test('the service key reaches the registry only, outside the rate limits, which tenant keys still meet', async () => {
      const register = (authorization: string, i: number) =>
        fetch(`${apiUrl()}/schema-registry/subjects/${ns}probe-${i}-value/versions`, {
          method: 'POST',
          headers: { authorization, 'content-type': 'application/vnd.schemaregistry.v1+json' },
          body: JSON.stringify({ schema: JSON.stringify({ type: 'record', name: `Probe${i}`, fields: [{ name: 'n', type: 'long' }] }) }),
        });
      const service = await Promise.all(Array.from({ length: 40 }, (_, i) => register(basic(SERVICE_KEY), i)));
      assert.deepEqual([...new Set(service.map((r) => r.status))], [200]);

      const created = await fetch(`${apiUrl()}/v1/admin/keys`, { method: 'POST', headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json' }, body: JSON.stringify({ tenant: 'acme' }) });
      const tenantKey = ((await created.json()) as { key: string }).key;
      const tenant = await Promise.all(Array.from({ length: 40 }, (_, i) => register(basic(tenantKey), i)));
      assert.ok(tenant.some((r) => r.status === 429), `a tenant key meets the write limit: ${tenant.map((r) => r.status)}`);
      assert.ok(tenant.every((r) => r.status === 429 || r.status === 403), 'and the registry refuses it anyway');

      const elsewhere = await fetch(`${apiUrl()}/v1/traces`, { headers: { authorization: `Bearer ${SERVICE_KEY}` } });
      assert.equal(elsewhere.status, 403);
      assert.deepEqual(await elsewhere.json(), { error: 'forbidden', message: 'the service key (SVC_SERVICE_KEY) is valid only for /schema-registry' });
    });

    test('a wrong service key stops the process at once, naming the setting', async () => {
      const aggregator = await start(['aggregator'], { ...registryOfApi(), SVC_SERVICE_KEY: 'not-the-service-key-0123' });
      assert.equal(await aggregator.exited(), 1);
      assert.match(aggregator.output(), /failed with 401[\s\S]*set SVC_SERVICE_KEY to the api process's value/);
    });

    test('a registry answering 429 and 503 is retried until it registers', async () => {
      // A gateway in front of the api's registry, like an external registry under load: it
      // refuses its first requests (429 with Retry-After, then 503), then forwards.
      let refused = 0;
      const gateway = http.createServer((req, res) => {
        if (refused < 6) {
          refused++;
          res.writeHead(refused % 2 ? 429 : 503, { 'retry-after': '1', 'content-type': 'application/json' });
          res.end(JSON.stringify({ error_code: refused % 2 ? 42901 : 50301, message: 'busy' }));
          return;
        }
        const upstream = http.request(`${apiUrl()}${req.url}`, { method: req.method, headers: req.headers }, (answer) => {
          res.writeHead(answer.statusCode!, answer.headers);
          answer.pipe(res);
        });
        req.pipe(upstream);
      });
      await new Promise<void>((resolve) => gateway.listen(0, '127.0.0.1', resolve));
      try {
        const { port } = gateway.address() as net.AddressInfo;
        const aggregator = await start(['aggregator'], { SVC_SCHEMA_REGISTRY_URL: `http://127.0.0.1:${port}/schema-registry` });
        await aggregator.waitFor(/"msg":"started"/);
        assert.equal(refused, 6);
      } finally {
        gateway.closeAllConnections();
        await new Promise((resolve) => gateway.close(resolve));
      }
    });

    test('a process that cannot reach Kafka says so, and starts once Kafka is there', async () => {
      // Kafka behind a port that refuses connections until a forwarder opens on it.
      const port = await freePort();
      const scorer = await start(['scorer'], { ...registryOfApi(), SVC_KAFKA_BROKERS: `127.0.0.1:${port}` });
      await scorer.waitFor(new RegExp(`cannot reach Kafka at 127.0.0.1:${port} yet; retrying`), 60_000);
      assert.equal(scorer.exit(), null);
      const [host, brokerPort] = brokers!.split(',')[0]!.split(':');
      const forwarder = net.createServer((socket) => socket.pipe(net.connect(Number(brokerPort), host)).pipe(socket));
      await new Promise<void>((resolve) => forwarder.listen(port, '127.0.0.1', resolve));
      try {
        await scorer.waitFor(/"msg":"started"/, 90_000);
      } finally {
        forwarder.close();
      }
    });

    test('a process that cannot reach ClickHouse says so and keeps trying', async () => {
      const port = await freePort();
      const scorer = await start(['scorer'], { ...registryOfApi(), SVC_STORE: 'clickhouse', SVC_CLICKHOUSE_URL: `http://default:@127.0.0.1:${port}/default` });
      const again = new RegExp(`"attempt":2,[^\\n]*"msg":"cannot reach ClickHouse at 127.0.0.1:${port} yet; retrying"`);
      await scorer.waitFor(again, 60_000);
      assert.equal(scorer.exit(), null, 'still waiting for ClickHouse, not exited');
    });
  });
}
