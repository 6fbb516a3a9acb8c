/**
 * Event shapes of svc.score-rules (entity), svc.score-requests and svc.scores: offline scoring (docs/scoring.md).
 * The .avsc files in schemas/ are the source of truth; these types follow them.
 */

/** How a score rule grades (docs/scoring.md). */
export type ScoreRuleType = 'llm_as_judge' | 'threshold' | 'rescore';

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
