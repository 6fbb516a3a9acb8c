/**
 * Creating, running and cancelling experiments (docs/experiments.md). Creation writes `created`
 * here; run and cancel are commands to the aggregator, which writes every later state, and each
 * call answers once this process's view shows the aggregator's answer.
 */
import type { ResolvedAgent } from '../../domain/agent-auth.ts';
import type { ExperimentChanged, ExperimentCommand, ExperimentOptions, ExperimentStatus } from '../../domain/events/experiment-events.ts';
import type { SpecDocument } from '../../domain/spec.ts';
import { publish, type Kernel } from '../../kernel/actor.ts';
import type { Auth } from '../../kernel/auth.ts';
import { AppError, badRequest } from '../../kernel/errors.ts';
import { newEventId, newExperimentId } from '../../kernel/ids.ts';
import { KeyedQueue } from '../../kernel/keyed-queue.ts';
import { Sealer, secretsKey } from '../../kernel/tenant-secrets.ts';
import { TOPICS } from '../../kernel/topics.ts';
import type { AgentCatalog } from '../catalogs/agent-catalog.ts';
import { TERMINAL_STATUSES, type ExperimentCatalog } from '../catalogs/experiment-catalog.ts';
import type { SpecCatalog } from '../catalogs/spec-catalog.ts';
import type { DatasetCatalog } from '../catalogs/dataset-catalog.ts';
import { experimentPlan } from '../../domain/experiment-plan.ts';
import { pinDataset, publishScenarios } from './dataset-scenarios.ts';
import { specOrElse } from '../spec-lookup.ts';
import { matrixProblems, type CreateRequest } from './create-request.ts';
import { countsOf, experimentSummary, type ExperimentSummary } from './summary.ts';

const AFTER_CREATED: ExperimentStatus[] = ['queued', 'running', 'completed', 'failed', 'cancelled'];

type StoredSpec = ReturnType<SpecCatalog['get']>;

export interface LifecycleDeps {
  kernel: Kernel;
  auth: Auth;
  specs: SpecCatalog;
  agents: AgentCatalog;
  experiments: ExperimentCatalog;
  datasets: DatasetCatalog;
}

export class ExperimentLifecycle {
  private sealer: Sealer | null = null;
  /** Runs and cancels of one experiment take turns, so a second run sees the first one's answer. */
  private readonly queue = new KeyedQueue();

  constructor(private readonly deps: LifecycleDeps) {}

  /**
   * Creates the experiment (201), and runs it at once when the request says `run`. With an
   * idempotent request's `seed`, its id derives from it: a retry after a crash that came after the
   * experiment was stored finds it, and answers with it (running it, if asked and not yet done).
   */
  async create(tenant: string, request: CreateRequest, seed: string | null = null): Promise<ExperimentSummary> {
    const version = request.options.spec_version;
    // An unknown spec is a 404 here (docs/decisions.md, "Unknown spec id"), unlike POST /v1/sandboxes.
    const spec = specOrElse(this.deps.specs, tenant, request.spec_id, version, (notFound) =>
      version === undefined ? notFound : badRequest('spec_version', `spec "${request.spec_id}" has no version ${version}`),
    );
    this.checkAgainstSpec(tenant, request, spec.doc);
    if (request.run) {
      this.resolveAgent(tenant, spec.doc, request.options.agent_snapshot_id);
      this.concurrency(tenant, spec.doc);
    }
    const stored = seed === null ? undefined : this.deps.experiments.get(newExperimentId(seed));
    if (stored) return experimentSummary(request.run && stored.status === 'created' ? await this.queueRun(stored) : stored);
    // An experiment over a dataset: its scenarios are on the log before the experiment is.
    const { matrix } = experimentPlan(request.options, spec.doc);
    const dataset = await pinDataset(this.deps.kernel, this.deps.datasets, tenant, request.dataset, spec.doc, matrix);
    const options = dataset ? { ...request.options, dataset } : request.options;
    const experiment = this.createdEvent(tenant, { ...request, options }, spec, seed);
    if (dataset) await publishScenarios(this.deps.kernel, this.deps.datasets, tenant, experiment.experiment_id, dataset, matrix, seed);
    await this.deps.experiments.put(experiment);
    return experimentSummary(request.run ? await this.queueRun(experiment) : experiment);
  }

  /** Runs a created experiment; answers once the aggregator has queued it. */
  async run(experiment: ExperimentChanged): Promise<ExperimentSummary> {
    return experimentSummary(await this.queueRun(experiment));
  }

  /** Cancels an experiment not yet finished; answers once the aggregator has stopped it. */
  async cancel(experiment: ExperimentChanged): Promise<ExperimentSummary> {
    const { config, store } = this.deps.kernel;
    const cancelled = await this.queue.run(experiment.experiment_id, async () => {
      const current = this.deps.experiments.get(experiment.experiment_id)!;
      if (TERMINAL_STATUSES.includes(current.status)) throw new AppError('conflict', `experiment ${current.experiment_id} is already ${current.status}`);
      const command = this.command(current, 'cancel', { yaml: null, agent: null, total_runs: 0, concurrency: 0 });
      return this.send(
        command,
        TERMINAL_STATUSES,
        `experiment ${current.experiment_id}: the cancel was requested but not applied within ${config.replyTimeout} ms`,
      );
    });
    return experimentSummary(cancelled, (await countsOf(store, cancelled.tenant, [cancelled.experiment_id])).get(cancelled.experiment_id));
  }

  /** The request's matrix and agent snapshot against the spec: every problem in one 400. */
  private checkAgainstSpec(tenant: string, request: CreateRequest, doc: SpecDocument): void {
    const problems = matrixProblems(doc, request.options.matrix);
    const snapshotId = request.options.agent_snapshot_id;
    if (snapshotId !== undefined) {
      if (doc.agent?.type !== 'snapshot')
        problems.push(`agent_snapshot_id: spec "${doc.id}" does not run a snapshot agent (agent.type is ${doc.agent?.type ?? 'unset'})`);
      else if (!this.deps.agents.exists(tenant, snapshotId))
        problems.push(`agent_snapshot_id: no agent snapshot ${snapshotId} of yours exists (GET /v1/agents/:name/versions lists them)`);
    }
    if (problems.length > 0) throw new AppError('bad_request', problems.join('; '));
  }

  private createdEvent(tenant: string, request: CreateRequest, spec: StoredSpec, seed: string | null): ExperimentChanged {
    const id = newExperimentId(seed);
    const now = Date.now();
    this.sealer ??= new Sealer(secretsKey(this.deps.kernel.config));
    return {
      tenant,
      event_id: newEventId(),
      ts: now,
      experiment_id: id,
      name: request.name,
      spec_id: spec.stored.spec_id,
      spec_version: spec.stored.version,
      status: 'created',
      created_at: now,
      queued_at: null,
      started_at: null,
      completed_at: null,
      total_runs: 0,
      scored_runs: 0,
      concurrency: 0,
      options: JSON.stringify(request.options),
      secrets: Object.keys(request.secrets).length > 0 ? this.sealer.seal(JSON.stringify(request.secrets), id) : Buffer.alloc(0),
      yaml: null,
      agent: null,
      error: null,
      metrics: null,
    };
  }

  private queueRun(experiment: ExperimentChanged): Promise<ExperimentChanged> {
    return this.queue.run(experiment.experiment_id, async () => {
      const current = this.deps.experiments.get(experiment.experiment_id)!;
      if (current.status !== 'created') {
        throw new AppError('conflict', `experiment ${current.experiment_id} is ${current.status}; only a created experiment can run`);
      }
      const id = current.experiment_id;
      const timeout = `experiment ${id}: the run was requested but not queued within ${this.deps.kernel.config.replyTimeout} ms; GET /v1/experiments/${id} shows when it is`;
      return this.send(this.runCommand(current), AFTER_CREATED, timeout);
    });
  }

  /** The run command: the pinned spec's yaml, the resolved agent, the number of runs and how many at once. */
  private runCommand(current: ExperimentChanged): ExperimentCommand {
    const options = JSON.parse(current.options) as ExperimentOptions;
    const spec = specOrElse(
      this.deps.specs,
      current.tenant,
      current.spec_id,
      current.spec_version,
      () => new AppError('conflict', `spec "${current.spec_id}" version ${current.spec_version} was deleted; the experiment cannot run`),
    );
    const agent = this.resolveAgent(current.tenant, spec.doc, options.agent_snapshot_id);
    return this.command(current, 'run', {
      yaml: spec.stored.yaml,
      agent: agent === null ? null : JSON.stringify(agent),
      total_runs: experimentPlan(options, spec.doc).totalRuns,
      concurrency: this.concurrency(current.tenant, spec.doc),
    });
  }

  private command(
    current: ExperimentChanged,
    command: ExperimentCommand['command'],
    fields: Pick<ExperimentCommand, 'yaml' | 'agent' | 'total_runs' | 'concurrency'>,
  ): ExperimentCommand {
    return { tenant: current.tenant, event_id: newEventId(), ts: Date.now(), experiment_id: current.experiment_id, command, ...fields };
  }

  /** Sends a command to the aggregator and waits until this view shows one of `until`; a timeout error with `timeout` otherwise. */
  private async send(command: ExperimentCommand, until: readonly ExperimentStatus[], timeout: string): Promise<ExperimentChanged> {
    await publish(this.deps.kernel, TOPICS.experimentCommands, [{ key: command.experiment_id, tenant: command.tenant, value: command }]);
    const reached = await this.deps.experiments.waitForStatus(command.experiment_id, until);
    if (!reached) throw new AppError('timeout', timeout);
    return reached;
  }

  /** The agent a run pins: the request's snapshot when given, else the spec's (its newest version for `snapshot`). */
  private resolveAgent(tenant: string, doc: SpecDocument, snapshotId: string | undefined): ResolvedAgent | null {
    if (snapshotId === undefined || doc.agent?.type !== 'snapshot') return this.deps.agents.resolveForSpec(tenant, doc);
    const { snapshot: _name, ...pinned } = doc.agent;
    return this.deps.agents.resolveForSpec(tenant, { ...doc, agent: { ...pinned, snapshot_id: snapshotId } });
  }

  /** Runs in flight at most: the spec's concurrency_limit within the tenant's sandbox quota. */
  private concurrency(tenant: string, doc: SpecDocument): number {
    const { plan, quota } = this.deps.auth.sandboxQuota(tenant);
    if (quota === 0) throw new AppError('rate_limited', `the ${plan} plan's concurrent sandbox quota is 0: no run can start`, { retryAfter: 60 });
    return Math.min(doc.resources.concurrencyLimit ?? quota, quota);
  }
}
