/**
 * Black-box harness: runs the real service as a child process (`node services/main.ts`) on a
 * free port with its own data dir, and talks to it over HTTP.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { assertIntegers } from './integers.ts';

export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
export const ADMIN_KEY = 'test-admin-key-0123456789';

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address() as net.AddressInfo;
      srv.close(() => resolve(port));
    });
  });
}

export interface TestServer {
  url: string;
  dataDir: string;
  env: Record<string, string>;
  output(): string;
  /** The service's process id (for memory readings). */
  pid(): number;
  /** Raw request with the admin key unless headers say otherwise. */
  request(method: string, p: string, options?: { body?: unknown; headers?: Record<string, string>; key?: string | null }): Promise<{ status: number; headers: Headers; body: any; text: string }>;
  /** SIGTERM and wait for a clean exit; returns the exit code. */
  stop(): Promise<number | null>;
  /** SIGKILL: the process dies where it stands. */
  kill9(): Promise<void>;
  /** Starts the service again on the same data dir and port. */
  restart(): Promise<void>;
  cleanup(): Promise<void>;
}

export async function startServer(env: Record<string, string> = {}, options: { dataDir?: string } = {}): Promise<TestServer> {
  const dataDir = options.dataDir ?? (await mkdtemp(path.join(os.tmpdir(), 'svc-e2e-')));
  const port = await freePort();
  const fullEnv: Record<string, string> = {
    SVC_PORT: String(port),
    SVC_HOST: '127.0.0.1',
    SVC_DATA_DIR: dataDir,
    SVC_API_KEY: ADMIN_KEY,
    SVC_LOG_LEVEL: 'warn',
    SVC_LOG_FSYNC: 'never',
    // Test events carry fixed dates that a 30-day trace retention would drop.
    SVC_TRACE_RETENTION: 'forever',
    ...env,
  };
  let child: ChildProcess;
  let out = '';
  const url = `http://127.0.0.1:${port}`;

  const launch = async () => {
    child = spawn(process.execPath, ['--import', 'tsx', path.join(REPO, 'services', 'main.ts')], {
      cwd: REPO,
      env: { ...process.env, ...fullEnv },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    child.stdout!.on('data', (d) => (out += d));
    child.stderr!.on('data', (d) => (out += d));
    const deadline = Date.now() + 60_000;
    while (Date.now() < deadline) {
      if (child.exitCode !== null) throw new Error(`service exited with ${child.exitCode}:\n${out}`);
      try {
        const res = await fetch(`${url}/health`);
        if (res.status === 200) return;
      } catch {
        // not listening yet
      }
      await new Promise((r) => setTimeout(r, 100));
    }
    throw new Error(`service did not become healthy in 60 s:\n${out}`);
  };
  await launch();

  const waitExit = () => new Promise<number | null>((resolve) => (child.exitCode !== null || child.signalCode !== null ? resolve(child.exitCode) : child.once('exit', (code) => resolve(code))));

  const server: TestServer = {
    url,
    dataDir,
    env: fullEnv,
    output: () => out,
    pid: () => child.pid!,
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
        if ((res.headers.get('content-type') ?? '').includes('ndjson')) assertIntegers(text.split('\n').filter(Boolean).map((line) => JSON.parse(line)), `${method} ${p}`);
      }
      assertIntegers(parsed, `${method} ${p}`);
      return { status: res.status, headers: res.headers, body: parsed, text };
    },
    async stop() {
      if (child.exitCode !== null || child.signalCode !== null) return child.exitCode;
      child.kill('SIGTERM');
      return waitExit();
    },
    async kill9() {
      child.kill('SIGKILL');
      await waitExit();
    },
    async restart() {
      await launch();
    },
    async cleanup() {
      await server.stop();
      if (!options.dataDir) await rm(dataDir, { recursive: true, force: true });
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
