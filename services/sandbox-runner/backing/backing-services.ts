/**
 * A sandbox's backing services (the spec's `services`), on its private network: each is reached
 * from inside by its name (and by `SVC_SERVICE_<NAME>_HOST/_PORT`), at an address of its own
 * that the egress gateway routes to the service and never out (network/gateway.ts).
 *
 * - `http_mock` (backing/http-mock.ts): answered inside the runner, from the gateway's parsed
 *   requests; HTTP, and HTTPS for a `dns_overrides` name sent to it. Port 80.
 * - `postgres` (backing/postgres.ts): a PostgreSQL server of its own per sandbox, jailed, in a
 *   cgroup of its own with limits, reached over a unix socket the gateway connects the sandbox's
 *   connections to (observed for rolled-back writes). Port 5432.
 *
 * Services start while the sandbox's runtime starts (they need nothing of it), are waited for
 * at the `services_started` step (`wait_for`), and stop with the sandbox, leaving nothing.
 */
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import type { SpecService } from '../../domain/spec.ts';
import { serviceAddress, type ServiceEndpoint } from '../network/gateway/sandbox-egress.ts';
import { SandboxCgroup } from '../runtimes/local/cgroups.ts';
import type { RuntimeDisk } from '../runtimes/runtime.ts';
import { HttpMock, type Forward } from './http-mock.ts';
import { PostgresService } from './postgres.ts';
import type { DbWrite } from './postgres-write-audit.ts';

export interface ServiceView {
  host: string;
  port: number;
  ready: boolean;
}

/** What a service of each type is given by the runner. */
export interface BackingOptions {
  sandboxId: string;
  /** the runner's private directory for this sandbox's services (removed at stop) */
  root: string;
  /** where initialised database templates are kept, for every sandbox of the runner */
  cacheDir: string;
  /** SVC_POSTGRES_BIN_DIR */
  binDir: string | null;
  /** audit.db_writes */
  auditWrites: boolean;
  onWrite(service: string, write: DbWrite): void;
  /** Record mode of a mock: the real host's answer, through the sandbox's egress policy. */
  forward(service: string): Forward;
  /** The sandbox's secret values replaced in text (what a mock keeps: its journal, its recording). */
  redact(text: string): string;
  /** A database's disk (Runtime.disk), or why there is none. */
  disk(service: string): Promise<RuntimeDisk | string>;
}

type Running =
  | { type: 'http_mock'; spec: Extract<SpecService, { type: 'http_mock' }>; address: string; mock: HttpMock; ready: boolean }
  | {
      type: 'postgres';
      spec: Extract<SpecService, { type: 'postgres' }>;
      address: string;
      password: string;
      server: Promise<PostgresService>;
      cgroup: SandboxCgroup | null;
      disk: RuntimeDisk | null;
      ready: boolean;
    };

/** A database's limits: its own cgroup, apart from the agent's (so the agent cannot starve it, nor it the agent). */
const DATABASE_RESOURCES = { memoryBytes: 512 * 1024 * 1024, cpus: 1, pids: 128, diskBytes: 0 };
const READY_POLL_MS = 50;

export const SERVICE_PORTS = { http_mock: 80, postgres: 5432 } as const;

/** The runner's directory for one sandbox's services. */
export const backingRoot = (dataDir: string, sandboxId: string): string => path.join(dataDir, 'services', sandboxId);

export class BackingServices {
  private readonly services = new Map<string, Running>();
  private stopped = false;
  /** What the services could not have as they should (for the sandbox's warnings). */
  readonly warnings: string[] = [];

  constructor(
    private readonly specs: SpecService[],
    private readonly options: BackingOptions,
  ) {}

  /** Waits for the databases' background work (copies made ahead of the next start) to end: before the runner stops. */
  static settle(): Promise<void> {
    return PostgresService.settle();
  }

  get count(): number {
    return this.specs.length;
  }

  /** Starts every service (not waiting for them: `waitReady` does). Databases start in parallel. */
  start(): void {
    for (const [index, spec] of this.specs.entries()) {
      const address = serviceAddress(index);
      if (spec.type === 'http_mock') {
        const mock = new HttpMock({
          name: spec.name,
          routes: spec.routes,
          record: spec.record,
          forward: this.options.forward(spec.name),
          redact: (text) => this.options.redact(text),
        });
        this.services.set(spec.name, { type: 'http_mock', spec, address, mock, ready: false });
      } else {
        const password = randomBytes(18).toString('base64url');
        const running: Extract<Running, { type: 'postgres' }> = {
          type: 'postgres',
          spec,
          address,
          password,
          server: Promise.resolve(null as never),
          cgroup: null,
          disk: null,
          ready: false,
        };
        running.server = this.startPostgres(running);
        running.server.catch(() => undefined); // waitReady reports it
        this.services.set(spec.name, running);
      }
    }
  }

  private async startPostgres(running: Extract<Running, { type: 'postgres' }>): Promise<PostgresService> {
    const { spec } = running;
    running.cgroup = SandboxCgroup.create('svc', `${this.options.sandboxId}-${spec.name}`, DATABASE_RESOURCES);
    // Its data on a disk of its own: the agent's rows cannot fill the host's disk.
    const disk = await this.options.disk(spec.name);
    if (typeof disk === 'string') this.warnings.push(`service ${spec.name}: its data is not bounded by a disk of its own (${disk})`);
    else running.disk = disk;
    const server = await PostgresService.start({
      dataDir: running.disk ? path.join(running.disk.at, 'data') : undefined,
      name: spec.name,
      database: spec.database,
      user: spec.user,
      password: running.password,
      root: path.join(this.options.root, spec.name),
      cacheDir: this.options.cacheDir,
      version: spec.version,
      binDir: this.options.binDir ?? undefined,
      auditWrites: this.options.auditWrites,
      onWrite: (write) => this.options.onWrite(spec.name, write),
      cgroupJoin: running.cgroup.joinFiles(),
    });
    if (this.stopped) {
      await server.stop();
      throw new Error('the sandbox stopped while its services started');
    }
    return server;
  }

  /** Waits for each service as its `wait_for` says; the first that is not ready in time fails the boot, naming it. */
  async waitReady(): Promise<void> {
    await Promise.all(
      [...this.services.values()].map(async (running) => {
        const { timeoutMs } = running.spec.wait_for;
        const deadline = Date.now() + timeoutMs;
        let problem = 'not ready';
        for (;;) {
          const state = await this.check(running, deadline).catch((err: Error) => ({ ready: false, problem: err.message, final: true }));
          if (state.ready) break;
          problem = state.problem;
          if (state.final) throw new Error(`service ${running.spec.name} did not start: ${problem}`);
          if (Date.now() >= deadline) throw new Error(`service wait_for timed out: ${running.spec.name} was not ready within ${timeoutMs} ms (${problem})`);
          await new Promise((r) => setTimeout(r, READY_POLL_MS));
        }
        running.ready = true;
      }),
    );
  }

  /** One readiness check: `final` when waiting longer cannot help (the service failed to start). */
  private async check(running: Running, deadline: number): Promise<{ ready: boolean; problem: string; final?: boolean }> {
    if (running.type === 'http_mock') {
      const { wait_for } = running.spec;
      if (!wait_for.http) return { ready: true, problem: '' };
      const status = running.mock.probe('GET', wait_for.http);
      return { ready: status >= 200 && status < 300, problem: `GET ${wait_for.http} answers ${status}` };
    }
    const server = await Promise.race([running.server, new Promise<null>((r) => setTimeout(() => r(null), Math.max(0, deadline - Date.now())))]);
    if (server === null) return { ready: false, problem: 'the server did not start' };
    const { wait_for } = running.spec;
    const ready = await server.isReady(wait_for.query);
    return { ready, problem: wait_for.query ? `the query ${JSON.stringify(wait_for.query)} returned no row or failed` : 'it does not accept connections' };
  }

  /** The sandbox's variables for its services: host and port of each; credentials of databases (and PG* when there is one). */
  env(): Record<string, string> {
    const env: Record<string, string> = {};
    const databases = this.specs.filter((s) => s.type === 'postgres');
    for (const spec of this.specs) {
      const prefix = `SVC_SERVICE_${spec.name.toUpperCase().replace(/-/g, '_')}`;
      env[`${prefix}_HOST`] = spec.name;
      env[`${prefix}_PORT`] = String(SERVICE_PORTS[spec.type]);
      if (spec.type !== 'postgres') continue;
      const { password } = this.services.get(spec.name) as Extract<Running, { type: 'postgres' }>;
      Object.assign(env, { [`${prefix}_USER`]: spec.user, [`${prefix}_PASSWORD`]: password, [`${prefix}_DATABASE`]: spec.database });
      env[`${prefix}_URL`] = `postgresql://${spec.user}:${password}@${spec.name}:5432/${spec.database}`;
      if (databases.length === 1) {
        Object.assign(env, {
          PGHOST: spec.name,
          PGPORT: '5432',
          PGUSER: spec.user,
          PGPASSWORD: password,
          PGDATABASE: spec.database,
          PGSSLMODE: 'disable',
          DATABASE_URL: env[`${prefix}_URL`],
        });
      }
    }
    return env;
  }

  /** Where the gateway sends the sandbox's traffic for each service. */
  async endpoints(): Promise<ServiceEndpoint[]> {
    return Promise.all(
      [...this.services.values()].map(async (running): Promise<ServiceEndpoint> => {
        if (running.type === 'http_mock')
          return { name: running.spec.name, address: running.address, http: (req, res, host) => running.mock.handle(req, res, host) };
        const server = await running.server;
        return {
          name: running.spec.name,
          address: running.address,
          connect: () => net.connect({ path: server.socketPath }),
          observe: this.options.auditWrites ? () => server.observeConnection() : undefined,
        };
      }),
    );
  }

  view(): Record<string, ServiceView> {
    return Object.fromEntries([...this.services.values()].map((r) => [r.spec.name, { host: r.spec.name, port: SERVICE_PORTS[r.type], ready: r.ready }]));
  }

  /** A database service by name; throws naming what is wrong. */
  async database(name: string): Promise<PostgresService> {
    const running = this.services.get(name);
    if (running?.type !== 'postgres') throw new Error(`no postgres service "${name}"`);
    return running.server;
  }

  /** A mock service by name, or null. */
  mock(name: string): HttpMock | null {
    const running = this.services.get(name);
    return running?.type === 'http_mock' ? running.mock : null;
  }

  /** From now on the databases' writes are recorded, when audited (the boot's own, fixtures and setup, are not the agent's); their relations are noted for the `sql` invariant. */
  async startAudit(): Promise<void> {
    await Promise.all([...this.services.values()].map(async (r) => (r.type === 'postgres' ? (await r.server).startAudit() : undefined)));
  }

  /** Every write the databases committed until now has been recorded. */
  async flushWrites(): Promise<void> {
    await Promise.all([...this.services.values()].map(async (r) => (r.type === 'postgres' && r.ready ? (await r.server).flushWrites() : undefined)));
  }

  /** Stops every service; what failed is thrown together, once all were tried. */
  async stop(): Promise<void> {
    this.stopped = true;
    const failures: string[] = [];
    await Promise.all(
      [...this.services.values()].map(async (r) => {
        if (r.type !== 'postgres') return;
        try {
          const server = await r.server.catch(() => null);
          await server?.stop();
          await r.disk?.release();
          if (r.cgroup && !(await r.cgroup.remove())) failures.push(`${r.spec.name}: its cgroup could not be removed`);
        } catch (err) {
          failures.push(`${r.spec.name}: ${(err as Error).message}`);
        }
      }),
    );
    // Each server removed its own directory; theirs goes too (rm never follows a link).
    await fs.promises.rm(this.options.root, { recursive: true, force: true }).catch((err: Error) => failures.push(`their directory: ${err.message}`));
    if (failures.length > 0) throw new Error(`services did not stop cleanly: ${failures.join('; ')}`);
  }
}
