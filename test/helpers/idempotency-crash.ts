/**
 * The idempotency crash drill (test/e2e/idempotency-crash*.test.ts): an Idempotency-Key retry
 * after a crash stores a request's effect once. The api appends a batch (or stores a spec, an
 * agent, a key, a rule, an experiment, a sandbox), then records the response; killed (-9, a real
 * process kill) in between, the effect is there but no response was recorded, so the client's
 * retry runs the request again. The server-made event ids derive from the key and the request, so
 * the replayed events are the same events and the store keeps them once. SVC_TEST_IDEMPOTENCY_HOLD
 * opens the window between the two steps; the process is killed inside it. Every case restarts the
 * service three times, so the cases are spread over files of a few minutes each.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, describe, test } from 'node:test';
import { makeBundle, uploadAgent } from './bundles.ts';
import { SPEC } from './sandboxes.ts';
import { adminSql, createTenantKey, startServer, traceEvent, type TestServer } from './server.ts';

const BATCH = 300;

async function waitForOutput(server: TestServer, pattern: RegExp, ms = 30_000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!pattern.test(server.output())) {
    if (Date.now() > deadline) assert.fail(`no ${pattern} in the service's output within ${ms} ms:\n${server.output().slice(-3000)}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** A request whose answer must never come: the process dies first. Resolves with 'connection lost'. */
function diesWithTheProcess(request: Promise<{ status: number }>): Promise<string> {
  return request.then(
    (res) => assert.fail(`the first try was answered (${res.status}) instead of dying with the process`),
    () => 'connection lost',
  );
}

/** The drill's cases; each file runs some of them (all of them take too long for one file). */
export type CrashCase = 'traces' | 'specs' | 'agents' | 'keys-and-rules' | 'experiments' | 'sandboxes' | 'other-keys';

/** Registers the drill `name`, on a service started with `env`, with the tests of `cases`. */
export function crashDrill(name: string, env: Record<string, string>, cases: CrashCase[]) {
  /** Registers `fn` as a test when this file runs `crashCase`. */
  const caseOf = (crashCase: CrashCase, title: string, fn: () => Promise<void>) => {
    if (cases.includes(crashCase)) test(title, fn);
  };
  describe(name, () => {
    let server: TestServer;
    let key: string;
    before(async () => {
      server = await startServer({ ...env, SVC_TEST_IDEMPOTENCY_HOLD: '10m', SVC_SANDBOX_HOST_ROOTFS: 'true' });
      key = (await createTenantKey(server, 'acme')).key;
    });
    after(async () => server?.cleanup());

    caseOf('traces', 'kill -9 between the append and the recorded response, then the retry: one batch in the store', async () => {
      const tool = `crash-${randomBytes(4).toString('hex')}`;
      // No event_id: every id is the server's to make.
      const body = { events: Array.from({ length: BATCH }, (_, i) => traceEvent({ tool, span_id: `s${i}` })) };
      const post = () => server.request('POST', '/v1/traces', { key, body, headers: { 'idempotency-key': 'batch-1' } });

      const first = diesWithTheProcess(post());
      await waitForOutput(server, /holding before recording the idempotent response/);
      // The batch is appended and queryable; only the recorded response is missing.
      assert.equal((await server.request('GET', `/v1/traces?tool=${tool}&limit=1000`, { key })).body.count, BATCH);
      await server.kill9();
      assert.equal(await first, 'connection lost');

      server.env.SVC_TEST_IDEMPOTENCY_HOLD = '0';
      await server.restart();
      const retry = await post();
      assert.equal(retry.status, 200, retry.text);
      assert.deepEqual(retry.body, { ingested: BATCH });
      assert.equal(retry.headers.get('idempotent-replayed'), null, 'nothing was recorded, so the request ran again');

      // The log holds the batch twice; the store keeps one copy of each event.
      assert.equal((await server.request('GET', `/v1/traces?tool=${tool}&limit=1000`, { key })).body.count, BATCH);
      const [final] = await adminSql(server, `SELECT count() AS n, uniqExact(EventId) AS ids FROM trace_events FINAL WHERE SpanName = '${tool}'`);
      assert.deepEqual(final, { n: String(BATCH), ids: String(BATCH) });

      // Now the response is recorded: a third try is a replay.
      const third = await post();
      assert.equal(third.headers.get('idempotent-replayed'), 'true');
      assert.deepEqual(third.body, { ingested: BATCH });
    });

    /** Runs `post` with the response held, kills the process inside the hold, restarts it, and answers the retry. */
    async function crashAndRetry(post: () => Promise<{ status: number; body: any; text: string }>): Promise<{ status: number; body: any; text: string }> {
      server.env.SVC_TEST_IDEMPOTENCY_HOLD = '10m';
      await server.stop();
      await server.restart();
      const holds = (server.output().match(/holding before recording the idempotent response/g) ?? []).length;
      const first = diesWithTheProcess(post());
      const deadline = Date.now() + 30_000;
      while ((server.output().match(/holding before recording the idempotent response/g) ?? []).length === holds) {
        assert.ok(Date.now() < deadline, 'the request was not held');
        await new Promise((r) => setTimeout(r, 50));
      }
      await server.kill9();
      assert.equal(await first, 'connection lost');
      server.env.SVC_TEST_IDEMPOTENCY_HOLD = '0';
      await server.restart();
      return post();
    }

    caseOf('specs', 'kill -9 between storing a spec version and the recorded response, then the retry: one new version', async () => {
      const spec = `crash-version-${randomBytes(4).toString('hex')}`;
      const retry = await crashAndRetry(() =>
        server.request('POST', '/v1/specs', { key, body: SPEC(spec), headers: { 'content-type': 'application/x-yaml', 'idempotency-key': `spec-${spec}` } }),
      );
      assert.equal(retry.status, 201, retry.text);
      assert.equal(retry.body.version, 1);
      assert.equal((await server.request('GET', `/v1/specs/${spec}`, { key })).body.version, 1);
      assert.equal((await server.request('GET', `/v1/specs/${spec}?version=2`, { key })).status, 404, 'one version, the one the first try stored');
    });

    caseOf('agents', 'kill -9 between storing an agent snapshot and the recorded response, then the retry: one new version', async () => {
      const name = `crash-agent-${randomBytes(4).toString('hex')}`;
      const bundle = await makeBundle({ 'run.sh': '#!/bin/sh\necho hi\n' });
      const retry = await crashAndRetry(
        () =>
          uploadAgent(server, key, { name, entrypoint: ['sh', 'run.sh'] }, bundle, { 'idempotency-key': `agent-${name}` }) as Promise<{
            status: number;
            body: any;
            text: string;
          }>,
      );
      assert.equal(retry.status, 201, JSON.stringify(retry.body));
      assert.equal(retry.body.version, 1);
      const versions = await server.request('GET', `/v1/agents/${name}/versions`, { key });
      assert.equal(versions.status, 200, versions.text);
      assert.deepEqual(
        (versions.body.items ?? versions.body).map((v: any) => v.version),
        [1],
        'one version, the one the first try stored',
      );
    });

    caseOf('keys-and-rules', 'kill -9 between making an API key or a score rule and the recorded response: no second one', async () => {
      const name = `crash-key-${randomBytes(4).toString('hex')}`;
      const keyRetry = await crashAndRetry(() =>
        server.request('POST', '/v1/admin/keys', { body: { tenant: 'acme', name }, headers: { 'idempotency-key': name } }),
      );
      // Its secret was in the lost answer: the retry says which key to rotate instead of making another.
      assert.equal(keyRetry.status, 409, keyRetry.text);
      const made = /the key this request made, (key_[0-9a-f]{16}), exists/.exec(keyRetry.body.message);
      assert.ok(made, keyRetry.body.message);
      const keys = (await server.request('GET', '/v1/admin/keys?tenant=acme')).body.items.filter((k: any) => k.name === name);
      assert.deepEqual(
        keys.map((k: any) => k.id),
        [made[1]],
      );

      const rule = `crash-rule-${randomBytes(4).toString('hex')}`;
      const ruleRetry = await crashAndRetry(() =>
        server.request('POST', '/v1/score-rules', {
          key,
          body: { name: rule, type: 'threshold', condition: 'wall_ms < 60000' },
          headers: { 'idempotency-key': rule },
        }),
      );
      assert.equal(ruleRetry.status, 201, ruleRetry.text);
      const rules = (await server.request('GET', '/v1/score-rules', { key })).body.items.filter((r: any) => r.name === rule);
      assert.deepEqual(
        rules.map((r: any) => r.id),
        [ruleRetry.body.id],
        'one rule, the one the first try made',
      );
    });

    caseOf('experiments', 'kill -9 between making an experiment and the recorded response, then the retry: the same experiment, once', async () => {
      const spec = `crash-spec-${randomBytes(4).toString('hex')}`;
      const put = await server.request('POST', '/v1/specs', { key, body: SPEC(spec), headers: { 'content-type': 'application/x-yaml' } });
      assert.equal(put.status, 201, put.text);
      const name = `crash-${randomBytes(4).toString('hex')}`;
      const retry = await crashAndRetry(() =>
        server.request('POST', '/v1/experiments', { key, body: { name, spec_id: spec }, headers: { 'idempotency-key': `exp-${name}` } }),
      );
      assert.equal(retry.status, 201, retry.text);
      // The list reads the store, which the sink fills a moment later.
      let listed: any[] = [];
      for (let i = 0; i < 100 && listed.length === 0; i++) {
        listed = (await server.request('GET', '/v1/experiments?limit=1000', { key })).body.items.filter((e: any) => e.name === name);
        if (listed.length === 0) await new Promise((r) => setTimeout(r, 100));
      }
      assert.deepEqual(
        listed.map((e: any) => e.id),
        [retry.body.id],
        'one experiment, the one the first try made',
      );
    });

    if (process.env.SVC_TEST_BWRAP) {
      caseOf(
        'sandboxes',
        'kill -9 between making a sandbox and the recorded response: the retry makes no second sandbox and says what became of the first',
        async () => {
          const spec = `crash-sb-${randomBytes(4).toString('hex')}`;
          assert.equal((await server.request('POST', '/v1/specs', { key, body: SPEC(spec), headers: { 'content-type': 'application/x-yaml' } })).status, 201);
          const retry = await crashAndRetry(() =>
            server.request('POST', '/v1/sandboxes', { key, body: { spec_id: spec }, headers: { 'idempotency-key': `sb-${spec}` } }),
          );
          // The sandbox died with the process (its runner); the retry says so instead of making another.
          assert.equal(retry.status, 409, retry.text);
          assert.match(retry.body.message, /the sandbox this request made, sb-[0-9a-f]{16}, has ended .*runner restarted/);
          assert.equal((await server.request('GET', '/v1/sandboxes', { key })).body.length, 0, 'no second sandbox');
        },
      );
    }

    caseOf('other-keys', 'the same key with another body, or another key, makes other events', async () => {
      server.env.SVC_TEST_IDEMPOTENCY_HOLD = '0';
      const tool = `other-${randomBytes(4).toString('hex')}`;
      const events = [traceEvent({ tool, span_id: 'a', ts: '2026-11-22T10:00:00Z' })];
      const one = await server.request('POST', '/v1/traces', { key, body: { events }, headers: { 'idempotency-key': 'k-1' } });
      const two = await server.request('POST', '/v1/traces', { key, body: { events }, headers: { 'idempotency-key': 'k-2' } });
      const none = await server.request('POST', '/v1/traces', { key, body: { events } });
      for (const res of [one, two, none]) assert.equal(res.status, 200, res.text);
      const [row] = await adminSql(server, `SELECT count() AS n FROM trace_events FINAL WHERE SpanName = '${tool}'`);
      assert.deepEqual(row, { n: '3' }, 'three requests, three events: ids derive from the key, never collide across keys');
    });
  });
}
