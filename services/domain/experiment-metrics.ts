/**
 * The aggregate metrics of one experiment (GET /v1/metrics/experiments/:id, the aggregator's
 * snapshot at completion, the alert metrics of the spec), computed from the latest score of
 * every run (run_scores) and the trace events its sandbox reported (trace_events, tagged with the
 * experiment and, in ResourceAttributes, the run). docs/experiments.md defines each metric.
 * The reads of those tables are in queries/run-facts.ts.
 */
import { countsAsPassing, mean, quantile, scenarioVerdict, type ReplicaAggregation, type ScenarioVerdict } from './stats.ts';
import type { RunScore } from './events/run-events.ts';

export interface VerdictCounts {
  pass: number;
  fail: number;
  flaky: number;
  error: number;
}

export interface ExperimentMetrics {
  experiment_id: string;
  /** Scenarios counting as passing (replica_aggregation) over scenarios with a completed run; null when none has one. */
  pass_rate: number | null;
  /** Over completed runs; null when there is none. */
  mean_wall_ms: number | null;
  p95_wall_ms: number | null;
  /** Every run's model cost, errored runs included: what the experiment spent. */
  total_cost_usd: number;
  /** Over completed runs; null when there is none. */
  mean_cost_per_run_usd: number | null;
  /** Tool calls with status ok over all tool calls of completed runs; null when there was none. */
  tool_success_rate: number | null;
  /** Forbidden-rule violations over every run. */
  side_effect_violations: number;
  /** Tool calls per completed run; null when there is none. */
  mean_tool_calls: number | null;
  /** Scenarios by verdict (scenarios without a scored run are not counted). */
  counts: VerdictCounts;
  /** Scored runs, and those of them that completed (not `error`). */
  runs: number;
  completed_runs: number;
}

/** What the traces of one run add up to. */
export interface RunTraceStats {
  cost_usd: number;
  input_tokens: number;
  output_tokens: number;
  cache_read_tokens: number;
  reasoning_tokens: number;
  llm_calls: number;
  /** tool_use / tool_call spans, a span's start and end counted once (by its end). */
  tool_calls: number;
  tool_errors: number;
}

export const NO_TRACES: RunTraceStats = {
  cost_usd: 0,
  input_tokens: 0,
  output_tokens: 0,
  cache_read_tokens: 0,
  reasoning_tokens: 0,
  llm_calls: 0,
  tool_calls: 0,
  tool_errors: 0,
};

/** The facts of one run the metrics need. */
export interface RunFact {
  run_id: string;
  scenario_index: number;
  /** The run's matrix entry (Params JSON). */
  params: string;
  verdict: RunScore['verdict'];
  wall_ms: number;
  violations: number;
}

export interface ScenarioTally {
  index: number;
  passed: number;
  failed: number;
  errored: number;
  verdict: ScenarioVerdict;
  passing: boolean;
}

/** Each scenario's verdict and replica-aggregation decision, from its runs' verdicts, by index. */
export function tallyScenarios(runs: ReadonlyArray<Pick<RunFact, 'scenario_index' | 'verdict'>>, aggregation: ReplicaAggregation): ScenarioTally[] {
  const byIndex = new Map<number, { passed: number; failed: number; errored: number }>();
  for (const run of runs) {
    const tally = byIndex.get(run.scenario_index) ?? { passed: 0, failed: 0, errored: 0 };
    if (run.verdict === 'pass') tally.passed++;
    else if (run.verdict === 'fail') tally.failed++;
    else tally.errored++;
    byIndex.set(run.scenario_index, tally);
  }
  return [...byIndex.entries()]
    .sort(([a], [b]) => a - b)
    .map(([index, t]) => ({ index, ...t, verdict: scenarioVerdict(t.passed, t.failed), passing: countsAsPassing(aggregation, t.passed, t.passed + t.failed) }));
}

function verdictCounts(scenarios: ReadonlyArray<{ verdict: ScenarioVerdict | null }>): VerdictCounts {
  const counts: VerdictCounts = { pass: 0, fail: 0, flaky: 0, error: 0 };
  for (const s of scenarios) if (s.verdict !== null) counts[s.verdict]++;
  return counts;
}

/** The experiment pass rate: scenarios counting as passing over scenarios with a completed run. */
export function passRate(scenarios: ReadonlyArray<{ verdict: ScenarioVerdict | null; passing: boolean }>): number | null {
  const graded = scenarios.filter((s) => s.verdict !== null && s.verdict !== 'error');
  return graded.length === 0 ? null : graded.filter((s) => s.passing).length / graded.length;
}

/** The metrics from the runs' facts and trace totals (pure: compare uses it on data it already read). */
export function computeMetrics(
  experimentId: string,
  runs: readonly RunFact[],
  traces: ReadonlyMap<string, RunTraceStats>,
  aggregation: ReplicaAggregation,
): ExperimentMetrics {
  const scenarios = tallyScenarios(runs, aggregation);
  const completed = runs.filter((r) => r.verdict !== 'error');
  const stats = completed.map((r) => traces.get(r.run_id) ?? NO_TRACES);
  const toolCalls = stats.reduce((sum, s) => sum + s.tool_calls, 0);
  const toolErrors = stats.reduce((sum, s) => sum + s.tool_errors, 0);
  const walls = completed.map((r) => r.wall_ms);
  return {
    experiment_id: experimentId,
    pass_rate: passRate(scenarios),
    mean_wall_ms: walls.length === 0 ? null : mean(walls),
    p95_wall_ms: quantile(walls, 0.95),
    total_cost_usd: [...traces.values()].reduce((sum, s) => sum + s.cost_usd, 0),
    mean_cost_per_run_usd: stats.length === 0 ? null : mean(stats.map((s) => s.cost_usd)),
    tool_success_rate: toolCalls === 0 ? null : (toolCalls - toolErrors) / toolCalls,
    side_effect_violations: runs.reduce((sum, r) => sum + r.violations, 0),
    mean_tool_calls: completed.length === 0 ? null : toolCalls / completed.length,
    counts: verdictCounts(scenarios),
    runs: runs.length,
    completed_runs: completed.length,
  };
}
