/**
 * Processes of a distributed deployment start in any order on documented settings (issue 14,
 * docs/operations.md "Settings per service"): each its own `svc run` process on the real broker,
 * with its own data dir and namespace. An actor started before the api waits for the api's
 * built-in registry and registers its subjects with the service key, under the default write
 * limit of 10 per second; a registry that answers 429 or 5xx is retried; a process that cannot
 * reach Kafka or ClickHouse says which and retries instead of exiting; a wrong service key stops
 * the process with the setting named. The api runs with the sink and the scorer on chDB (no
 * ClickHouse server here): a scorer alone would read an empty store of its own, so `svc run`
 * refuses it, naming SVC_STORE. The aggregator reads no store: in its own process it completes
 * an experiment with the metrics the api computes.
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

const runtime = brokers ? backend('SVC_TEST_BWRAP', 'an experiment with the aggregator in its own process') : null;

const SERVICE_KEY = 'service-key-for-the-test-0123';
const SECRETS_KEY = 'ab'.repeat(32);
/**
 * 2 scenarios x 2 replicas; the go scenario passes, the py one fails. Each run's agent reports one
 * model call (0.25 USD) and one failed tool call from inside its sandbox.
 */
const DIST_SPEC = `version: 1
id: dist
base: debian:bookworm
task: {prompt: write out.txt}
agent:
  type: cli
  command: |
    curl -sf -X POST "$SVC_BASE_URL/v1/sandboxes/$SVC_SANDBOX_ID/trace" -H "authorization: Bearer $SVC_API_KEY" -H 'content-type: application/json' --data-binary '${JSON.stringify(
      [
        {
          ts: '2026-01-01T00:00:00Z',
          event_type: 'llm_call',
          tool: 'chat',
          phase: 'complete',
          span_id: 'llm-1',
          cost: { model: 'gpt-4o', input_tokens: 1000, output_tokens: 100, estimated_usd: 0.25 },
        },
        { ts: '2026-01-01T00:00:01Z', event_type: 'tool_use', tool: 'bash', phase: 'complete', span_id: 'tool-1', parent_span_id: 'llm-1', status: 'error' },
      ],
    )}' && if [ "$SVC_PARAM_LANG" = go ]; then echo done > out.txt; fi
invariants:
  out: {check: {type: file_exists, path: out.txt}}
parallelism: {replicas: 2, matrix: [{lang: go}, {lang: py}]}
`;
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
      const p = runSvc(services, {
        SVC_LOG_BACKEND: 'kafka',
        SVC_KAFKA_BROKERS: brokers!,
        SVC_LOG_NAMESPACE: ns,
        SVC_SERVICE_KEY: SERVICE_KEY,
        SVC_DATA_DIR: dir,
        ...env,
      });
      processes.push(p);
      return p;
    }
    const registryOfApi = () => ({ SVC_SCHEMA_REGISTRY_URL: `${apiUrl()}/schema-registry` });

    before(async () => {
      apiPort = await freePort();
    });
    after(async () => {
      await Promise.all(processes.map((p) => p.kill9()));
      // A killed runner's launcher unmounts its disks (workspaces, warm sandboxes', the spare) a moment after.
      await Promise.all(dirs.map((d) => rm(d, { recursive: true, force: true, maxRetries: 20, retryDelay: 300 })));
    });

    test('an actor started before the api waits for its registry, then registers its subjects with the service key', async () => {
      // This aggregator is the deployment's only one: the experiment below runs through it.
      const aggregator = await start(['aggregator'], registryOfApi());
      await aggregator.waitFor(new RegExp(`cannot reach the schema registry at http://127.0.0.1:${apiPort}/schema-registry yet; retrying`));
      assert.equal(aggregator.exit(), null, 'the aggregator waits, it does not exit');

      // The api on default limits: 10 writes per second per key, which ~20 registrations at once pass.
      // On chDB the scorer reads what the sink stores only in the sink's process.
      api = await start(['api', 'sink', 'scorer'], { SVC_API_KEY: ADMIN_KEY, SVC_SECRETS_KEY: SECRETS_KEY, SVC_PORT: String(apiPort), SVC_HOST: '127.0.0.1' });
      await api.waitFor(/"msg":"started"/);
      await aggregator.waitFor(/"msg":"started"/);
      await aggregator.waitFor(/"msg":"the schema registry at [^"]+ is reachable"/);
      assert.doesNotMatch(aggregator.output(), /\b429\b|rate limit/);
      assert.match(aggregator.output(), /"store":"none"[^\n]*"msg":"started"/, 'the aggregator opens no store');
      assert.doesNotMatch(aggregator.output(), /chDB|store migrations/);
    });

    test('a scorer without the sink on chDB refuses to start, naming SVC_STORE', async () => {
      const scorer = await start(['scorer'], registryOfApi());
      assert.equal(await scorer.exited(), 1);
      assert.match(scorer.output(), /Bad configuration for svc run scorer:\n {2}SVC_STORE: scorer reads the store the sink writes: set SVC_STORE=clickhouse/);
    });

    if (runtime) {
      test("with the aggregator in its own process, the completed experiment's metrics are the api's, and offline scoring grades its runs", async () => {
        const runner = await start(['sandbox-runner'], {
          ...registryOfApi(),
          SVC_SECRETS_KEY: SECRETS_KEY,
          SVC_SANDBOX_HOST_ROOTFS: 'true',
          SVC_BASE_URL: apiUrl(),
        });
        await runner.waitFor(/"msg":"started"/, 90_000);
        const call = async (method: string, p: string, body?: unknown, type = 'application/json') => {
          const res = await fetch(`${apiUrl()}${p}`, {
            method,
            headers: { authorization: `Bearer ${ADMIN_KEY}`, ...(body === undefined ? {} : { 'content-type': type }) },
            body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
          });
          const text = await res.text();
          return { status: res.status, text, body: text && res.headers.get('content-type')?.includes('json') ? JSON.parse(text) : text };
        };
        assert.equal((await call('POST', '/v1/specs', DIST_SPEC, 'application/x-yaml')).status, 201);
        const created = await call('POST', '/v1/experiments', { name: 'split', spec_id: 'dist' });
        assert.equal(created.status, 201, created.text);
        const id: string = created.body.id;
        assert.equal((await call('POST', `/v1/experiments/${id}/run`)).status, 202);
        const deadline = Date.now() + 120_000;
        let results = (await call('GET', `/v1/experiments/${id}`)).body;
        while (!['completed', 'failed', 'cancelled'].includes(results.status)) {
          assert.ok(Date.now() < deadline, `still ${results.status}: ${JSON.stringify(results).slice(0, 600)}`);
          await new Promise((r) => setTimeout(r, 200));
          results = (await call('GET', `/v1/experiments/${id}`)).body;
        }
        assert.equal(results.status, 'completed', JSON.stringify(results).slice(0, 1000));

        // The api's metrics, from the tables; the aggregator's snapshot, from the scores it folded.
        const metrics = await call('GET', `/v1/metrics/experiments/${id}`);
        assert.equal(metrics.status, 200, metrics.text);
        assert.deepEqual([metrics.body.runs, metrics.body.completed_runs, metrics.body.pass_rate], [4, 4, 0.5]);
        assert.equal(metrics.body.total_cost_usd, 1);
        assert.deepEqual([metrics.body.mean_tool_calls, metrics.body.tool_success_rate], [1, 0], 'one failed tool call per run');
        const history = await call('GET', '/v1/evals/dist/history');
        assert.equal(history.status, 200, history.text);
        const snapshot = history.body.items.find((i: { experiment_id: string }) => i.experiment_id === id)?.metrics;
        assert.deepEqual(snapshot, metrics.body, 'the snapshot taken at completion is what the api computes');

        // Offline scoring reads the stored runs and their traces (the scorer beside the sink).
        const rule = await call('POST', '/v1/score-rules', { name: 'spent', type: 'threshold', condition: 'cost_usd > 0.2', eval_id: 'dist' });
        assert.equal(rule.status, 201, rule.text);
        const scoring = await call('POST', `/v1/experiments/${id}/score`, { rule_ids: [rule.body.id] });
        assert.equal(scoring.status, 202, scoring.text);
        assert.equal(scoring.body.runs, 4);
        let scores: Array<{ passed: boolean | null }> = [];
        while (scores.length < 4) {
          assert.ok(Date.now() < deadline + 60_000, `offline scoring wrote ${scores.length} of 4 scores`);
          await new Promise((r) => setTimeout(r, 200));
          scores = (await call('GET', `/v1/experiments/${id}/scores`)).body.items;
        }
        assert.deepEqual(
          scores.map((s) => s.passed),
          [true, true, true, true],
        );
      });
    }

    test('the service key reaches the registry only, outside the rate limits, which tenant keys still meet', async () => {
      const register = (authorization: string, i: number) =>
        fetch(`${apiUrl()}/schema-registry/subjects/${ns}probe-${i}-value/versions`, {
          method: 'POST',
          headers: { authorization, 'content-type': 'application/vnd.schemaregistry.v1+json' },
          body: JSON.stringify({ schema: JSON.stringify({ type: 'record', name: `Probe${i}`, fields: [{ name: 'n', type: 'long' }] }) }),
        });
      const service = await Promise.all(Array.from({ length: 40 }, (_, i) => register(basic(SERVICE_KEY), i)));
      assert.deepEqual([...new Set(service.map((r) => r.status))], [200]);

      const created = await fetch(`${apiUrl()}/v1/admin/keys`, {
        method: 'POST',
        headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json' },
        body: JSON.stringify({ tenant: 'acme' }),
      });
      const tenantKey = ((await created.json()) as { key: string }).key;
      const tenant = await Promise.all(Array.from({ length: 40 }, (_, i) => register(basic(tenantKey), i)));
      assert.ok(
        tenant.some((r) => r.status === 429),
        `a tenant key meets the write limit: ${tenant.map((r) => r.status)}`,
      );
      assert.ok(
        tenant.every((r) => r.status === 429 || r.status === 403),
        'and the registry refuses it anyway',
      );

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
      const aggregator = await start(['aggregator'], { ...registryOfApi(), SVC_KAFKA_BROKERS: `127.0.0.1:${port}` });
      await aggregator.waitFor(new RegExp(`cannot reach Kafka at 127.0.0.1:${port} yet; retrying`), 60_000);
      assert.equal(aggregator.exit(), null);
      const [host, brokerPort] = brokers!.split(',')[0]!.split(':');
      const forwarder = net.createServer((socket) => socket.pipe(net.connect(Number(brokerPort), host)).pipe(socket));
      await new Promise<void>((resolve) => forwarder.listen(port, '127.0.0.1', resolve));
      try {
        await aggregator.waitFor(/"msg":"started"/, 90_000);
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
