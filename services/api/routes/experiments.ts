/**
 * Experiments (docs/experiments.md): creation (`created`, written here), run and cancel (commands
 * to the aggregator, which writes every later state; the call answers once this process's view
 * shows the aggregator's answer), RunResults, the list, metrics, compare, scenarios, eval history
 * and export. Live state comes from the ExperimentCatalog; runs, scores and traces from
 * ClickHouse.
 */
import Router from '@koa/router';
import type { Context } from 'koa';
import { Readable } from 'node:stream';
import { publish, type Kernel } from '../../kernel/actor.ts';
import type { ResolvedAgent } from '../../domain/agent-auth.ts';
import type { Auth, Principal } from '../../kernel/auth.ts';
import { AppError, badRequest } from '../../kernel/errors.ts';
import { experimentMetrics, runFacts, runTraceStats } from '../../queries/run-facts.ts';
import { newEventId, newExperimentId } from '../../kernel/ids.ts';
import { KeyedQueue } from '../../kernel/keyed-queue.ts';
import type { ExperimentChanged, ExperimentCommand, ExperimentOptions } from '../../domain/events/experiment-events.ts';
import { type Params, referencedParams } from '../../domain/params.ts';
import { SECRET_NAME, type SpecDocument } from '../../domain/spec.ts';
import { Sealer, secretsKey } from '../../kernel/tenant-secrets.ts';
import { TOPICS } from '../../kernel/topics.ts';
import type { AgentCatalog } from '../catalogs/agent-catalog.ts';
import { compareExperiments } from '../../domain/compare.ts';
import { countsOf, evalHistory, experimentSummary, exportJson, exportLines, listExperiments, runResults, scenarioPage, type ScenarioStatus } from '../experiment-results.ts';
import { TERMINAL_STATUSES, type ExperimentCatalog } from '../catalogs/experiment-catalog.ts';
import { checkQueryParams, decodeCursor, encodeCursor, parseLimit } from '../pagination.ts';
import type { SpecCatalog } from '../catalogs/spec-catalog.ts';
import { jsonBody } from '../request-body.ts';
import { refuseUnsupported } from '../../domain/capabilities.ts';
import { isObject } from '../../kernel/is-object.ts';

const NAME_MAX = 200;
const MATRIX_MAX = 1000;
const REPLICAS_MAX = 100;
const PARAM_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
const CREATE_FIELDS = ['name', 'spec_id', 'secrets', 'spec_version', 'agent_snapshot_id', 'matrix', 'replicas', 'seed', 'run'];
const SCENARIO_STATUSES: readonly ScenarioStatus[] = ['pass', 'fail', 'flaky', 'error', 'pending'];
const AFTER_CREATED: ExperimentChanged['status'][] = ['queued', 'running', 'completed', 'failed', 'cancelled'];

interface CreateRequest {
  name: string;
  spec_id: string;
  secrets: Record<string, string>;
  options: ExperimentOptions;
  run: boolean;
}



/** Every problem of a creation body, each naming its field, in one 400. */
function parseCreate(b: Record<string, unknown>): CreateRequest {
  const problems: string[] = [];
  const bad = (field: string, problem: string) => problems.push(`${field}: ${problem}`);
  for (const field of Object.keys(b)) if (!CREATE_FIELDS.includes(field)) bad(field, `unknown field; accepted: ${CREATE_FIELDS.join(', ')}`);

  if (typeof b.name !== 'string' || b.name.trim() === '') bad('name', 'is required: a non-empty string');
  else if (b.name.length > NAME_MAX) bad('name', `must be at most ${NAME_MAX} characters`);
  if (typeof b.spec_id !== 'string' || b.spec_id === '') bad('spec_id', 'is required: the id of a stored spec');

  const secrets: Record<string, string> = {};
  if (b.secrets !== undefined && b.secrets !== null) {
    if (!isObject(b.secrets)) bad('secrets', 'must be an object of secret name to string value');
    else
      for (const [name, value] of Object.entries(b.secrets)) {
        if (!SECRET_NAME.test(name)) bad(`secrets.${name}`, 'is not a valid secret name (letters, digits and _, not starting with a digit)');
        else if (typeof value !== 'string') bad(`secrets.${name}`, 'must be a string');
        else secrets[name] = value;
      }
  }

  const options: ExperimentOptions = {};
  if (b.spec_version !== undefined) {
    if (!Number.isInteger(b.spec_version) || (b.spec_version as number) < 1) bad('spec_version', 'must be a positive integer');
    else options.spec_version = b.spec_version as number;
  }
  if (b.agent_snapshot_id !== undefined) {
    if (typeof b.agent_snapshot_id !== 'string' || b.agent_snapshot_id === '') bad('agent_snapshot_id', 'must be an agent snapshot id (snap_...)');
    else options.agent_snapshot_id = b.agent_snapshot_id;
  }
  if (b.matrix !== undefined) {
    if (!Array.isArray(b.matrix) || b.matrix.length === 0 || b.matrix.length > MATRIX_MAX) {
      bad('matrix', `must be a list of 1 to ${MATRIX_MAX} parameter maps, e.g. [{"lang": "python"}, {"lang": "go"}]`);
    } else {
      const before = problems.length;
      b.matrix.forEach((entry: unknown, i: number) => {
        if (!isObject(entry)) return void bad(`matrix[${i}]`, 'must be a map of parameter name to value');
        for (const [name, value] of Object.entries(entry)) {
          if (!PARAM_NAME.test(name)) bad(`matrix[${i}].${name}`, 'is not a parameter name (letters, digits and _, not starting with a digit)');
          else if (typeof value !== 'string' && typeof value !== 'boolean' && !(typeof value === 'number' && Number.isFinite(value))) {
            bad(`matrix[${i}].${name}`, 'must be a string, a number or a boolean');
          }
        }
      });
      if (problems.length === before) options.matrix = b.matrix as Params[];
    }
  }
  if (b.replicas !== undefined) {
    if (!Number.isInteger(b.replicas) || (b.replicas as number) < 1 || (b.replicas as number) > REPLICAS_MAX) bad('replicas', `must be a whole number from 1 to ${REPLICAS_MAX}`);
    else options.replicas = b.replicas as number;
  }
  if (b.seed !== undefined) {
    if (!Number.isSafeInteger(b.seed) || (b.seed as number) < 0) bad('seed', 'must be a non-negative integer');
    else options.seed = b.seed as number;
  }
  if (b.run !== undefined && typeof b.run !== 'boolean') bad('run', 'must be true or false');
  if (problems.length > 0) throw new AppError('bad_request', problems.join('; '));
  return { name: b.name as string, spec_id: b.spec_id as string, secrets, options, run: b.run === true };
}

/** A request matrix entry must define every parameter the spec refers to. */
function matrixProblems(doc: SpecDocument, matrix: Params[] | undefined): string[] {
  if (!matrix) return [];
  const referenced = [...referencedParams(doc.raw)];
  return matrix.flatMap((entry, i) => referenced.filter((name) => !Object.hasOwn(entry, name)).map((name) => `matrix[${i}]: lacks ${name}, which the spec refers to as {{ params.${name} }}`));
}

function keysetCursor(raw: unknown): [number, string] | null {
  const key = decodeCursor(raw, 2);
  if (!key) return null;
  if (!/^\d+$/.test(key[0])) throw badRequest('cursor', 'is not a cursor returned by this endpoint');
  return [Number(key[0]), key[1]];
}

export function experimentsRouter(deps: { kernel: Kernel; auth: Auth; specs: SpecCatalog; agents: AgentCatalog; experiments: ExperimentCatalog }): Router {
  const { kernel, auth, specs, agents, experiments } = deps;
  const { config, store } = kernel;
  const router = new Router();
  const principal = (ctx: Context) => ctx.state.principal as Principal;
  let sealer: Sealer | null = null;
  /** Runs and cancels of one experiment take turns, so a second run sees the first one's answer. */
  const queue = new KeyedQueue();

  /** The stored spec version an experiment pins; a 400 naming spec_version when absent. */
  const specVersion = (tenant: string, specId: string, version: number | undefined) => {
    try {
      return specs.get(tenant, specId, version);
    } catch (err) {
      if (err instanceof AppError && err.code === 'not_found' && version !== undefined) throw badRequest('spec_version', `spec "${specId}" has no version ${version}`);
      throw err;
    }
  };

  /** The agent a run pins: the request's snapshot when given, else the spec's (its newest version for `snapshot`). */
  const resolveAgent = (tenant: string, doc: SpecDocument, snapshotId: string | undefined): ResolvedAgent | null => {
    if (snapshotId === undefined || doc.agent?.type !== 'snapshot') return agents.resolveForSpec(tenant, doc);
    const { snapshot: _name, ...pinned } = doc.agent;
    return agents.resolveForSpec(tenant, { ...doc, agent: { ...pinned, snapshot_id: snapshotId } });
  };

  /** Runs in flight at most: the spec's concurrency_limit within the tenant's sandbox quota. */
  const concurrency = (tenant: string, doc: SpecDocument): number => {
    const { plan, quota } = auth.sandboxQuota(tenant);
    if (quota === 0) throw new AppError('rate_limited', `the ${plan} plan's concurrent sandbox quota is 0: no run can start`, { retryAfter: 60 });
    return Math.min(doc.resources.concurrencyLimit ?? quota, quota);
  };

  const run = (experiment: ExperimentChanged): Promise<ExperimentChanged> =>
    queue.run(experiment.experiment_id, async () => {
      const current = experiments.get(experiment.experiment_id)!;
      if (current.status !== 'created') {
        throw new AppError('conflict', `experiment ${current.experiment_id} is ${current.status}; only a created experiment can run`);
      }
      const options = JSON.parse(current.options) as ExperimentOptions;
      let spec;
      try {
        spec = specs.get(current.tenant, current.spec_id, current.spec_version);
      } catch (err) {
        if (err instanceof AppError && err.code === 'not_found') throw new AppError('conflict', `spec "${current.spec_id}" version ${current.spec_version} was deleted; the experiment cannot run`);
        throw err;
      }
      refuseUnsupported(spec.doc, 'run');
      const agent = resolveAgent(current.tenant, spec.doc, options.agent_snapshot_id);
      const matrix = options.matrix ?? spec.doc.parallelism.matrix;
      const replicas = options.replicas ?? spec.doc.parallelism.replicas;
      const command: ExperimentCommand = {
        tenant: current.tenant,
        event_id: newEventId(),
        ts: Date.now(),
        experiment_id: current.experiment_id,
        command: 'run',
        yaml: spec.stored.yaml,
        agent: agent === null ? null : JSON.stringify(agent),
        total_runs: matrix.length * replicas,
        concurrency: concurrency(current.tenant, spec.doc),
      };
      await publish(kernel, TOPICS.experimentCommands, [{ key: current.experiment_id, tenant: current.tenant, value: command }]);
      const queued = await experiments.waitForStatus(current.experiment_id, AFTER_CREATED);
      if (!queued) throw new AppError('timeout', `experiment ${current.experiment_id}: the run was requested but not queued within ${config.replyTimeout} ms; GET /v1/experiments/${current.experiment_id} shows when it is`);
      return queued;
    });

  router.post('/v1/experiments', async (ctx) => {
    const p = principal(ctx);
    const request = parseCreate(jsonBody(ctx));
    // An unknown spec is a 404 here (DECISIONS.md), unlike POST /v1/sandboxes.
    const spec = specVersion(p.tenant, request.spec_id, request.options.spec_version);
    const problems = matrixProblems(spec.doc, request.options.matrix);
    const snapshotId = request.options.agent_snapshot_id;
    if (snapshotId !== undefined) {
      if (spec.doc.agent?.type !== 'snapshot') problems.push(`agent_snapshot_id: spec "${spec.doc.id}" does not run a snapshot agent (agent.type is ${spec.doc.agent?.type ?? 'unset'})`);
      else if (!agents.exists(p.tenant, snapshotId)) problems.push(`agent_snapshot_id: no agent snapshot ${snapshotId} of yours exists (GET /v1/agents/:name/versions lists them)`);
    }
    if (problems.length > 0) throw new AppError('bad_request', problems.join('; '));
    if (request.run) {
      // Refused before anything is created: a reproducer either runs or leaves nothing behind.
      refuseUnsupported(spec.doc, 'run');
      resolveAgent(p.tenant, spec.doc, snapshotId);
      concurrency(p.tenant, spec.doc);
    }
    const id = newExperimentId();
    const now = Date.now();
    sealer ??= new Sealer(secretsKey(config));
    const experiment: ExperimentChanged = {
      tenant: p.tenant,
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
      secrets: Object.keys(request.secrets).length > 0 ? sealer.seal(JSON.stringify(request.secrets), id) : Buffer.alloc(0),
      yaml: null,
      agent: null,
      error: null,
      metrics: null,
    };
    await experiments.put(experiment);
    ctx.status = 201;
    ctx.body = experimentSummary(request.run ? await run(experiment) : experiment);
  });

  router.get('/v1/experiments', async (ctx) => {
    checkQueryParams(ctx, []);
    const limit = parseLimit(ctx.query.limit, config);
    const page = await listExperiments(store, principal(ctx).tenant, keysetCursor(ctx.query.cursor), limit);
    ctx.body = { items: page.items, ...(page.next ? { next_cursor: encodeCursor(page.next) } : {}), count: page.items.length };
  });

  router.post('/v1/experiments/compare', async (ctx) => {
    const p = principal(ctx);
    const b = jsonBody(ctx);
    const sides = (['baseline_id', 'candidate_id'] as const).map((field) => {
      const id = b[field];
      if (typeof id !== 'string' || id === '') throw badRequest(field, 'is required: an experiment id');
      const experiment = experiments.owned(p, id);
      if (experiment.status !== 'completed') throw new AppError('conflict', `${field}: experiment ${id} is ${experiment.status}; only completed experiments compare`);
      return experiment;
    });
    const [baseline, candidate] = await Promise.all(
      sides.map(async (e) => {
        const [runs, traces] = await Promise.all([runFacts(store, p.tenant, e.experiment_id), runTraceStats(store, p.tenant, e.experiment_id)]);
        return { experiment_id: e.experiment_id, runs, traces, aggregation: experiments.plan(e).scoring.replica_aggregation };
      }),
    );
    ctx.body = compareExperiments(baseline, candidate);
  });

  router.get('/v1/experiments/:id', async (ctx) => {
    checkQueryParams(ctx, []);
    const experiment = experiments.owned(principal(ctx), ctx.params.id);
    ctx.body = await runResults(store, experiment, experiments.plan(experiment), config.baseUrl);
  });

  router.post('/v1/experiments/:id/run', async (ctx) => {
    const experiment = experiments.owned(principal(ctx), ctx.params.id);
    ctx.status = 202;
    ctx.body = experimentSummary(await run(experiment));
  });

  router.post('/v1/experiments/:id/cancel', async (ctx) => {
    const experiment = experiments.owned(principal(ctx), ctx.params.id);
    const cancelled = await queue.run(experiment.experiment_id, async () => {
      const current = experiments.get(experiment.experiment_id)!;
      if (TERMINAL_STATUSES.includes(current.status)) throw new AppError('conflict', `experiment ${current.experiment_id} is already ${current.status}`);
      const command: ExperimentCommand = { tenant: current.tenant, event_id: newEventId(), ts: Date.now(), experiment_id: current.experiment_id, command: 'cancel', yaml: null, agent: null, total_runs: 0, concurrency: 0 };
      await publish(kernel, TOPICS.experimentCommands, [{ key: current.experiment_id, tenant: current.tenant, value: command }]);
      const done = await experiments.waitForStatus(current.experiment_id, TERMINAL_STATUSES);
      if (!done) throw new AppError('timeout', `experiment ${current.experiment_id}: the cancel was requested but not applied within ${config.replyTimeout} ms`);
      return done;
    });
    ctx.body = experimentSummary(cancelled, (await countsOf(store, cancelled.tenant, [cancelled.experiment_id])).get(cancelled.experiment_id));
  });

  router.get('/v1/experiments/:id/export', async (ctx) => {
    checkQueryParams(ctx, []);
    const format = ctx.query.format ?? 'json';
    if (format !== 'json' && format !== 'ndjson') throw badRequest('format', 'must be json or ndjson');
    const experiment = experiments.owned(principal(ctx), ctx.params.id);
    const lines = exportLines(store, experiment, experiments.plan(experiment), config.baseUrl);
    const chunks =
      format === 'json'
        ? exportJson(lines)
        : (async function* () {
            for await (const line of lines) yield `${JSON.stringify(line)}\n`;
          })();
    // The first chunk is read before answering, so a failing query is an error status, not a cut stream.
    const first = await chunks.next();
    ctx.type = format === 'json' ? 'application/json' : 'application/x-ndjson';
    ctx.set('Content-Disposition', `attachment; filename="${experiment.experiment_id}.${format}"`);
    ctx.body = Readable.from(
      (async function* () {
        if (!first.done) yield first.value;
        yield* chunks;
      })(),
    );
  });

  router.get('/v1/metrics/experiments/:id', async (ctx) => {
    checkQueryParams(ctx, []);
    const experiment = experiments.owned(principal(ctx), ctx.params.id);
    ctx.body = await experimentMetrics(store, experiment.tenant, experiment.experiment_id, experiments.plan(experiment).scoring);
  });

  router.get('/v1/scenarios', async (ctx) => {
    checkQueryParams(ctx, ['experiment_id', 'status', 'scenario_id']);
    const q = ctx.query as Record<string, string | undefined>;
    if (q.experiment_id === undefined || q.experiment_id === '') throw badRequest('experiment_id', 'is required: the experiment whose scenarios to list');
    if (q.status !== undefined && !SCENARIO_STATUSES.includes(q.status as ScenarioStatus)) throw badRequest('status', `must be one of ${SCENARIO_STATUSES.join(', ')}`);
    if (q.scenario_id === '') throw badRequest('scenario_id', 'must not be empty');
    const limit = parseLimit(ctx.query.limit, config);
    const cursor = decodeCursor(ctx.query.cursor, 1);
    if (cursor && !/^\d+$/.test(cursor[0])) throw badRequest('cursor', 'is not a cursor returned by this endpoint');
    const experiment = experiments.owned(principal(ctx), q.experiment_id);
    const page = await scenarioPage(
      store,
      experiment,
      experiments.plan(experiment),
      config.baseUrl,
      { ...(q.status !== undefined && { status: q.status as ScenarioStatus }), ...(q.scenario_id !== undefined && { scenario_id: q.scenario_id }) },
      cursor ? Number(cursor[0]) : null,
      limit,
    );
    ctx.body = { items: page.items, ...(page.next !== null ? { next_cursor: encodeCursor([String(page.next)]) } : {}), count: page.items.length };
  });

  router.get('/v1/evals/:id/history', async (ctx) => {
    checkQueryParams(ctx, []);
    const tenant = principal(ctx).tenant;
    const limit = parseLimit(ctx.query.limit, config);
    const cursor = keysetCursor(ctx.query.cursor);
    const page = await evalHistory(store, tenant, ctx.params.id, cursor, limit);
    // A spec id the tenant never had is a 404; a deleted spec keeps its history.
    if (page.items.length === 0 && cursor === null) {
      try {
        specs.get(tenant, ctx.params.id);
      } catch (err) {
        if (err instanceof AppError && err.code === 'not_found') throw new AppError('not_found', `eval ${ctx.params.id} not found: no spec and no completed experiment of that id`);
        throw err;
      }
    }
    ctx.body = { items: page.items, ...(page.next ? { next_cursor: encodeCursor(page.next) } : {}), count: page.items.length };
  });

  return router;
}
