/**
 * The body of POST /v1/score-rules (docs/scoring.md): parsed and checked (every problem, each
 * naming its field, in one 400), then made into the rule's `svc.score-rules` event.
 */
import type { ScoreRuleChanged, ScoreRuleType } from '../../domain/events/score-events.ts';
import { JUDGE_RULE_INPUTS, type JudgeRuleInput, parseRunCondition, SCORE_RULE_TYPES, type ScoreRuleConfig } from '../../domain/score-rules.ts';
import { SPEC_ID } from '../../domain/spec.ts';
import { badRequest } from '../../kernel/errors.ts';
import { newEventId, newScoreRuleId } from '../../kernel/ids.ts';
import type { SpecCatalog } from '../catalogs/spec-catalog.ts';
import { type Bad, FieldProblems } from '../field-problems.ts';
import { specOrElse } from '../spec-lookup.ts';

const NAME_MAX = 200;
const RUBRIC_MAX = 20_000;
const MODEL_MAX = 200;
const COMMON_FIELDS = ['name', 'eval_id', 'type'];
const TYPE_FIELDS: Record<ScoreRuleType, string[]> = {
  llm_as_judge: ['rubric', 'input', 'threshold', 'model'],
  threshold: ['condition'],
  rescore: [],
};

export interface RuleRequest {
  name: string;
  eval_id: string | null;
  config: ScoreRuleConfig;
}

function judgeConfig(b: Record<string, unknown>, bad: Bad): ScoreRuleConfig {
  if (typeof b.rubric !== 'string' || b.rubric.trim() === '') bad('rubric', 'is required: what the judge rates, a non-empty string');
  else if (b.rubric.length > RUBRIC_MAX) bad('rubric', `must be at most ${RUBRIC_MAX} characters`);
  const input = (b.input ?? 'agent_output') as JudgeRuleInput;
  if (!JUDGE_RULE_INPUTS.includes(input)) bad('input', `must be one of ${JUDGE_RULE_INPUTS.join(', ')} (what of a stored run the judge reads)`);
  if (typeof b.threshold !== 'number' || !(b.threshold >= 0 && b.threshold <= 1))
    bad('threshold', 'is required: the judge score that passes, a number from 0 to 1');
  if (b.model !== undefined && (typeof b.model !== 'string' || b.model.trim() === '' || b.model.length > MODEL_MAX))
    bad('model', `must be a model name of 1 to ${MODEL_MAX} characters`);
  return {
    type: 'llm_as_judge',
    rubric: b.rubric as string,
    input,
    threshold: b.threshold as number,
    ...(b.model !== undefined && { model: b.model as string }),
  };
}

function thresholdConfig(condition: unknown, bad: Bad): ScoreRuleConfig {
  if (typeof condition !== 'string') {
    bad('condition', 'is required: "<metric> <operator> <number>", e.g. "wall_ms < 60000"');
  } else {
    try {
      return { type: 'threshold', condition: parseRunCondition(condition).text };
    } catch (err) {
      bad('condition', (err as Error).message);
    }
  }
  return { type: 'rescore' };
}

/** Every problem of a rule body, each naming its field, in one 400. */
export function parseRuleRequest(b: Record<string, unknown>): RuleRequest {
  const problems = new FieldProblems();
  const { bad } = problems;
  const type = b.type as ScoreRuleType;
  const typed = SCORE_RULE_TYPES.includes(type);
  if (!typed) bad('type', `is required: one of ${SCORE_RULE_TYPES.join(', ')}`);
  const accepted = [...COMMON_FIELDS, ...(typed ? TYPE_FIELDS[type] : Object.values(TYPE_FIELDS).flat())];
  for (const field of Object.keys(b))
    if (!accepted.includes(field)) bad(field, `unknown field${typed ? ` for type ${type}` : ''}; accepted: ${accepted.join(', ')}`);

  if (typeof b.name !== 'string' || b.name.trim() === '') bad('name', 'is required: a non-empty string');
  else if (b.name.length > NAME_MAX) bad('name', `must be at most ${NAME_MAX} characters`);
  if (b.eval_id !== undefined && b.eval_id !== null && (typeof b.eval_id !== 'string' || !SPEC_ID.test(b.eval_id)))
    bad('eval_id', 'must be a spec id, or null for a rule of every experiment');

  const config = type === 'llm_as_judge' ? judgeConfig(b, bad) : type === 'threshold' ? thresholdConfig(b.condition, bad) : { type: 'rescore' as const };
  problems.throwIfAny();
  return { name: (b.name as string).trim(), eval_id: (b.eval_id as string | null | undefined) ?? null, config };
}

/** The new rule's event (its id derived from an idempotent request's `seed`); a 400 naming eval_id when the tenant has no spec of that id. */
export function newScoreRule(specs: SpecCatalog, tenant: string, request: RuleRequest, seed: string | null = null): ScoreRuleChanged {
  if (request.eval_id !== null) {
    const evalId = request.eval_id;
    specOrElse(specs, tenant, evalId, undefined, () =>
      badRequest('eval_id', `no spec "${evalId}" of yours exists (the rule is scoped to experiments of that spec)`),
    );
  }
  const now = Date.now();
  const { type, ...fields } = request.config;
  return {
    tenant,
    event_id: newEventId(),
    ts: now,
    rule_id: newScoreRuleId(seed),
    name: request.name,
    eval_id: request.eval_id,
    type,
    config: JSON.stringify(fields),
    created_at: now,
  };
}
