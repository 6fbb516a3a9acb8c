/**
 * What the experiment endpoints answer, read from ClickHouse: the experiment summary (list,
 * history), RunResults (GET /v1/experiments/:id), scenarios with their runs (GET /v1/scenarios),
 * the export bundle, and the reproducer command of a run. docs/experiments.md documents every
 * shape. Runs are the latest row per run of run_scores (FINAL); costs, tokens and tool calls come
 * from the trace events of the run's sandbox (queries/run-facts.ts).
 */
import { shellQuote } from '../kernel/shell.ts';
import type { ResolvedAgent } from '../domain/agent-auth.ts';
import { computeMetrics, NO_TRACES, tallyScenarios, type ExperimentMetrics, type RunFact, type RunTraceStats, type VerdictCounts } from '../domain/experiment-metrics.ts';
import { experimentMetrics, runFacts, runTraceStats } from '../queries/run-facts.ts';
import { scenarioIdOf } from '../kernel/ids.ts';
import type { ExperimentChanged } from '../domain/events/experiment-events.ts';
import type { InvariantScore, RunScore, Violation } from '../domain/events/run-events.ts';
import type { Params } from '../domain/params.ts';
import { parseSpec } from '../domain/spec.ts';
import { countsAsPassing, mean, passAtK, passHatK, scenarioVerdict, wilsonInterval, type Interval, type ScenarioVerdict } from '../domain/stats.ts';
import type { Store } from '../kernel/store/store.ts';
import type { ExperimentPlan } from './catalogs/experiment-catalog.ts';

const iso = (ms: number | string | null): string | null => (ms === null ? null : new Date(Number(ms)).toISOString());
const noCounts = (): VerdictCounts => ({ pass: 0, fail: 0, flaky: 0, error: 0 });

export interface ExperimentSummary {
  id: string;
  name: string;
  spec_id: string;
  spec_version: number;
  status: string;
  created_at: string;
  queued_at: string | null;
  started_at: string | null;
  completed_at: string | null;
  total_runs: number;
  scored_runs: number;
  /** Scenarios by verdict so far. */
  counts: VerdictCounts;
  /** Why it failed or was cancelled. */
  error: string | null;
}

export function experimentSummary(e: ExperimentChanged, counts: VerdictCounts = noCounts()): ExperimentSummary {
  return {
    id: e.experiment_id,
    name: e.name,
    spec_id: e.spec_id,
    spec_version: e.spec_version,
    status: e.status,
    created_at: iso(e.created_at)!,
    queued_at: iso(e.queued_at),
    started_at: iso(e.started_at),
    completed_at: iso(e.completed_at),
    total_runs: e.total_runs,
    scored_runs: e.scored_runs,
    counts,
    error: e.error,
  };
}

/** Scenario verdict counts of several experiments of one tenant, in one query. */
export async function countsOf(store: Store, tenant: string, ids: string[]): Promise<Map<string, VerdictCounts>> {
  const out = new Map(ids.map((id) => [id, noCounts()]));
  if (ids.length === 0) return out;
  const rows = await store.query<{ ExperimentId: string; passed: string; failed: string }>(
    `SELECT ExperimentId, ScenarioIndex, countIf(Verdict = 'pass') AS passed, countIf(Verdict = 'fail') AS failed
     FROM run_scores FINAL WHERE TenantId = {tenant:String} AND ExperimentId IN {ids:Array(String)}
     GROUP BY ExperimentId, ScenarioIndex`,
    { tenant, ids },
  );
  for (const r of rows) out.get(r.ExperimentId)![scenarioVerdict(Number(r.passed), Number(r.failed))]++;
  return out;
}

// --- the experiments table: list and history ----------------------------------------------------

interface ExperimentRow {
  ExperimentId: string;
  Name: string;
  SpecId: string;
  SpecVersion: number;
  Status: string;
  created_ms: string;
  queued_ms: string | null;
  started_ms: string | null;
  completed_ms: string | null;
  TotalRuns: number;
  ScoredRuns: number;
  Error: string;
}

const EXPERIMENT_COLUMNS = `ExperimentId, Name, SpecId, SpecVersion, Status, toUnixTimestamp64Milli(CreatedAt) AS created_ms,
  toUnixTimestamp64Milli(QueuedAt) AS queued_ms, toUnixTimestamp64Milli(StartedAt) AS started_ms,
  toUnixTimestamp64Milli(CompletedAt) AS completed_ms, TotalRuns, ScoredRuns, Error`;

export interface KeysetPage<T> {
  items: T[];
  /** The sort key after the last item, or null on the last page. */
  next: string[] | null;
}

/** A tenant's experiments, newest first, keyset-paginated on (created_at, id). */
export async function listExperiments(store: Store, tenant: string, after: [number, string] | null, limit: number): Promise<KeysetPage<ExperimentSummary>> {
  const conditions = ['TenantId = {tenant:String}'];
  const params: Record<string, unknown> = { tenant, page: limit + 1 };
  if (after) {
    conditions.push('(CreatedAt, ExperimentId) < (fromUnixTimestamp64Milli({after_ts:Int64}), {after_id:String})');
    params.after_ts = after[0];
    params.after_id = after[1];
  }
  const rows = await store.query<ExperimentRow>(
    `SELECT ${EXPERIMENT_COLUMNS} FROM experiments FINAL WHERE ${conditions.join(' AND ')}
     ORDER BY CreatedAt DESC, ExperimentId DESC LIMIT {page:UInt32}`,
    params,
  );
  const page = rows.slice(0, limit);
  const counts = await countsOf(store, tenant, page.map((r) => r.ExperimentId));
  const last = rows.length > limit ? page[page.length - 1] : null;
  return {
    items: page.map((r) => ({
      id: r.ExperimentId,
      name: r.Name,
      spec_id: r.SpecId,
      spec_version: Number(r.SpecVersion),
      status: r.Status,
      created_at: iso(r.created_ms)!,
      queued_at: iso(r.queued_ms),
      started_at: iso(r.started_ms),
      completed_at: iso(r.completed_ms),
      total_runs: Number(r.TotalRuns),
      scored_runs: Number(r.ScoredRuns),
      counts: counts.get(r.ExperimentId)!,
      error: r.Error === '' ? null : r.Error,
    })),
    next: last ? [last.created_ms, last.ExperimentId] : null,
  };
}

export interface HistoryItem {
  experiment_id: string;
  name: string;
  spec_version: number;
  created_at: string;
  completed_at: string | null;
  pass_rate: number | null;
  metrics: ExperimentMetrics;
}

/**
 * The history of an eval (a spec id): its completed experiments, oldest first, each with its
 * metrics (the snapshot taken at completion, else computed now).
 */
export async function evalHistory(store: Store, tenant: string, specId: string, after: [number, string] | null, limit: number): Promise<KeysetPage<HistoryItem>> {
  const conditions = ['TenantId = {tenant:String}', 'SpecId = {spec:String}', "Status = 'completed'"];
  const params: Record<string, unknown> = { tenant, spec: specId, page: limit + 1 };
  if (after) {
    conditions.push('(CreatedAt, ExperimentId) > (fromUnixTimestamp64Milli({after_ts:Int64}), {after_id:String})');
    params.after_ts = after[0];
    params.after_id = after[1];
  }
  const rows = await store.query<ExperimentRow & { Metrics: string; Yaml: string }>(
    `SELECT ${EXPERIMENT_COLUMNS}, Metrics, Yaml FROM experiments FINAL WHERE ${conditions.join(' AND ')}
     ORDER BY CreatedAt, ExperimentId LIMIT {page:UInt32}`,
    params,
  );
  const page = rows.slice(0, limit);
  const items = await Promise.all(
    page.map(async (r): Promise<HistoryItem> => {
      const metrics =
        r.Metrics !== ''
          ? (JSON.parse(r.Metrics) as ExperimentMetrics)
          : await experimentMetrics(store, tenant, r.ExperimentId, parseSpec(r.Yaml).scoring);
      return {
        experiment_id: r.ExperimentId,
        name: r.Name,
        spec_version: Number(r.SpecVersion),
        created_at: iso(r.created_ms)!,
        completed_at: iso(r.completed_ms),
        pass_rate: metrics.pass_rate,
        metrics,
      };
    }),
  );
  const last = rows.length > limit ? page[page.length - 1] : null;
  return { items, next: last ? [last.created_ms, last.ExperimentId] : null };
}

// --- runs and scenarios -------------------------------------------------------------------------

interface RunRow {
  ScenarioId: string;
  ScenarioIndex: number;
  RunId: string;
  Replica: number;
  Attempt: number;
  Params: string;
  Seed: string;
  Verdict: RunScore['verdict'];
  Composite: number | null;
  Invariants: string;
  Violations: string;
  Error: string | null;
  WallMs: string;
  SandboxId: string | null;
  AgentSnapshotId: string | null;
  scored_ms: string;
  outcome_status: string;
  exit_code: string | null;
  /** Only in the export. */
  Outcome?: string;
}

const RUN_COLUMNS = `ScenarioId, ScenarioIndex, RunId, Replica, Attempt, Params, Seed, Verdict, Composite, Invariants, Violations, Error, WallMs,
  SandboxId, AgentSnapshotId, toUnixTimestamp64Milli(ScoredAt) AS scored_ms, JSONExtractString(Outcome, 'status') AS outcome_status,
  JSONExtract(Outcome, 'agent', 'exit_code', 'Nullable(Int64)') AS exit_code`;

/** The latest score of each run of an experiment (of some scenarios only, when `indices` is given), in scenario and replica order. */
async function loadRuns(store: Store, tenant: string, experimentId: string, indices: number[] | null): Promise<RunRow[]> {
  return store.query<RunRow>(
    `SELECT ${RUN_COLUMNS} FROM run_scores FINAL
     WHERE TenantId = {tenant:String} AND ExperimentId = {experiment:String}${indices ? ' AND ScenarioIndex IN {indices:Array(UInt32)}' : ''}
     ORDER BY ScenarioIndex, Replica, RunId`,
    { tenant, experiment: experimentId, ...(indices ? { indices } : {}) },
  );
}

export interface RunResult {
  run_id: string;
  scenario_id: string;
  replica: number;
  attempt: number;
  /** pass / fail by the scoring rules; error when the run did not complete. */
  verdict: RunScore['verdict'];
  /** The runner's outcome: completed, boot_failed, agent_timeout or error. */
  status: string;
  composite: number | null;
  seed: number;
  sandbox_id: string | null;
  agent_snapshot_id: string | null;
  agent_exit_code: number | null;
  invariants: InvariantScore[];
  violations: Violation[];
  /** Why the run is `error`. */
  error: string | null;
  wall_ms: number;
  cost_usd: number;
  tokens: { input: number; output: number; cache_read: number; reasoning: number };
  llm_calls: number;
  tool_calls: number;
  tool_errors: number;
  /** The run's trace events and their metrics (the sandbox's trace endpoint). */
  trace_url: string | null;
  scored_at: string;
  /** For a failed or errored run, and every run of a flaky scenario: one shell command that re-runs it alone. */
  reproducer: string | null;
}

export interface ScenarioResult {
  scenario_id: string;
  index: number;
  params: Params;
  /** Over completed runs; null while no run of it is scored. */
  verdict: ScenarioVerdict | null;
  /** Whether it counts as passing in the experiment's pass rate (replica_aggregation). */
  passing: boolean;
  /** Every replica is scored. */
  complete: boolean;
  replicas: number;
  scored_runs: number;
  passed: number;
  failed: number;
  errored: number;
  /** passed / completed runs, with its 95% Wilson interval. */
  pass_rate: number | null;
  pass_rate_ci95: Interval | null;
  pass_at_1: number | null;
  /** k = the completed runs. */
  pass_at_k: { k: number; value: number } | null;
  pass_hat_k: { k: number; value: number } | null;
  mean_wall_ms: number | null;
  cost_usd: number;
  /** The reason of its first errored run, when the verdict is error. */
  error: string | null;
  runs: RunResult[];
}

interface ResultContext {
  experiment: ExperimentChanged;
  plan: ExperimentPlan;
  baseUrl: string;
}


/**
 * One shell command that creates and runs an experiment of just this run: the same spec version,
 * agent snapshot, matrix entry and seed, one replica. Request secrets are not carried (they are
 * never returned); add them to the body when the spec needs them.
 */
export function reproducer(baseUrl: string, experiment: Pick<ExperimentChanged, 'spec_id' | 'spec_version'>, run: { run_id: string; params: Params; seed: number; agent_snapshot_id: string | null }): string {
  const body = {
    name: `reproduce ${run.run_id}`,
    spec_id: experiment.spec_id,
    spec_version: experiment.spec_version,
    ...(run.agent_snapshot_id !== null ? { agent_snapshot_id: run.agent_snapshot_id } : {}),
    matrix: [run.params],
    replicas: 1,
    seed: run.seed,
    run: true,
  };
  return `curl -sS -X POST ${shellQuote(`${baseUrl}/v1/experiments`)} -H "Authorization: Bearer $SVC_API_KEY" -H 'Content-Type: application/json' -d ${shellQuote(JSON.stringify(body))}`;
}

function runResult(ctx: ResultContext, row: RunRow, params: Params, traces: RunTraceStats, withReproducer: boolean): RunResult {
  const seed = Number(row.Seed);
  return {
    run_id: row.RunId,
    scenario_id: row.ScenarioId,
    replica: Number(row.Replica),
    attempt: Number(row.Attempt),
    verdict: row.Verdict,
    status: row.outcome_status,
    composite: row.Composite,
    seed,
    sandbox_id: row.SandboxId,
    agent_snapshot_id: row.AgentSnapshotId,
    agent_exit_code: row.exit_code === null ? null : Number(row.exit_code),
    invariants: JSON.parse(row.Invariants) as InvariantScore[],
    violations: JSON.parse(row.Violations) as Violation[],
    error: row.Error,
    wall_ms: Number(row.WallMs),
    cost_usd: traces.cost_usd,
    tokens: { input: traces.input_tokens, output: traces.output_tokens, cache_read: traces.cache_read_tokens, reasoning: traces.reasoning_tokens },
    llm_calls: traces.llm_calls,
    tool_calls: traces.tool_calls,
    tool_errors: traces.tool_errors,
    trace_url: row.SandboxId === null ? null : `${ctx.baseUrl}/v1/sandboxes/${row.SandboxId}/trace`,
    scored_at: iso(row.scored_ms)!,
    reproducer: withReproducer ? reproducer(ctx.baseUrl, ctx.experiment, { run_id: row.RunId, params, seed, agent_snapshot_id: row.AgentSnapshotId }) : null,
  };
}

function scenarioResult(ctx: ResultContext, index: number, rows: RunRow[], traces: ReadonlyMap<string, RunTraceStats>): ScenarioResult {
  const passed = rows.filter((r) => r.Verdict === 'pass').length;
  const failed = rows.filter((r) => r.Verdict === 'fail').length;
  const completed = passed + failed;
  const verdict = rows.length === 0 ? null : scenarioVerdict(passed, failed);
  const params = ctx.plan.matrix?.[index] ?? (rows.length > 0 ? (JSON.parse(rows[0].Params) as Params) : {});
  const statsOf = (r: RunRow) => traces.get(r.RunId) ?? NO_TRACES;
  const walls = rows.filter((r) => r.Verdict !== 'error').map((r) => Number(r.WallMs));
  return {
    scenario_id: scenarioIdOf(ctx.experiment.experiment_id, index),
    index,
    params,
    verdict,
    passing: countsAsPassing(ctx.plan.scoring.replica_aggregation, passed, completed),
    complete: rows.length >= ctx.plan.replicas,
    replicas: ctx.plan.replicas,
    scored_runs: rows.length,
    passed,
    failed,
    errored: rows.length - completed,
    pass_rate: completed === 0 ? null : passed / completed,
    pass_rate_ci95: wilsonInterval(passed, completed),
    pass_at_1: completed === 0 ? null : passAtK(completed, passed, 1),
    pass_at_k: completed === 0 ? null : { k: completed, value: passAtK(completed, passed, completed)! },
    pass_hat_k: completed === 0 ? null : { k: completed, value: passHatK(completed, passed, completed)! },
    mean_wall_ms: walls.length === 0 ? null : mean(walls),
    cost_usd: rows.reduce((sum, r) => sum + statsOf(r).cost_usd, 0),
    error: verdict === 'error' ? (rows.find((r) => r.Error !== null)?.Error ?? 'every run errored') : null,
    runs: rows.map((r) => runResult(ctx, r, params, statsOf(r), r.Verdict !== 'pass' || verdict === 'flaky')),
  };
}

/** Scenario indices: every planned matrix entry, and any that has scored runs. */
function scenarioIndices(plan: ExperimentPlan, withRuns: Iterable<number>): number[] {
  const indices = new Set<number>(withRuns);
  for (let i = 0; i < (plan.matrix?.length ?? 0); i++) indices.add(i);
  return [...indices].sort((a, b) => a - b);
}

function byIndex(rows: RunRow[]): Map<number, RunRow[]> {
  const groups = new Map<number, RunRow[]>();
  for (const row of rows) {
    const index = Number(row.ScenarioIndex);
    const group = groups.get(index);
    if (group) group.push(row);
    else groups.set(index, [row]);
  }
  return groups;
}

function fact(row: RunRow): RunFact {
  return { run_id: row.RunId, scenario_index: Number(row.ScenarioIndex), params: row.Params, verdict: row.Verdict, wall_ms: Number(row.WallMs), violations: (JSON.parse(row.Violations) as unknown[]).length };
}

function agentSummary(experiment: ExperimentChanged) {
  if (experiment.agent === null) return null;
  const agent = JSON.parse(experiment.agent) as ResolvedAgent;
  return { snapshot_id: agent.snapshot_id, name: agent.name, version: agent.version, digest: agent.digest };
}

/** The experiment with how it runs: the summary plus options, agent, scoring and metrics. */
function experimentDetail(experiment: ExperimentChanged, plan: ExperimentPlan, metrics: ExperimentMetrics) {
  return {
    ...experimentSummary(experiment, metrics.counts),
    concurrency: experiment.concurrency,
    options: plan.options,
    replicas: plan.replicas,
    matrix: plan.matrix,
    agent: agentSummary(experiment),
    scoring: plan.scoring,
    pass_rate: metrics.pass_rate,
    metrics,
  };
}

export type RunResults = ReturnType<typeof experimentDetail> & { scenarios: ScenarioResult[] };

/** GET /v1/experiments/:id. */
export async function runResults(store: Store, experiment: ExperimentChanged, plan: ExperimentPlan, baseUrl: string): Promise<RunResults> {
  const { tenant, experiment_id: id } = experiment;
  const [rows, traces] = await Promise.all([loadRuns(store, tenant, id, null), runTraceStats(store, tenant, id)]);
  const groups = byIndex(rows);
  const ctx = { experiment, plan, baseUrl };
  const metrics = computeMetrics(id, rows.map(fact), traces, plan.scoring.replica_aggregation);
  return { ...experimentDetail(experiment, plan, metrics), scenarios: scenarioIndices(plan, groups.keys()).map((i) => scenarioResult(ctx, i, groups.get(i) ?? [], traces)) };
}

export type ScenarioStatus = ScenarioVerdict | 'pending';

/**
 * GET /v1/scenarios: the experiment's scenarios in index order after `after`, filtered by
 * verdict (`pending`: no run scored yet) and id, each with its runs.
 */
export async function scenarioPage(
  store: Store,
  experiment: ExperimentChanged,
  plan: ExperimentPlan,
  baseUrl: string,
  filter: { status?: ScenarioStatus; scenario_id?: string },
  after: number | null,
  limit: number,
): Promise<{ items: Array<ScenarioResult & { experiment_id: string }>; next: number | null }> {
  const { tenant, experiment_id: id } = experiment;
  // Verdicts first from the light columns, so only the page's runs are read in full.
  const tallies = new Map(tallyScenarios(await runFacts(store, tenant, id), plan.scoring.replica_aggregation).map((t) => [t.index, t]));
  const matching = scenarioIndices(plan, tallies.keys()).filter(
    (i) =>
      (after === null || i > after) &&
      (filter.status === undefined || (tallies.get(i)?.verdict ?? 'pending') === filter.status) &&
      (filter.scenario_id === undefined || scenarioIdOf(id, i) === filter.scenario_id),
  );
  const page = matching.slice(0, limit);
  if (page.length === 0) return { items: [], next: null };
  const [rows, traces] = await Promise.all([loadRuns(store, tenant, id, page), runTraceStats(store, tenant, id)]);
  const groups = byIndex(rows);
  const ctx = { experiment, plan, baseUrl };
  return {
    items: page.map((i) => ({ experiment_id: id, ...scenarioResult(ctx, i, groups.get(i) ?? [], traces) })),
    next: matching.length > limit ? page[page.length - 1] : null,
  };
}

// --- export ----------------------------------------------------------------------------------

const EXPORT_PAGE = 500;

function withoutRuns(scenario: ScenarioResult): Omit<ScenarioResult, 'runs'> {
  const { runs: _runs, ...rest } = scenario;
  return rest;
}

export type ExportLine =
  | ({ type: 'experiment' } & ReturnType<typeof experimentDetail>)
  | { type: 'spec'; id: string; version: number; yaml: string | null }
  | ({ type: 'scenario' } & Omit<ScenarioResult, 'runs'>)
  | ({ type: 'run' } & RunResult & { outcome: unknown })
  | { type: 'end'; scenarios: number; runs: number };

/**
 * The export bundle as a stream of typed lines: the experiment (with its metrics), its spec,
 * then every scenario followed by its runs (each with the runner's full outcome), and `end`.
 * Runs are read a page at a time, so an experiment of any size streams in bounded memory.
 */
export async function* exportLines(store: Store, experiment: ExperimentChanged, plan: ExperimentPlan, baseUrl: string): AsyncGenerator<ExportLine> {
  const { tenant, experiment_id: id } = experiment;
  const [facts, traces] = await Promise.all([runFacts(store, tenant, id), runTraceStats(store, tenant, id)]);
  const metrics = computeMetrics(id, facts, traces, plan.scoring.replica_aggregation);
  yield { type: 'experiment', ...experimentDetail(experiment, plan, metrics) };
  yield { type: 'spec', id: experiment.spec_id, version: experiment.spec_version, yaml: plan.yaml };
  const ctx = { experiment, plan, baseUrl };
  const planned = plan.matrix?.length ?? 0;
  let nextIndex = 0;
  let scenarios = 0;
  let runs = 0;
  const emit = function* (index: number, rows: RunRow[]): Generator<ExportLine> {
    // Planned scenarios without any scored run come in their place, with no runs.
    for (; nextIndex < Math.min(index, planned); nextIndex++) {
      scenarios++;
      yield { type: 'scenario', ...withoutRuns(scenarioResult(ctx, nextIndex, [], traces)) };
    }
    if (index >= planned && rows.length === 0) return;
    const scenario = scenarioResult(ctx, index, rows, traces);
    scenarios++;
    yield { type: 'scenario', ...withoutRuns(scenario) };
    for (const [i, run] of scenario.runs.entries()) {
      runs++;
      yield { type: 'run', ...run, outcome: JSON.parse(rows[i].Outcome!) };
    }
    nextIndex = index + 1;
  };
  let group: RunRow[] = [];
  let after: [number, number, string] | null = null;
  for (;;) {
    const page: RunRow[] = await store.query<RunRow>(
      `SELECT ${RUN_COLUMNS}, Outcome FROM run_scores FINAL
       WHERE TenantId = {tenant:String} AND ExperimentId = {experiment:String}
         ${after ? 'AND (ScenarioIndex, Replica, RunId) > ({after_index:UInt32}, {after_replica:UInt32}, {after_run:String})' : ''}
       ORDER BY ScenarioIndex, Replica, RunId LIMIT {page:UInt32}`,
      { tenant, experiment: id, page: EXPORT_PAGE, ...(after ? { after_index: after[0], after_replica: after[1], after_run: after[2] } : {}) },
    );
    for (const row of page) {
      if (group.length > 0 && Number(group[0].ScenarioIndex) !== Number(row.ScenarioIndex)) {
        yield* emit(Number(group[0].ScenarioIndex), group);
        group = [];
      }
      group.push(row);
    }
    if (page.length < EXPORT_PAGE) break;
    const last = page[page.length - 1];
    after = [Number(last.ScenarioIndex), Number(last.Replica), last.RunId];
  }
  if (group.length > 0) yield* emit(Number(group[0].ScenarioIndex), group);
  yield* emit(planned, []);
  yield { type: 'end', scenarios, runs };
}

/** The same lines as one JSON document `{experiment, spec, scenarios: [{..., runs: [...]}], runs_total}`, in chunks. */
export async function* exportJson(lines: AsyncIterable<ExportLine>): AsyncGenerator<string> {
  let openScenario = false;
  let firstScenario = true;
  let firstRun = true;
  for await (const line of lines) {
    const { type, ...rest } = line;
    switch (type) {
      case 'experiment':
        yield `{"experiment":${JSON.stringify(rest)}`;
        break;
      case 'spec':
        yield `,"spec":${JSON.stringify(rest)},"scenarios":[`;
        break;
      case 'scenario': {
        const opening = JSON.stringify({ ...rest, runs: [] });
        // Drop the closing `]}` of the empty runs list: the runs follow.
        yield `${openScenario ? ']}' : ''}${firstScenario ? '' : ','}${opening.slice(0, -2)}`;
        openScenario = true;
        firstScenario = false;
        firstRun = true;
        break;
      }
      case 'run':
        yield `${firstRun ? '' : ','}${JSON.stringify(rest)}`;
        firstRun = false;
        break;
      case 'end':
        yield `${openScenario ? ']}' : ''}],"totals":${JSON.stringify(rest)}}`;
        break;
    }
  }
}
