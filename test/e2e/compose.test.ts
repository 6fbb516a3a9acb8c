/**
 * docker-compose.yml really runs (issue 14): the images are built on this machine from local
 * files (infra/compose/build-images.sh: a debootstrap base, Kafka from its Maven artifacts, the
 * service with chDB), the deployment comes up (Kafka, the api+sink+scorer process, a sandbox
 * runner, the aggregator and the alerter, all on Kafka), and through its HTTP API a tenant key is made, a spec
 * stored, a sandbox created, used and deleted, and an experiment of two runs goes to completion
 * with the pass rate its agent earns; then `down -v`.
 *
 * Needs root, Debian's docker.io and docker-compose and a dockerd (test/run.mjs installs them with
 * apt-get when missing, starts a dockerd when none answers and builds the images before the tests:
 * SVC_TEST_DOCKER), plus what the build needs (java and mvn for the Kafka jars, debootstrap on the
 * first run). Where that cannot be had the suite is skipped with the reason; under CI=true it fails
 * instead. Images are cached across runs: the first build takes about 2 minutes (3 on a loaded
 * machine, most of it the service's image when its sources changed), later ones a second; built
 * ahead by the run, the build here finds them ready, and the file takes about 2 minutes.
 */
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { create as createTar } from 'tar';
import { onCancel, own } from '../helpers/owned-processes.ts';
import { freePort } from '../helpers/ports.ts';

// Not from helpers/server.ts or helpers/bundles.ts: importing them would make `npm test` start
// the Kafka and ClickHouse backends for this file, which brings its own.
const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');

const NAME = 'docker-compose.yml: built here, brought up, used, torn down';
const CI = process.env.CI === 'true';

interface Ran {
  code: number | null;
  out: string;
}

/** Runs a command to its end (or `timeoutMs`, then SIGKILL); never throws. */
function run(cmd: string, args: string[], options: { env?: NodeJS.ProcessEnv; timeoutMs?: number; cwd?: string } = {}): Promise<Ran> {
  return new Promise((resolve) => {
    let out = '';
    let child: ChildProcess;
    try {
      child = own(spawn(cmd, args, { cwd: options.cwd ?? REPO, env: options.env ?? process.env, stdio: ['ignore', 'pipe', 'pipe'] }));
    } catch (err) {
      resolve({ code: null, out: String(err) });
      return;
    }
    const keep = (d: Buffer) => (out = (out + d).slice(-200_000));
    child.stdout!.on('data', keep);
    child.stderr!.on('data', keep);
    const timer = setTimeout(() => {
      out += `\n(killed after ${options.timeoutMs} ms)`;
      child.kill('SIGKILL');
    }, options.timeoutMs ?? 120_000);
    child.once('error', (err) => {
      clearTimeout(timer);
      resolve({ code: null, out: `${out}${err.message}` });
    });
    child.once('close', (code) => {
      clearTimeout(timer);
      resolve({ code, out });
    });
  });
}

const lastLine = (text: string) => text.trim().split('\n').at(-1) ?? '';

function onPath(cmd: string): string | null {
  for (const dir of [...(process.env.PATH ?? '').split(path.delimiter), '/usr/sbin', '/sbin']) {
    if (!dir) continue;
    try {
      fs.accessSync(path.join(dir, cmd), fs.constants.X_OK);
      return path.join(dir, cmd);
    } catch {
      /* not here */
    }
  }
  return null;
}

interface Docker {
  docker: string;
  /** The compose command: Debian's `docker-compose`, or `docker compose`. */
  compose: string[];
}

/**
 * Docker and compose ready to use, or the one-line reason why not on this machine. The dockerd
 * is the run's (test/run.mjs starts one when none answers, SVC_TEST_DOCKER, and stops it when
 * the run ends), so that no dockerd outlives a cancelled file; it also builds the images ahead,
 * so that the build below finds them ready.
 */
async function prepareDocker(): Promise<Docker | { skip: string }> {
  const docker = process.env.SVC_TEST_DOCKER;
  if (!docker)
    return {
      skip: "SVC_TEST_DOCKER is unset (npm test sets it when a dockerd answers or starts here: root, Debian's docker.io, docker-compose and debootstrap)",
    };
  const missingTools = ['java', 'mvn'].filter((t) => !onPath(t));
  if (missingTools.length)
    return { skip: `${missingTools.join(' and ')} not on PATH: the Kafka image takes its jars from Maven (apt-get install default-jdk-headless maven)` };
  const v1 = onPath('docker-compose');
  if (v1) return { docker, compose: [v1] };
  if ((await run(docker, ['compose', 'version'], { timeoutMs: 20_000 })).code === 0) return { docker, compose: [docker, 'compose'] };
  return { skip: 'docker-compose is not installed (apt-get install docker-compose)' };
}

const ready = await prepareDocker();

if ('skip' in ready) {
  if (CI) test(NAME, () => assert.fail(`${ready.skip}; under CI=true the compose deployment must run`));
  else test(NAME, { skip: ready.skip }, () => {});
} else {
  const { compose } = ready;
  describe(NAME, { timeout: 40 * 60_000 }, () => {
    const project = `svc-compose-test-${randomBytes(3).toString('hex')}`;
    const adminKey = `compose-admin-${randomBytes(12).toString('hex')}`;
    let port: number;
    let url: string;
    let env: NodeJS.ProcessEnv;
    let up = false;
    let cancelDown = () => {};
    const timings: string[] = [];
    const composeRun = (args: string[], timeoutMs = 300_000) =>
      run(compose[0]!, [...compose.slice(1), '-f', path.join(REPO, 'docker-compose.yml'), '-p', project, ...args], { env, timeoutMs });
    const SERVICES = ['kafka', 'app', 'sandbox-runner', 'aggregator', 'alerter'];
    /** The last lines of every service's log, for failure messages. */
    const logs = async () => {
      const parts = [];
      for (const service of SERVICES) parts.push(lastLines((await composeRun(['logs', '--no-color', '--tail=15', service], 60_000)).out, 15));
      return parts.join('\n');
    };

    async function req(method: string, p: string, options: { key?: string; body?: unknown; headers?: Record<string, string> } = {}) {
      const headers: Record<string, string> = { authorization: `Bearer ${options.key ?? adminKey}`, ...options.headers };
      let body: BodyInit | undefined;
      if (options.body instanceof FormData || typeof options.body === 'string') body = options.body;
      else if (options.body !== undefined) {
        body = JSON.stringify(options.body);
        headers['content-type'] ??= 'application/json';
      }
      const res = await fetch(`${url}${p}`, { method, headers, body, signal: AbortSignal.timeout(60_000) });
      const text = await res.text();
      let parsed: any = text;
      try {
        parsed = text ? JSON.parse(text) : null;
      } catch {
        /* not JSON */
      }
      return { status: res.status, body: parsed, text };
    }

    // A pending fetch through docker-proxy does not hold node's event loop open by itself (the
    // runner would end the file as "still pending"): this timer does, until `after`.
    let keepAlive: NodeJS.Timeout | undefined;

    before(
      async () => {
        keepAlive = setInterval(() => {}, 1000);
        port = await freePort();
        url = `http://127.0.0.1:${port}`;
        env = {
          // SVC_TEST_RUN is not a setting: it marks the processes as this test run's (test/run.mjs).
          ...Object.fromEntries(Object.entries(process.env).filter(([name]) => !name.startsWith('SVC_') || name === 'SVC_TEST_RUN')),
          SVC_API_KEY: adminKey,
          SVC_SERVICE_KEY: `compose-service-${randomBytes(12).toString('hex')}`,
          SVC_SECRETS_KEY: randomBytes(32).toString('hex'),
          SVC_COMPOSE_PORT: String(port),
          SVC_BASE_URL: url,
          DOCKER: ready.docker,
        };

        let started = Date.now();
        const built = await run(path.join(REPO, 'infra/compose/build-images.sh'), [], { env, timeoutMs: 30 * 60_000 });
        assert.equal(built.code, 0, `infra/compose/build-images.sh failed:\n${lastLines(built.out, 60)}`);
        timings.push(`images ${((Date.now() - started) / 1000).toFixed(1)} s (${lastLine(built.out).replace(/^build-images.sh: /, '')})`);

        started = Date.now();
        up = true;
        // Cancelled (the runner's timeout, Ctrl-C) before `after`: the project goes down all the same.
        cancelDown = onCancel(() => composeRun(['down', '-v', '--remove-orphans', '--timeout', '30'], 90_000));
        const upped = await composeRun(['up', '-d']);
        assert.equal(upped.code, 0, `compose up failed:\n${lastLines(upped.out, 40)}\n${await logs()}`);
        const deadline = Date.now() + 240_000;
        for (;;) {
          const health = await fetch(`${url}/health`, { signal: AbortSignal.timeout(5_000) }).then(
            async (r) => ({ status: r.status, text: await r.text() }),
            () => null,
          );
          if (health?.status === 200) break;
          if (Date.now() > deadline) assert.fail(`the api did not answer /health within 240 s (last: ${health?.status} ${health?.text})\n${await logs()}`);
          await new Promise((r) => setTimeout(r, 1000));
        }
        // The processes without the api start once its registry answers: wait for them too.
        for (const service of ['sandbox-runner', 'aggregator', 'alerter']) {
          while (!/"msg":"started"/.test((await composeRun(['logs', '--no-color', service], 60_000)).out)) {
            if (Date.now() > deadline) assert.fail(`${service} did not start within 240 s\n${await logs()}`);
            await new Promise((r) => setTimeout(r, 1000));
          }
        }
        timings.push(`up, every process started ${((Date.now() - started) / 1000).toFixed(1)} s`);
      },
      { timeout: 35 * 60_000 },
    );

    after(
      async () => {
        if (up) {
          const started = Date.now();
          const down = await composeRun(['down', '-v', '--remove-orphans', '--timeout', '30'], 180_000);
          if (down.code !== 0) console.error(`compose down failed:\n${lastLines(down.out, 30)}`);
          console.error(`# compose: down -v ${((Date.now() - started) / 1000).toFixed(1)} s`);
        }
        cancelDown();
        clearInterval(keepAlive);
      },
      { timeout: 5 * 60_000 },
    );

    test('the deployment is up: every service runs on Kafka, the store is chDB in the api+sink process', async (t) => {
      for (const line of timings) t.diagnostic(line);
      const health = await req('GET', '/health');
      assert.equal(health.status, 200, health.text);
      assert.equal(health.body.log.backend, 'kafka');
      assert.equal(health.body.store.backend, 'chdb');
      const ps = await composeRun(['ps', '--services', '--filter', 'status=running'], 60_000);
      assert.deepEqual(ps.out.trim().split('\n').sort(), ['aggregator', 'alerter', 'app', 'kafka', 'sandbox-runner'], ps.out);
      // The image holds production dependencies only (no Vite): the dashboard was built into it.
      const ui = await req('GET', '/ui/');
      assert.equal(ui.status, 200, ui.text.slice(0, 300));
      assert.match(ui.text, /<script type="module"[^>]* src="\/ui\/assets\//);
    });

    let key: string;
    test('a tenant key, a spec, a sandbox: create, run a command, delete', async () => {
      const created = await req('POST', '/v1/admin/keys', { body: { tenant: 'compose' } });
      assert.equal(created.status, 201, created.text);
      key = created.body.key;
      const spec =
        'version: 1\nid: compose-basic\nbase: debian:bookworm\ntask: {prompt: look around}\ninvariants:\n  ok: {check: {type: command_exit, command: "true"}}\n';
      const stored = await req('POST', '/v1/specs', { key, body: spec, headers: { 'content-type': 'application/x-yaml' } });
      assert.equal(stored.status, 201, stored.text);

      // A runner that just started is known to the api once its first heartbeat arrives.
      let sandbox = await req('POST', '/v1/sandboxes', { key, body: { spec_id: 'compose-basic' } });
      for (const until = Date.now() + 60_000; sandbox.status === 503 && sandbox.body?.error === 'unavailable' && Date.now() < until; ) {
        await new Promise((r) => setTimeout(r, 1000));
        sandbox = await req('POST', '/v1/sandboxes', { key, body: { spec_id: 'compose-basic' } });
      }
      assert.equal(sandbox.status, 201, `${sandbox.text}\n${sandbox.status >= 500 ? await logs() : ''}`);
      assert.equal(sandbox.body.state, 'ready');
      const cmd = await req('POST', `/v1/sandboxes/${sandbox.body.id}/commands`, {
        key,
        body: { command: 'pwd; echo made > made.txt; cat made.txt; cat /etc/debian_version' },
      });
      assert.equal(cmd.status, 200, cmd.text);
      assert.equal(cmd.body.exit_code, 0, cmd.text);
      assert.match(cmd.body.stdout, /^\/workspace\nmade\n12\.\d+\n$/);
      const deleted = await req('DELETE', `/v1/sandboxes/${sandbox.body.id}`, { key });
      assert.equal(deleted.status, 200, deleted.text);
      const gone = await req('GET', `/v1/sandboxes/${sandbox.body.id}`, { key });
      assert.ok(gone.status === 404 || ['stopped', 'destroyed'].includes(gone.body?.state), gone.text);
    });

    test('an experiment of two runs goes to completion with the pass rate its agent earns', async () => {
      assert.ok(key, 'the previous test made the key');
      // Replica 2 writes nothing: one run of two passes.
      const agent = 'case "$SVC_RUN_ID" in *-2) exit 0;; esac; echo done > "$SVC_WORKSPACE/out.txt"';
      const form = new FormData();
      form.append('metadata', JSON.stringify({ name: 'compose-agent', entrypoint: ['sh', 'run.sh'] }));
      const bundle = await makeBundle('run.sh', `#!/bin/sh\n${agent}\n`);
      form.append('bundle', new Blob([new Uint8Array(bundle)], { type: 'application/gzip' }), 'bundle.tar.gz');
      const uploaded = await req('POST', '/v1/agents', { key, body: form });
      assert.equal(uploaded.status, 201, uploaded.text);

      const spec = `version: 1
id: compose-experiment
base: debian:bookworm
task: {prompt: write out.txt}
agent: {type: snapshot, snapshot: compose-agent}
parallelism: {replicas: 2}
invariants:
  out: {check: {type: file_exists, path: out.txt}}
`;
      const stored = await req('POST', '/v1/specs', { key, body: spec, headers: { 'content-type': 'application/x-yaml' } });
      assert.equal(stored.status, 201, stored.text);
      const created = await req('POST', '/v1/experiments', { key, body: { name: 'through compose', spec_id: 'compose-experiment', run: true } });
      assert.equal(created.status, 201, created.text);

      const deadline = Date.now() + 180_000;
      let experiment: any;
      for (;;) {
        const res = await req('GET', `/v1/experiments/${created.body.id}`, { key });
        assert.equal(res.status, 200, res.text);
        experiment = res.body;
        if (['completed', 'failed', 'cancelled'].includes(experiment.status)) break;
        if (Date.now() > deadline) assert.fail(`the experiment is still ${experiment.status} after 180 s: ${res.text.slice(0, 800)}\n${await logs()}`);
        await new Promise((r) => setTimeout(r, 500));
      }
      assert.equal(experiment.status, 'completed', JSON.stringify(experiment).slice(0, 1500));
      assert.equal(experiment.total_runs, 2);
      const [scenario] = experiment.scenarios;
      assert.equal(scenario.runs.length, 2);
      assert.deepEqual(scenario.runs.map((r: any) => r.verdict).sort(), ['fail', 'pass'], JSON.stringify(scenario.runs).slice(0, 1500));
      assert.equal(scenario.pass_rate, 0.5);
      const metrics = await req('GET', `/v1/metrics/experiments/${created.body.id}`, { key });
      assert.equal(metrics.status, 200, metrics.text);
      assert.equal(typeof metrics.body.pass_rate, 'number');
    });
  });
}

function lastLines(text: string, n: number): string {
  return text.trim().split('\n').slice(-n).join('\n');
}

/** A gzip'd tar holding one executable file: an agent bundle. */
async function makeBundle(name: string, content: string): Promise<Buffer> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'svc-compose-bundle-'));
  try {
    fs.mkdirSync(path.join(dir, 'root'));
    fs.writeFileSync(path.join(dir, 'root', name), content, { mode: 0o755 });
    await createTar({ gzip: true, file: path.join(dir, 'bundle.tar.gz'), cwd: path.join(dir, 'root'), portable: true }, [name]);
    return fs.readFileSync(path.join(dir, 'bundle.tar.gz'));
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}
