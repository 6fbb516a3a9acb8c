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
import type { RunScored } from './events/run-events.ts';
import type { ComparisonOperator, Condition } from './spec.ts';
import type { ScoreRuleChanged, ScoreRuleType } from './events/score-events.ts';

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

export function ruleFromEvent(e: ScoreRuleChanged): ScoreRule {
  return {
    id: e.rule_id,
    name: e.name,
    eval_id: e.eval_id,
    created_at: new Date(e.created_at).toISOString(),
    ...JSON.parse(e.config),
    type: e.type,
  } as ScoreRule;
}

/** A stored run as offline scoring reads it: its row of run_scores and its trace totals. */
export type StoredRun = Omit<RunScored, 'tenant' | 'event_id' | 'ts' | 'experiment_id' | 'traces'> & { traces: RunTraceStats };

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
  if (!m)
    throw new Error(`must be "<metric> <operator> <number>" with an operator among <, <=, >, >=, ==, != (e.g. "wall_ms < 60000"), got ${JSON.stringify(text)}`);
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
