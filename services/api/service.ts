import http from 'node:http';
import type { AddressInfo } from 'node:net';
import type { Kernel, Service } from '../kernel/actor.ts';
import { Auth } from '../kernel/auth.ts';
import type { BuiltInRegistry } from '../kernel/schema/registry.ts';
import { createApp } from './app.ts';
import { upgradeThroughApp } from './routes/sandbox-shell.ts';
import { Idempotency } from './middleware/idempotency.ts';
import { SandboxCatalog } from './catalogs/sandbox-catalog.ts';
import { RunnerRoster } from './catalogs/runner-roster.ts';
import { ExperimentCatalog } from './catalogs/experiment-catalog.ts';
import { ScoreRuleCatalog } from './catalogs/score-rule-catalog.ts';
import { AlertCatalog } from './catalogs/alert-catalog.ts';
import { AlertEvaluator } from './alerts/evaluation-requester.ts';
import { DatasetCatalog } from './catalogs/dataset-catalog.ts';
import { SpecCatalog } from './catalogs/spec-catalog.ts';
import { AgentCatalog } from './catalogs/agent-catalog.ts';
import { BundleCatalog } from './catalogs/bundle-catalog.ts';
import { TenantSecrets } from '../kernel/tenant-secrets.ts';
import { SandboxRequester } from './sandboxes/sandbox-requester.ts';
import { TerminalRelay } from './sandboxes/terminal-relay.ts';
import { TraceIngest } from './traces/ingest.ts';

/** The HTTP API. Holds the auth and idempotency views; everything else it reads from the log or the store. */
export class ApiService implements Service {
  readonly name = 'api';
  private server: http.Server | null = null;
  private parts: Array<{ start(): Promise<void>; stop(): Promise<void> }> = [];
  private terminals: TerminalRelay | null = null;

  constructor(private readonly options: { registry: BuiltInRegistry | null }) {}

  async start(kernel: Kernel): Promise<void> {
    const auth = new Auth(kernel);
    const idempotency = new Idempotency(kernel);
    const agents = new AgentCatalog(kernel);
    const bundles = new BundleCatalog(kernel);
    const specs = new SpecCatalog(kernel, agents, bundles);
    const secrets = new TenantSecrets(kernel);
    const sandboxes = new SandboxCatalog(kernel);
    const runners = new RunnerRoster(kernel, (beat) => sandboxes.endOwnedBy(beat.runner_id, beat.ts, RunnerRoster.reason(beat, kernel.config.runnerDeadAfter)));
    const experiments = new ExperimentCatalog(kernel, specs);
    const scoreRules = new ScoreRuleCatalog(kernel);
    const datasets = new DatasetCatalog(kernel);
    const requester = new SandboxRequester(kernel);
    const terminals = (this.terminals = new TerminalRelay(kernel, sandboxes));
    const ingest = new TraceIngest(kernel);
    this.parts = [auth, idempotency, agents, bundles, specs, secrets, sandboxes, experiments, scoreRules, datasets, requester, ingest];
    const alerts = new AlertCatalog(kernel);
    const alertEvaluator = new AlertEvaluator(kernel);
    this.parts.push(alerts, alertEvaluator);
    await Promise.all(this.parts.map((p) => p.start()));
    // After the sandboxes' view, whose ends end its sessions.
    await terminals.start();
    // After the sandboxes' view: the roster's first sweep ends what dead runners left.
    await runners.start();
    this.parts.push(runners);
    auth.acceptSandboxTokens((hash) => sandboxes.byTokenHash(hash));
    const app = createApp({
      kernel,
      alerts,
      alertEvaluator,
      auth,
      idempotency,
      specs,
      agents,
      bundles,
      secrets,
      sandboxes,
      runners,
      experiments,
      scoreRules,
      datasets,
      requester,
      terminals,
      ingest,
      registry: this.options.registry,
    });
    this.server = http.createServer(app.callback());
    // WebSocket upgrades (the sandbox shell) run through the same app and middleware.
    this.server.on('upgrade', upgradeThroughApp(app));
    this.server.keepAliveTimeout = 65_000;
    await new Promise<void>((resolve, reject) => {
      this.server!.once('error', reject);
      this.server!.listen(kernel.config.port, kernel.config.host, () => resolve());
    });
    const { port } = this.server.address() as AddressInfo;
    kernel.logger.info({ port, host: kernel.config.host }, 'api listening');
  }

  /** The port actually bound (SVC_PORT=0 picks a free one). */
  port(): number {
    return (this.server!.address() as AddressInfo).port;
  }

  async stop(): Promise<void> {
    // First: an open shell's socket would keep the server from closing.
    await this.terminals?.stop();
    if (this.server) {
      const server = this.server;
      this.server = null;
      // Stop accepting, let in-flight requests finish, then drop idle keep-alive sockets.
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      server.closeIdleConnections();
      await closed;
    }
    await Promise.all(this.parts.map((p) => p.stop()));
  }
}
