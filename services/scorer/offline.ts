/**
 * Offline scoring (docs/scoring.md): score rules applied to the stored runs of an experiment, read
 * from ClickHouse (`run_scores`, the latest score of every run with its RunOutcome, and the trace
 * totals of `trace_events`), with no agent run again.
 *
 * - `llm_as_judge`: the judge grades the run's agent output or diff by the rule's rubric; it
 *   passes at >= the rule's threshold. A judge failure is recorded as such (judge_failure, score
 *   null), never as a 0.
 * - `threshold`: `<metric> <op> <value>` over the run's metrics (RUN_METRICS): 1 when it holds,
 *   0 when not; a run without that metric (a composite of a run in error, an exit code of an
 *   agent that never ran) is not graded (score null, error says why).
 * - `rescore`: the spec's own scoring applied again to the stored check results (after a judge
 *   outage, say): its score is the new composite, and the new RunScore supersedes the run's.
 */
import { NO_TRACES } from '../domain/experiment-metrics.ts';
import { runTraceStats } from '../queries/run-facts.ts';
import type { InvariantScore, RunOutcome, RunScore, Violation } from '../domain/events/run-events.ts';
import { holds, parseRunCondition, type RunMetric, type ScoreRule, type StoredRun } from '../domain/score-rules.ts';
import type { ScoreRecorded } from '../domain/events/score-events.ts';
import type { SpecDocument } from '../domain/spec.ts';
import type { Store } from '../kernel/store/store.ts';
import type { Judge } from './judge.ts';
import { scoreRun } from './score.ts';

/** Runs read from the store at a time when an experiment is expanded. */
const RUN_PAGE = 500;

/** What one rule found about one run: a ScoreRecorded without the request's envelope. */
export type Grade = Pick<ScoreRecorded, 'rule_id' | 'rule_name' | 'rule_type' | 'score' | 'passed' | 'judge_failure' | 'reason' | 'details' | 'error'>;

interface RunRow {
  RunId: string;
  ScenarioId: string;
  ScenarioIndex: number;
  Replica: number;
  Attempt: number;
  Params: string;
  Seed: string;
  SandboxId: string | null;
  AgentSnapshotId: string | null;
  Verdict: string;
  Composite: number | null;
  Invariants: string;
  Violations: string;
  Error: string | null;
  WallMs: string;
  Outcome: string;
}

/** The stored runs of an experiment (the latest score of each), a page at a time, in run id order. */
export async function* storedRuns(store: Store, tenant: string, experimentId: string): AsyncGenerator<StoredRun[]> {
  const traces = await runTraceStats(store, tenant, experimentId);
  let after: string | null = null;
  for (;;) {
    const rows: RunRow[] = await store.query<RunRow>(
      `SELECT RunId, ScenarioId, ScenarioIndex, Replica, Attempt, Params, Seed, SandboxId, AgentSnapshotId, Verdict, Composite, Invariants, Violations, Error, WallMs, Outcome
       FROM run_scores FINAL
       WHERE TenantId = {tenant:String} AND ExperimentId = {experiment:String}${after === null ? '' : ' AND RunId > {after:String}'}
       ORDER BY RunId LIMIT {page:UInt32}`,
      { tenant, experiment: experimentId, page: RUN_PAGE, ...(after === null ? {} : { after }) },
    );
    if (rows.length === 0) return;
    yield rows.map((r) => ({
      run_id: r.RunId,
      scenario_id: r.ScenarioId,
      scenario_index: Number(r.ScenarioIndex),
      replica: Number(r.Replica),
      attempt: Number(r.Attempt),
      params: r.Params,
      seed: Number(r.Seed),
      sandbox_id: r.SandboxId,
      agent_snapshot_id: r.AgentSnapshotId,
      verdict: r.Verdict as StoredRun['verdict'],
      composite: r.Composite,
      invariants: r.Invariants,
      violations: r.Violations,
      error: r.Error,
      wall_ms: Number(r.WallMs),
      outcome: r.Outcome,
      traces: traces.get(r.RunId) ?? NO_TRACES,
    }));
    if (rows.length < RUN_PAGE) return;
    after = rows[rows.length - 1]!.RunId;
  }
}

/** The value of a run metric, or null when the run has none. */
function runMetric(run: StoredRun, outcome: RunOutcome, metric: RunMetric): number | null {
  const graded = run.verdict !== 'error';
  switch (metric) {
    case 'wall_ms':
      return run.wall_ms;
    case 'agent_ms':
      return outcome.agent?.duration_ms ?? null;
    case 'exit_code':
      return outcome.agent?.exit_code ?? null;
    case 'composite':
      return graded ? run.composite : null;
    case 'passed':
      return graded ? Number(run.verdict === 'pass') : null;
    case 'violations':
      return (JSON.parse(run.violations) as Violation[]).length;
    case 'invariants_failed':
      return graded ? (JSON.parse(run.invariants) as InvariantScore[]).filter((i) => !i.passed).length : null;
    case 'files_changed':
      return outcome.diff ? outcome.diff.added.length + outcome.diff.modified.length + outcome.diff.removed.length : null;
    case 'cost_usd':
      return run.traces.cost_usd;
    case 'llm_calls':
    case 'tool_calls':
    case 'tool_errors':
    case 'input_tokens':
    case 'output_tokens':
      return run.traces[metric];
  }
}

export interface GradedRun {
  grades: Grade[];
  /** The run's new score when a `rescore` rule applied (the spec's scoring, again). */
  rescored: RunScore | null;
}

/**
 * Every rule's grade of one stored run. `spec` is the run's spec (the experiment's pinned document
 * with its matrix entry), or the reason there is none.
 */
export async function gradeRun(rules: ScoreRule[], run: StoredRun, spec: SpecDocument | { error: string }, judge: Judge): Promise<GradedRun> {
  let outcome: RunOutcome;
  try {
    outcome = JSON.parse(run.outcome) as RunOutcome;
  } catch (err) {
    const error = `the run's stored outcome cannot be read: ${(err as Error).message}`;
    return { grades: rules.map((rule) => ({ ...base(rule), error })), rescored: null };
  }
  // One re-scoring however many rescore rules; it runs beside the judge calls of the others.
  const rescoring = rules.some((r) => r.type === 'rescore') && !('error' in spec) ? scoreRun(spec, outcome, judge) : null;
  const grades = await Promise.all(
    rules.map(async (rule): Promise<Grade> => {
      try {
        switch (rule.type) {
          case 'llm_as_judge':
            return await judgeRule(rule, outcome, judge);
          case 'threshold':
            return thresholdRule(rule, run, outcome);
          case 'rescore':
            return rescoring === null ? { ...base(rule), error: (spec as { error: string }).error } : rescoreGrade(rule, run, await rescoring);
        }
      } catch (err) {
        // Stored data this code cannot read (an older shape, say): that rule's grade says so.
        return { ...base(rule), error: `the run cannot be graded: ${(err as Error).message}` };
      }
    }),
  );
  return { grades, rescored: rescoring === null ? null : await rescoring.catch(() => null) };
}

/** A grade with nothing found yet. */
function base(rule: ScoreRule): Grade {
  return {
    rule_id: rule.id,
    rule_name: rule.name,
    rule_type: rule.type,
    score: null,
    passed: null,
    judge_failure: false,
    reason: '',
    details: '{}',
    error: null,
  };
}

async function judgeRule(rule: Extract<ScoreRule, { type: 'llm_as_judge' }>, outcome: RunOutcome, judge: Judge): Promise<Grade> {
  const input = rule.input === 'agent_output' ? (outcome.agent ? outcome.agent.stdout : null) : outcome.diff ? JSON.stringify(outcome.diff) : null;
  const asked = { input: rule.input, threshold: rule.threshold, ...(rule.model !== undefined && { model: rule.model }) };
  const details = JSON.stringify(asked);
  if (input === null)
    return { ...base(rule), details, error: `the run has no ${rule.input === 'agent_output' ? 'agent output' : 'diff'} to judge (it ended ${outcome.status})` };
  try {
    const grade = await judge({ rubric: rule.rubric, input, ...(rule.model !== undefined && { model: rule.model }) });
    return {
      ...base(rule),
      score: grade.score,
      passed: grade.score >= rule.threshold,
      reason: grade.reason,
      details: JSON.stringify({ ...asked, model: grade.model }),
    };
  } catch (err) {
    return { ...base(rule), judge_failure: true, details, error: `judge call failed: ${(err as Error).message}` };
  }
}

function thresholdRule(rule: Extract<ScoreRule, { type: 'threshold' }>, run: StoredRun, outcome: RunOutcome): Grade {
  const condition = parseRunCondition(rule.condition);
  const value = runMetric(run, outcome, condition.metric);
  const details = JSON.stringify({ condition: condition.text, metric: condition.metric, value });
  if (value === null) return { ...base(rule), details, error: `the run has no ${condition.metric} (verdict ${run.verdict}, ended ${outcome.status})` };
  const passed = holds(value, condition.operator, condition.value);
  return {
    ...base(rule),
    score: passed ? 1 : 0,
    passed,
    reason: `${condition.metric} is ${value}: "${condition.text}" ${passed ? 'holds' : 'does not hold'}`,
    details,
  };
}

function rescoreGrade(rule: ScoreRule, run: StoredRun, score: RunScore): Grade {
  return {
    ...base(rule),
    score: score.composite,
    passed: score.verdict === 'error' ? null : score.verdict === 'pass',
    judge_failure: score.invariants.some((i) => i.judge_failure === true),
    reason: `verdict ${run.verdict} -> ${score.verdict}`,
    details: JSON.stringify({ verdict: score.verdict, composite: score.composite, previous_verdict: run.verdict, previous_composite: run.composite }),
    error: score.error,
  };
}
