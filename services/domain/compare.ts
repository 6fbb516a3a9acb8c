/**
 * POST /v1/experiments/compare: a candidate experiment against a baseline, from the facts of
 * their runs (pure; the route reads them). Scenarios are paired by their matrix parameters
 * (docs/decisions.md, "Compare"); unpaired ones are listed apart and left out of the tests. At ALPHA:
 *
 *   pass_rate               Cochran–Mantel–Haenszel over completed runs (pass / fail), one
 *                           stratum per paired scenario, so replicas of one scenario add power
 *                           without mixing scenarios of different difficulty;
 *   side_effect_violations  the same test on "the run had a violation";
 *   mean_wall_ms, mean_cost_per_run_usd, mean_tool_calls
 *                           Welch's t-test on the per-run values of the paired scenarios;
 *   each paired scenario    the same CMH test on its single stratum.
 *
 * A metric or scenario regressed when its test is significant and its effect points the bad way.
 * The other metrics are reported without a test. docs/experiments.md explains it for users.
 */
import { computeMetrics, NO_TRACES, tallyScenarios, type ExperimentMetrics, type RunFact, type RunTraceStats } from './experiment-metrics.ts';
import { scenarioIdOf } from '../kernel/ids.ts';
import type { Params } from './params.ts';
import { cochranMantelHaenszel, welchTTest, type ReplicaAggregation, type ScenarioVerdict, type Table2x2 } from './stats.ts';

const ALPHA = 0.05;

export interface CompareSide {
  experiment_id: string;
  runs: readonly RunFact[];
  traces: ReadonlyMap<string, RunTraceStats>;
  aggregation: ReplicaAggregation;
}

type MetricName = Exclude<keyof ExperimentMetrics, 'experiment_id' | 'counts' | 'runs' | 'completed_runs'>;

interface MetricRule {
  name: MetricName;
  better: 'higher' | 'lower';
  test: 'cmh' | 'welch' | null;
}

const METRICS: MetricRule[] = [
  { name: 'pass_rate', better: 'higher', test: 'cmh' },
  { name: 'mean_wall_ms', better: 'lower', test: 'welch' },
  { name: 'p95_wall_ms', better: 'lower', test: null },
  { name: 'total_cost_usd', better: 'lower', test: null },
  { name: 'mean_cost_per_run_usd', better: 'lower', test: 'welch' },
  { name: 'tool_success_rate', better: 'higher', test: null },
  { name: 'side_effect_violations', better: 'lower', test: 'cmh' },
  { name: 'mean_tool_calls', better: 'lower', test: 'welch' },
];

export interface MetricComparison {
  name: MetricName;
  baseline: number;
  candidate: number;
  /** candidate − baseline */
  delta: number;
  direction: 'better' | 'worse' | 'same';
  better: 'higher' | 'lower';
  test: 'cmh' | 'welch' | null;
  p_value: number | null;
  regressed: boolean;
}

interface Side {
  scenario_id: string;
  passed: number;
  failed: number;
  errored: number;
  verdict: ScenarioVerdict;
}

export interface ScenarioComparison {
  params: Params;
  baseline: Side;
  candidate: Side;
  p_value: number;
  regressed: boolean;
}

export interface Comparison {
  baseline_id: string;
  candidate_id: string;
  regressed: boolean;
  /** Metric names, then `scenario <params JSON>` for each scenario that regressed. */
  regressions: string[];
  alpha: number;
  metrics: MetricComparison[];
  /** Metrics one side has no value for (nothing to average), so no comparison. */
  not_comparable: MetricName[];
  scenarios: ScenarioComparison[];
  unpaired: { baseline: Array<{ scenario_id: string; params: Params }>; candidate: Array<{ scenario_id: string; params: Params }> };
}

/** Parameters as a canonical string: keys sorted, so {a, b} and {b, a} pair. */
export function paramsKey(params: Params): string {
  return JSON.stringify(Object.fromEntries(Object.entries(params).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))));
}

interface ScenarioRuns {
  index: number;
  params: Params;
  runs: RunFact[];
}

/** Scenarios by pairing key; two entries with equal parameters pair in index order (`#n`). */
function scenariosByKey(runs: readonly RunFact[]): Map<string, ScenarioRuns> {
  const byIndex = new Map<number, ScenarioRuns>();
  for (const run of runs) {
    const scenario = byIndex.get(run.scenario_index) ?? { index: run.scenario_index, params: JSON.parse(run.params) as Params, runs: [] };
    scenario.runs.push(run);
    byIndex.set(run.scenario_index, scenario);
  }
  const out = new Map<string, ScenarioRuns>();
  const seen = new Map<string, number>();
  for (const scenario of [...byIndex.values()].sort((a, b) => a.index - b.index)) {
    const key = paramsKey(scenario.params);
    const n = (seen.get(key) ?? 0) + 1;
    seen.set(key, n);
    out.set(n === 1 ? key : `${key}#${n}`, scenario);
  }
  return out;
}

const completed = (runs: readonly RunFact[]) => runs.filter((r) => r.verdict !== 'error');
const count = (runs: readonly RunFact[], predicate: (r: RunFact) => boolean) => runs.filter(predicate).length;

/** A 2x2 stratum: baseline (a: yes, b: no) against candidate (c: yes, d: no). */
function table(baseline: readonly RunFact[], candidate: readonly RunFact[], yes: (r: RunFact) => boolean): Table2x2 {
  const a = count(baseline, yes);
  const c = count(candidate, yes);
  return { a, b: baseline.length - a, c, d: candidate.length - c };
}

function direction(delta: number, better: 'higher' | 'lower', scale: number): MetricComparison['direction'] {
  if (Math.abs(delta) <= 1e-12 * Math.max(1, Math.abs(scale))) return 'same';
  return (delta > 0) === (better === 'higher') ? 'better' : 'worse';
}

export function compareExperiments(baseline: CompareSide, candidate: CompareSide, alpha = ALPHA): Comparison {
  const baseScenarios = scenariosByKey(baseline.runs);
  const candScenarios = scenariosByKey(candidate.runs);
  const pairs = [...baseScenarios.entries()].filter(([key]) => candScenarios.has(key)).map(([key, base]) => ({ base, cand: candScenarios.get(key)! }));
  const unpaired = (mine: Map<string, ScenarioRuns>, theirs: Map<string, ScenarioRuns>, experimentId: string) =>
    [...mine.entries()].filter(([key]) => !theirs.has(key)).map(([, s]) => ({ scenario_id: scenarioIdOf(experimentId, s.index), params: s.params }));

  const passed = (r: RunFact) => r.verdict === 'pass';
  const violated = (r: RunFact) => r.violations > 0;
  const pairedRuns = (side: 'base' | 'cand') => pairs.flatMap((p) => completed(p[side].runs));
  const perRun = (side: 'base' | 'cand', traces: ReadonlyMap<string, RunTraceStats>, value: (r: RunFact, t: RunTraceStats) => number) =>
    pairedRuns(side).map((r) => value(r, traces.get(r.run_id) ?? NO_TRACES));

  // Each test: its p-value and whether its effect points at the candidate being worse.
  const cmh = (yes: (r: RunFact) => boolean, worseWhenFewer: boolean) => {
    const result = cochranMantelHaenszel(pairs.map((p) => table(completed(p.base.runs), completed(p.cand.runs), yes)));
    return { p: result.p_value, worse: worseWhenFewer ? result.excess > 0 : result.excess < 0 };
  };
  const welch = (value: (r: RunFact, t: RunTraceStats) => number) => {
    const result = welchTTest(perRun('base', baseline.traces, value), perRun('cand', candidate.traces, value));
    // Every Welch metric here is better lower: worse when the candidate's mean is higher.
    return result === null ? null : { p: result.p_value, worse: result.mean_b > result.mean_a };
  };
  const tests: Partial<Record<MetricName, { p: number; worse: boolean } | null>> = {
    pass_rate: cmh(passed, true),
    side_effect_violations: cmh(violated, false),
    mean_wall_ms: welch((r) => r.wall_ms),
    mean_cost_per_run_usd: welch((_r, t) => t.cost_usd),
    mean_tool_calls: welch((_r, t) => t.tool_calls),
  };

  const baseMetrics = computeMetrics(baseline.experiment_id, baseline.runs, baseline.traces, baseline.aggregation);
  const candMetrics = computeMetrics(candidate.experiment_id, candidate.runs, candidate.traces, candidate.aggregation);
  const metrics: MetricComparison[] = [];
  const notComparable: MetricName[] = [];
  for (const rule of METRICS) {
    const b = baseMetrics[rule.name];
    const c = candMetrics[rule.name];
    if (b === null || c === null) {
      notComparable.push(rule.name);
      continue;
    }
    const test = rule.test === null ? null : (tests[rule.name] ?? null);
    metrics.push({
      name: rule.name,
      baseline: b,
      candidate: c,
      delta: c - b,
      direction: direction(c - b, rule.better, b),
      better: rule.better,
      test: rule.test,
      p_value: test?.p ?? null,
      regressed: test !== null && test.p < alpha && test.worse,
    });
  }

  const aggregationOf = (side: CompareSide, s: ScenarioRuns) => tallyScenarios(s.runs, side.aggregation)[0];
  const sideOf = (side: CompareSide, s: ScenarioRuns): Side => {
    const tally = aggregationOf(side, s);
    return { scenario_id: scenarioIdOf(side.experiment_id, s.index), passed: tally.passed, failed: tally.failed, errored: tally.errored, verdict: tally.verdict };
  };
  const scenarios = pairs.map(({ base, cand }): ScenarioComparison => {
    const result = cochranMantelHaenszel([table(completed(base.runs), completed(cand.runs), passed)]);
    return { params: base.params, baseline: sideOf(baseline, base), candidate: sideOf(candidate, cand), p_value: result.p_value, regressed: result.p_value < alpha && result.excess > 0 };
  });

  const regressions = [...metrics.filter((m) => m.regressed).map((m) => m.name), ...scenarios.filter((s) => s.regressed).map((s) => `scenario ${paramsKey(s.params)}`)];
  return {
    baseline_id: baseline.experiment_id,
    candidate_id: candidate.experiment_id,
    regressed: regressions.length > 0,
    regressions,
    alpha,
    metrics,
    not_comparable: notComparable,
    scenarios,
    unpaired: { baseline: unpaired(baseScenarios, candScenarios, baseline.experiment_id), candidate: unpaired(candScenarios, baseScenarios, candidate.experiment_id) },
  };
}
