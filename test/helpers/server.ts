/**
 * Black-box harness: runs the real service as a child process (`node services/main.ts`) on a
 * free port with its own data dir, and talks to it over HTTP; or, with SVC_TEST_DEPLOYMENT=split,
 * the distributed deployment's processes (see startServer).
 */
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { assertIntegers } from './integers.ts';
import { own } from './owned-processes.ts';
import { freePort } from './ports.ts';

export { freePort };

export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
export const ADMIN_KEY = 'test-admin-key-0123456789';

export interface TestServer {
  url: string;
  dataDir: string;
  env: Record<string, string>;
  output(): string;
  /** The service's process id (for memory readings): the api's, in the distributed deployment. */
  pid(): number;
  /** The deployment's processes (one, embedded): what each runs, its runner id, pid and output. */
  processes(): Array<{ services: string[]; runnerId: string | null; pid: number; output(): string }>;
  /** Raw request with the admin key unless headers say otherwise. */
  request(
    method: string,
    p: string,
    options?: { body?: unknown; headers?: Record<string, string>; key?: string | null },
  ): Promise<{ status: number; headers: Headers; body: any; text: string }>;
  /** SIGTERM and wait for a clean exit; returns the exit code. */
  stop(): Promise<number | null>;
  /** SIGKILL: the process dies where it stands. */
  kill9(): Promise<void>;
  /** Starts the service again on the same data dir and port. */
  restart(): Promise<void>;
  cleanup(): Promise<void>;
}

/**
 * `SVC_TEST_DEPLOYMENT=split` runs the suites against the distributed deployment instead of the
 * embedded one: on the test Kafka (SVC_TEST_KAFKA_BROKERS), `svc run api sink scorer`, `svc run
 * sandbox-runner`, `svc run aggregator` and `svc run alerter`, each its own process, sharing the data dir (the runner
 * keeps its workspaces there, the api process its chDB; the aggregator opens no store).
 */
export interface ServerOptions {
  dataDir?: string;
  /** The distributed deployment instead of the embedded one (default: SVC_TEST_DEPLOYMENT=split). */
  split?: { brokers: string; runners?: number } | false;
}

export async function startServer(env: Record<string, string> = {}, options: ServerOptions = {}): Promise<TestServer> {
  const dataDir = options.dataDir ?? (await mkdtemp(path.join(os.tmpdir(), 'svc-e2e-')));
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const split = options.split ?? (process.env.SVC_TEST_DEPLOYMENT === 'split' ? { brokers: process.env.SVC_TEST_KAFKA_BROKERS ?? '' } : false);
  if (split && !split.brokers) throw new Error('SVC_TEST_DEPLOYMENT=split needs SVC_TEST_KAFKA_BROKERS (npm test starts Kafka)');
  const SPLIT = split !== false;
  // Several runners share the data dir's parent, each with a workspace dir of its own.
  const runnerCount = split ? (split.runners ?? 1) : 0;
  // The first runner shares the data dir (suites look at its workspaces there); others have their own.
  const runnerAt = (i: number) => ({
    services: ['sandbox-runner'],
    env: { SVC_RUNNER_ID: `runner-${i + 1}`, ...(i === 0 ? {} : { SVC_DATA_DIR: path.join(dataDir, `runner-${i + 1}`) }) },
  });
  const PROCESSES: Array<{ services: string[]; env: Record<string, string> }> = SPLIT
    ? [
        { services: ['api', 'sink', 'scorer'], env: {} },
        ...Array.from({ length: runnerCount }, (_, i) => runnerAt(i)),
        { services: ['aggregator'], env: {} },
        { services: ['alerter'], env: {} },
      ]
    : [{ services: [], env: {} }];
  const fullEnv: Record<string, string> = {
    SVC_PORT: String(port),
    SVC_HOST: '127.0.0.1',
    SVC_DATA_DIR: dataDir,
    SVC_API_KEY: ADMIN_KEY,
    SVC_LOG_LEVEL: 'warn',
    SVC_LOG_FSYNC: 'never',
    // Test events carry fixed dates that a 30-day trace retention would drop.
    SVC_TRACE_RETENTION: 'forever',
    ...(SPLIT
      ? {
          SVC_LOG_BACKEND: 'kafka',
          SVC_KAFKA_BROKERS: split.brokers,
          SVC_LOG_NAMESPACE: `split-${path.basename(dataDir)}.`,
          SVC_SERVICE_KEY: 'split-service-key-0123456789',
          SVC_SECRETS_KEY: 'ef'.repeat(32),
          SVC_SCHEMA_REGISTRY_URL: `${url}/schema-registry`,
          SVC_BLOB_DIR: path.join(dataDir, 'blobs'),
        }
      : {}),
    ...env,
  };
  const children: ChildProcess[] = [];
  /** Each process of the deployment: what it runs and everything it printed. */
  const launched: Array<{ services: string[]; env: Record<string, string>; child: ChildProcess; output: () => string }> = [];
  let out = '';

  /** Starts one process (`run <services>`, or everything) and resolves once it is up. */
  const launchOne = async ({ services, env: extra }: { services: string[]; env: Record<string, string> }) => {
    const args = services.length > 0 ? ['run', ...services] : [];
    // The api's process hands out schema ids: it does not look for a registry elsewhere.
    const registry = services.includes('api') ? { SVC_SCHEMA_REGISTRY_URL: '' } : {};
    const child = own(
      spawn(process.execPath, ['--import', 'tsx', path.join(REPO, 'services', 'main.ts'), ...args], {
        cwd: REPO,
        env: Object.fromEntries(
          Object.entries({
            ...process.env,
            ...fullEnv,
            ...registry,
            ...extra,
            ...(services.includes('api') || !SPLIT ? {} : { SVC_LOG_LEVEL: 'info' }),
          }).filter(([, v]) => v !== ''),
        ),
        stdio: ['ignore', 'pipe', 'pipe'],
      }),
    );
    children.push(child);
    let mine = '';
    launched.push({ services, env: extra, child, output: () => mine });
    const keep = (d: Buffer) => {
      mine += d;
      // Only warnings and worse go to output(): what the embedded process would have logged.
      out +=
        services.includes('api') || !SPLIT
          ? d
          : String(d)
              .split('\n')
              .filter((l) => l && !/"level":(10|20|30),/.test(l))
              .map((l) => `${l}\n`)
              .join('');
    };
    child.stdout!.on('data', keep);
    child.stderr!.on('data', keep);
    const deadline = Date.now() + 60_000;
    while (Date.now() < deadline) {
      if (child.exitCode !== null) throw new Error(`service exited with ${child.exitCode}:\n${mine}`);
      if (args.length > 0 && !services.includes('api')) {
        if (mine.includes('"msg":"started"')) return;
      } else {
        try {
          const res = await fetch(`${url}/health`);
          if (res.status === 200) return;
        } catch {
          // not listening yet
        }
      }
      await new Promise((r) => setTimeout(r, 100));
    }
    throw new Error(`${args.join(' ') || 'the service'} did not start in 60 s:\n${mine}`);
  };
  const exited = (child: ChildProcess) => child.exitCode !== null || child.signalCode !== null;
  const waitExit = (child: ChildProcess) =>
    new Promise<number | null>((resolve) => (exited(child) ? resolve(child.exitCode) : child.once('exit', (code) => resolve(code))));
  const launch = async () => {
    children.length = 0;
    launched.length = 0;
    try {
      for (const p of PROCESSES) await launchOne(p);
    } catch (err) {
      // What did start ends here: left running, its pipes would hold the test file open until
      // the runner's timeout.
      for (const child of children) if (!exited(child)) child.kill('SIGTERM');
      const timer = setTimeout(() => {
        for (const child of children) if (!exited(child)) child.kill('SIGKILL');
      }, 10_000);
      await Promise.all(children.map(waitExit));
      clearTimeout(timer);
      throw err;
    }
    // A runner's first heartbeat reaches the api's roster.
    if (SPLIT) await new Promise((r) => setTimeout(r, 500));
  };
  await launch();

  /** Stops the processes, the api's last (the others' last writes go through it). */
  const stopAll = async (signal: NodeJS.Signals) => {
    let code: number | null = null;
    for (const child of [...children].reverse()) {
      if (!exited(child)) child.kill(signal);
      code = await waitExit(child);
    }
    return code;
  };

  const server: TestServer = {
    url,
    dataDir,
    env: fullEnv,
    output: () => out,
    pid: () => children[0]!.pid!,
    processes: () => launched.map((p) => ({ services: p.services, runnerId: p.env.SVC_RUNNER_ID ?? null, pid: p.child.pid!, output: p.output })),
    async request(method, p, opts = {}) {
      const headers: Record<string, string> = { ...(opts.headers ?? {}) };
      const key = opts.key === undefined ? ADMIN_KEY : opts.key;
      if (key !== null) headers.authorization = `Bearer ${key}`;
      let body: string | undefined;
      if (opts.body !== undefined) {
        body = typeof opts.body === 'string' ? opts.body : JSON.stringify(opts.body);
        headers['content-type'] ??= 'application/json';
      }
      const res = await fetch(`${url}${p}`, { method, headers, body });
      const text = await res.text();
      let parsed: unknown = text;
      try {
        parsed = text ? JSON.parse(text) : null;
      } catch {
        // not JSON (NDJSON, metrics)
        if ((res.headers.get('content-type') ?? '').includes('ndjson'))
          assertIntegers(
            text
              .split('\n')
              .filter(Boolean)
              .map((line) => JSON.parse(line)),
            `${method} ${p}`,
          );
      }
      assertIntegers(parsed, `${method} ${p}`);
      return { status: res.status, headers: res.headers, body: parsed, text };
    },
    stop: () => stopAll('SIGTERM'),
    async kill9() {
      await stopAll('SIGKILL');
    },
    async restart() {
      await launch();
    },
    async cleanup() {
      await server.stop();
      // After a kill -9, the launcher unmounts the workspaces a moment later.
      if (!options.dataDir) await rm(dataDir, { recursive: true, force: true, maxRetries: 10, retryDelay: 300 });
    },
  };
  return server;
}

/** Creates a tenant key through the admin API and returns the secret. */
export async function createTenantKey(server: TestServer, tenant: string): Promise<{ id: string; key: string }> {
  const res = await server.request('POST', '/v1/admin/keys', { body: { tenant } });
  if (res.status !== 201) throw new Error(`key creation failed: ${res.status} ${res.text}`);
  return { id: res.body.id, key: res.body.key };
}

export function traceEvent(overrides: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    ts: new Date().toISOString(),
    event_type: 'tool_call',
    tool: 'bash',
    phase: 'complete',
    span_id: `s-${Math.random().toString(16).slice(2)}`,
    duration_ms: 12,
    status: 'ok',
    ...overrides,
  };
}

/** The rows of `query` on the analysts' SQL endpoint, as the admin; `params` fill its {name:Type} placeholders. */
export async function adminSql<Row = Record<string, unknown>>(server: { url: string }, query: string, params: Record<string, string> = {}): Promise<Row[]> {
  const url = new URL('/v1/admin/sql/', server.url);
  url.searchParams.set('default_format', 'JSONEachRow');
  for (const [name, value] of Object.entries(params)) url.searchParams.set(`param_${name}`, value);
  const res = await fetch(url, { method: 'POST', headers: { authorization: `Bearer ${ADMIN_KEY}` }, body: query });
  const text = await res.text();
  assert.equal(res.status, 200, text);
  return text
    .split('\n')
    .filter(Boolean)
    .map((line) => JSON.parse(line) as Row);
}
