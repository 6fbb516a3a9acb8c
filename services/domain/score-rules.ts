/**
 * Score rules and offline scoring (docs/scoring.md): graders applied to the STORED runs of an
 * experiment, without running any agent again. The shapes the api and the scorer exchange:
 *
 *   api    POST /v1/score-rules                -> svc.score-rules    (ScoreRuleChanged; a tombstone deletes)
 *   api    POST /v1/experiments/:id/score      -> svc.score-requests (ScoreRequested, run null: a whole experiment)
 *   scorer expands it over the stored runs     -> svc.score-requests (ScoreRequested, one per run)
 *   scorer grades one run by every rule        -> svc.scores         (ScoreRecorded, one per rule and run)
 *                                                 svc.run-scores     (RunScored, for a `rescore` rule)
 *
 * A request carries the rules themselves, so a rule deleted or changed meanwhile does not change
 * a scoring already asked for.
 */
import type { RunTraceStats } from './experiment-metrics.ts';
import type { RunScored } from './runs.ts';
import type { ComparisonOperator, Condition } from './spec.ts';

export type ScoreRuleType = 'llm_as_judge' | 'threshold' | 'rescore';
export const SCORE_RULE_TYPES: readonly ScoreRuleType[] = ['llm_as_judge', 'threshold', 'rescore'];

/** What an `llm_as_judge` rule reads of a stored run. */
export type JudgeRuleInput = 'agent_output' | 'diff';
export const JUDGE_RULE_INPUTS: readonly JudgeRuleInput[] = ['agent_output', 'diff'];

/** The type-specific fields of a rule. */
export type ScoreRuleConfig =
  | { type: 'llm_as_judge'; rubric: string; input: JudgeRuleInput; threshold: number; model?: string }
  | { type: 'threshold'; condition: string }
  | { type: 'rescore' };

/** A score rule as the API shows it: the common fields beside the type's own. */
export type ScoreRule = {
  id: string;
  name: string;
  /** The spec id it is scoped to; null: it applies to every experiment of the tenant. */
  eval_id: string | null;
  created_at: string;
} & ScoreRuleConfig;

/** A value of svc.score-rules (schemas/score-rule-changed.avsc), keyed by rule id. */
export interface ScoreRuleChanged {
  tenant: string;
  event_id: string;
  ts: number;
  rule_id: string;
  name: string;
  eval_id: string | null;
  type: ScoreRuleType;
  /** ScoreRuleConfig without its `type`, as JSON. */
  config: string;
  created_at: number;
}

export function ruleFromEvent(e: ScoreRuleChanged): ScoreRule {
  return { id: e.rule_id, name: e.name, eval_id: e.eval_id, created_at: new Date(e.created_at).toISOString(), ...JSON.parse(e.config), type: e.type } as ScoreRule;
}

/** A stored run as offline scoring reads it: its row of run_scores and its trace totals. */
export type StoredRun = Omit<RunScored, 'tenant' | 'event_id' | 'ts' | 'experiment_id'> & { traces: RunTraceStats };

/** A value of svc.score-requests (schemas/score-requested.avsc). */
export interface ScoreRequested {
  tenant: string;
  event_id: string;
  ts: number;
  /** Names one POST /v1/experiments/:id/score; every record it produces carries it. */
  request_id: string;
  experiment_id: string;
  /** ScoreRule[] as JSON. */
  rules: string;
  /** A StoredRun as JSON; null asks for every stored run of the experiment. */
  run: string | null;
}

/** A value of svc.scores (schemas/score-recorded.avsc): one rule's grade of one run. */
export interface ScoreRecorded {
  tenant: string;
  event_id: string;
  ts: number;
  request_id: string;
  experiment_id: string;
  scenario_id: string;
  scenario_index: number;
  run_id: string;
  replica: number;
  rule_id: string;
  rule_name: string;
  rule_type: ScoreRuleType;
  /** In [0, 1]; null when the run could not be graded by this rule (see error). */
  score: number | null;
  passed: boolean | null;
  /** True when the judge could not be reached or answered nonsense: infrastructure, not a 0. */
  judge_failure: boolean;
  reason: string;
  /** Type-specific facts as JSON (docs/scoring.md). */
  details: string;
  error: string | null;
}

/** The per-run metrics a `threshold` rule's condition may name, with what each measures. */
export const RUN_METRICS = {
  wall_ms: 'the run from sandbox creation to the end of its checks, in ms',
  agent_ms: 'the agent process, in ms',
  exit_code: "the agent's exit code",
  composite: 'the composite score (none for a run in error)',
  passed: '1 when the run passed, 0 when it failed (none for a run in error)',
  violations: 'forbidden-rule violations',
  invariants_failed: 'invariants that did not pass',
  files_changed: 'files added, modified or removed in the workspace',
  cost_usd: "the model cost the run's traces report",
  llm_calls: 'model calls in its traces',
  tool_calls: 'tool calls in its traces',
  tool_errors: 'tool calls with status error',
  input_tokens: 'model input tokens',
  output_tokens: 'model output tokens',
} as const;
export type RunMetric = keyof typeof RUN_METRICS;

const CONDITION = /^\s*([a-z_][a-z0-9_]*)\s*(<=|>=|==|!=|<|>)\s*(-?\d+(?:\.\d+)?)\s*$/;

/** `<metric> <operator> <number>` over RUN_METRICS; throws an Error saying what is wrong. */
export function parseRunCondition(text: string): Condition & { metric: RunMetric } {
  const m = CONDITION.exec(text);
  if (!m) throw new Error(`must be "<metric> <operator> <number>" with an operator among <, <=, >, >=, ==, != (e.g. "wall_ms < 60000"), got ${JSON.stringify(text)}`);
  const [, metric, operator, value] = m;
  if (!Object.hasOwn(RUN_METRICS, metric)) throw new Error(`unknown metric "${metric}"; one of ${Object.keys(RUN_METRICS).join(', ')}`);
  return { text: text.trim(), metric: metric as RunMetric, operator: operator as ComparisonOperator, value: Number(value) };
}

export function holds(actual: number, operator: ComparisonOperator, expected: number): boolean {
  switch (operator) {
    case '<':
      return actual < expected;
    case '<=':
      return actual <= expected;
    case '>':
      return actual > expected;
    case '>=':
      return actual >= expected;
    case '==':
      return actual === expected;
    case '!=':
      return actual !== expected;
  }
}
