/**
 * RunResults (GET /v1/experiments/:id) and its parts: the experiment detail, each scenario with
 * its verdict, statistics and runs, each run with its scores and trace costs. The scenario list
 * (scenario-page.ts) and the export bundle (export-bundle.ts) are made of the same parts.
 * docs/experiments.md documents every shape. Runs are the latest row per run of run_scores
 * (FINAL); costs, tokens and tool calls come from the trace events of the run's sandbox
 * (queries/run-facts.ts).
 */
import type { ResolvedAgent } from '../../domain/agent-auth.ts';
import { computeMetrics, NO_TRACES, type ExperimentMetrics, type RunFact, type RunTraceStats } from '../../domain/experiment-metrics.ts';
import type { ExperimentChanged } from '../../domain/events/experiment-events.ts';
import type { CheckOutput, CheckResult, InvariantScore, RunImage, RunScore, Violation } from '../../domain/events/run-events.ts';
import { matrixPart, type Params, scenarioRecord, type ScenarioRecord } from '../../domain/params.ts';
import { countsAsPassing, mean, passAtK, passHatK, scenarioVerdict, wilsonInterval, type Interval, type ScenarioVerdict } from '../../domain/stats.ts';
import { scenarioIdOf } from '../../kernel/ids.ts';
import type { Store } from '../../kernel/store/store.ts';
import { runTraceStats } from '../../queries/run-facts.ts';
import type { PinnedPlan } from '../catalogs/experiment-catalog.ts';
import { reproducer } from './reproducer.ts';
import { scenarioParams } from './scenario-params.ts';
import { experimentSummary, iso } from './summary.ts';

export interface RunRow {
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
  /** The outcome's `checks` as JSON ('' in outcomes without them). */
  checks: string;
  /** The outcome's `image` as JSON ('' in outcomes without it). */
  image: string;
  /** Only in the export. */
  Outcome?: string;
}

export const RUN_COLUMNS = `ScenarioId, ScenarioIndex, RunId, Replica, Attempt, Params, Seed, Verdict, Composite, Invariants, Violations, Error, WallMs,
  SandboxId, AgentSnapshotId, toUnixTimestamp64Milli(ScoredAt) AS scored_ms, JSONExtractString(Outcome, 'status') AS outcome_status,
  JSONExtract(Outcome, 'agent', 'exit_code', 'Nullable(Int64)') AS exit_code, JSONExtractRaw(Outcome, 'checks') AS checks, JSONExtractRaw(Outcome, 'image') AS image`;

/** The latest score of each run of an experiment (of some scenarios only, when `indices` is given), in scenario and replica order. */
export async function loadRuns(store: Store, tenant: string, experimentId: string, indices: number[] | null): Promise<RunRow[]> {
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
  /** Each with what its check printed (command_exit, custom), from the runner's outcome. */
  invariants: Array<InvariantScore & { output?: CheckOutput }>;
  violations: Violation[];
  /** Why the run is `error`. */
  error: string | null;
  wall_ms: number;
  cost_usd: number;
  tokens: { input: number; output: number; cache_read: number; reasoning: number };
  llm_calls: number;
  tool_calls: number;
  tool_errors: number;
  /** The image its sandbox ran (reference, digest, and what replaced it if anything); null when none booted. */
  image: RunImage | null;
  /** The run's trace events and their metrics (the sandbox's trace endpoint). */
  trace_url: string | null;
  scored_at: string;
  /** For a failed or errored run, and every run of a flaky scenario: one shell command that re-runs it alone. */
  reproducer: string | null;
}

export interface ScenarioResult {
  scenario_id: string;
  index: number;
  /** Its matrix entry. */
  params: Params;
  /** In an experiment over a dataset: the record it ran (docs/datasets.md). */
  record?: ScenarioRecord;
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

export interface ResultContext {
  experiment: ExperimentChanged;
  plan: PinnedPlan;
  baseUrl: string;
  /** An experiment over a dataset: the params of the scenarios at hand (scenario-params.ts), by index. */
  scenarioParams?: ReadonlyMap<number, Params>;
}

/** A scenario's params: its matrix entry, or, over a dataset, its stored params; else its runs'. */
function paramsOf(ctx: ResultContext, index: number, rows: RunRow[]): Params {
  const planned = ctx.plan.dataset ? ctx.scenarioParams?.get(index) : ctx.plan.matrix?.[index];
  return planned ?? (rows.length > 0 ? (JSON.parse(rows[0].Params) as Params) : {});
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
    invariants: withOutputs(JSON.parse(row.Invariants) as InvariantScore[], row.checks),
    violations: JSON.parse(row.Violations) as Violation[],
    error: row.Error,
    wall_ms: Number(row.WallMs),
    cost_usd: traces.cost_usd,
    tokens: { input: traces.input_tokens, output: traces.output_tokens, cache_read: traces.cache_read_tokens, reasoning: traces.reasoning_tokens },
    llm_calls: traces.llm_calls,
    tool_calls: traces.tool_calls,
    tool_errors: traces.tool_errors,
    image: row.image === '' ? null : (JSON.parse(row.image) as RunImage),
    trace_url: row.SandboxId === null ? null : `${ctx.baseUrl}/v1/sandboxes/${row.SandboxId}/trace`,
    scored_at: iso(row.scored_ms)!,
    reproducer: withReproducer ? reproducer(ctx.baseUrl, ctx.experiment, { run_id: row.RunId, params, seed, agent_snapshot_id: row.AgentSnapshotId }) : null,
  };
}

/** The scores of a run's invariants, each with its check's output where the outcome kept one. */
function withOutputs(scores: InvariantScore[], checksJson: string): RunResult['invariants'] {
  const checks = checksJson === '' ? {} : (JSON.parse(checksJson) as Record<string, CheckResult>);
  return scores.map((score) => {
    const output = checks[score.name]?.output;
    return output ? { ...score, output } : score;
  });
}

export function scenarioResult(ctx: ResultContext, index: number, rows: RunRow[], traces: ReadonlyMap<string, RunTraceStats>): ScenarioResult {
  const passed = rows.filter((r) => r.Verdict === 'pass').length;
  const failed = rows.filter((r) => r.Verdict === 'fail').length;
  const completed = passed + failed;
  const verdict = rows.length === 0 ? null : scenarioVerdict(passed, failed);
  const params = paramsOf(ctx, index, rows);
  const record = scenarioRecord(params);
  const statsOf = (r: RunRow) => traces.get(r.RunId) ?? NO_TRACES;
  const walls = rows.filter((r) => r.Verdict !== 'error').map((r) => Number(r.WallMs));
  return {
    scenario_id: scenarioIdOf(ctx.experiment.experiment_id, index),
    index,
    params: matrixPart(params),
    ...(record && { record }),
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
export function scenarioIndices(plan: PinnedPlan, withRuns: Iterable<number>): number[] {
  const indices = new Set<number>(withRuns);
  for (let i = 0; i < (plan.scenarios ?? 0); i++) indices.add(i);
  return [...indices].sort((a, b) => a - b);
}

export function byIndex(rows: RunRow[]): Map<number, RunRow[]> {
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
  return {
    run_id: row.RunId,
    scenario_index: Number(row.ScenarioIndex),
    params: row.Params,
    verdict: row.Verdict,
    wall_ms: Number(row.WallMs),
    violations: (JSON.parse(row.Violations) as unknown[]).length,
  };
}

function agentSummary(experiment: ExperimentChanged) {
  if (experiment.agent === null) return null;
  const agent = JSON.parse(experiment.agent) as ResolvedAgent;
  return { snapshot_id: agent.snapshot_id, name: agent.name, version: agent.version, digest: agent.digest };
}

/** The experiment with how it runs: the summary plus options, agent, scoring and metrics. */
export function experimentDetail(experiment: ExperimentChanged, plan: PinnedPlan, metrics: ExperimentMetrics) {
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

export type ExperimentDetail = ReturnType<typeof experimentDetail>;

export type RunResults = ExperimentDetail & { scenarios: ScenarioResult[] };

/** GET /v1/experiments/:id. */
export async function runResults(store: Store, experiment: ExperimentChanged, plan: PinnedPlan, baseUrl: string): Promise<RunResults> {
  const { tenant, experiment_id: id } = experiment;
  const [rows, traces, params] = await Promise.all([
    loadRuns(store, tenant, id, null),
    runTraceStats(store, tenant, id),
    plan.dataset ? scenarioParams(store, tenant, id, null) : undefined,
  ]);
  const groups = byIndex(rows);
  const ctx = { experiment, plan, baseUrl, scenarioParams: params };
  const metrics = computeMetrics(id, rows.map(fact), traces, plan.scoring.replica_aggregation);
  return {
    ...experimentDetail(experiment, plan, metrics),
    scenarios: scenarioIndices(plan, groups.keys()).map((i) => scenarioResult(ctx, i, groups.get(i) ?? [], traces)),
  };
}
