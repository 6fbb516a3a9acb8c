/**
 * Score rules and offline scoring (docs/scoring.md): rules are created, listed and deleted here
 * (svc.score-rules); `POST /v1/experiments/:id/score` enqueues the scoring of a completed
 * experiment's stored runs (svc.score-requests, carried out by the scorer) and answers 202 at
 * once; the score records it produces are read from ClickHouse (`scores`, latest per rule and run).
 */
import Router from '@koa/router';
import type { Context } from 'koa';
import { publish, type Kernel } from '../../kernel/actor.ts';
import type { Principal } from '../../kernel/auth.ts';
import { AppError, badRequest } from '../../kernel/errors.ts';
import { newEventId, newScoreRuleId } from '../../kernel/ids.ts';
import { JUDGE_RULE_INPUTS, type JudgeRuleInput, parseRunCondition, ruleFromEvent, SCORE_RULE_TYPES, type ScoreRuleConfig } from '../../domain/score-rules.ts';
import type { ScoreRequested, ScoreRuleChanged, ScoreRuleType } from '../../domain/events/score-events.ts';
import { SPEC_ID } from '../../domain/spec.ts';
import type { Store } from '../../kernel/store/store.ts';
import { TOPICS } from '../../kernel/topics.ts';
import type { ExperimentCatalog } from '../catalogs/experiment-catalog.ts';
import { checkQueryParams, decodeCursor, encodeCursor, ndjsonStream, parseLimit, wantsNdjson } from '../pagination.ts';
import type { ScoreRuleCatalog } from '../catalogs/score-rule-catalog.ts';
import type { SpecCatalog } from '../catalogs/spec-catalog.ts';
import { jsonBody } from '../request-body.ts';

const NAME_MAX = 200;
const RUBRIC_MAX = 20_000;
const MODEL_MAX = 200;
const RULE_IDS_MAX = 100;
const COMMON_FIELDS = ['name', 'eval_id', 'type'];
const TYPE_FIELDS: Record<ScoreRuleType, string[]> = {
  llm_as_judge: ['rubric', 'input', 'threshold', 'model'],
  threshold: ['condition'],
  rescore: [],
};


interface RuleRequest {
  name: string;
  eval_id: string | null;
  config: ScoreRuleConfig;
}

/** Every problem of a rule body, each naming its field, in one 400. */
function parseRuleRequest(b: Record<string, unknown>): RuleRequest {
  const problems: string[] = [];
  const bad = (field: string, problem: string) => problems.push(`${field}: ${problem}`);
  const type = b.type as ScoreRuleType;
  const typed = SCORE_RULE_TYPES.includes(type);
  if (!typed) bad('type', `is required: one of ${SCORE_RULE_TYPES.join(', ')}`);
  const accepted = [...COMMON_FIELDS, ...(typed ? TYPE_FIELDS[type] : Object.values(TYPE_FIELDS).flat())];
  for (const field of Object.keys(b)) if (!accepted.includes(field)) bad(field, `unknown field${typed ? ` for type ${type}` : ''}; accepted: ${accepted.join(', ')}`);

  if (typeof b.name !== 'string' || b.name.trim() === '') bad('name', 'is required: a non-empty string');
  else if (b.name.length > NAME_MAX) bad('name', `must be at most ${NAME_MAX} characters`);
  if (b.eval_id !== undefined && b.eval_id !== null && (typeof b.eval_id !== 'string' || !SPEC_ID.test(b.eval_id))) bad('eval_id', 'must be a spec id, or null for a rule of every experiment');

  let config: ScoreRuleConfig = { type: 'rescore' };
  if (type === 'llm_as_judge') {
    if (typeof b.rubric !== 'string' || b.rubric.trim() === '') bad('rubric', 'is required: what the judge rates, a non-empty string');
    else if (b.rubric.length > RUBRIC_MAX) bad('rubric', `must be at most ${RUBRIC_MAX} characters`);
    const input = (b.input ?? 'agent_output') as JudgeRuleInput;
    if (!JUDGE_RULE_INPUTS.includes(input)) bad('input', `must be one of ${JUDGE_RULE_INPUTS.join(', ')} (what of a stored run the judge reads)`);
    if (typeof b.threshold !== 'number' || !(b.threshold >= 0 && b.threshold <= 1)) bad('threshold', 'is required: the judge score that passes, a number from 0 to 1');
    if (b.model !== undefined && (typeof b.model !== 'string' || b.model.trim() === '' || b.model.length > MODEL_MAX)) bad('model', `must be a model name of 1 to ${MODEL_MAX} characters`);
    config = { type, rubric: b.rubric as string, input, threshold: b.threshold as number, ...(b.model !== undefined && { model: b.model as string }) };
  } else if (type === 'threshold') {
    if (typeof b.condition !== 'string') bad('condition', 'is required: "<metric> <operator> <number>", e.g. "wall_ms < 60000"');
    else {
      try {
        config = { type, condition: parseRunCondition(b.condition).text };
      } catch (err) {
        bad('condition', (err as Error).message);
      }
    }
  }
  if (problems.length > 0) throw new AppError('bad_request', problems.join('; '));
  return { name: (b.name as string).trim(), eval_id: (b.eval_id as string | null | undefined) ?? null, config };
}

interface ScoreRow {
  RuleId: string;
  RunId: string;
  ScenarioId: string;
  ScenarioIndex: number;
  Replica: number;
  RuleName: string;
  RuleType: string;
  RequestId: string;
  Graded: number;
  Score: number;
  Passed: number;
  JudgeFailure: number;
  Reason: string;
  Details: string;
  Error: string;
  scored_ms: string;
}

/** One page of an experiment's score records in (rule, scenario, replica, run) order, and the key after it. */
async function scorePage(store: Store, tenant: string, experimentId: string, ruleId: string | null, after: string[] | null, limit: number) {
  const rows = await store.query<ScoreRow>(
    `SELECT RuleId, RunId, ScenarioId, ScenarioIndex, Replica, RuleName, RuleType, RequestId, Graded, Score, Passed, JudgeFailure, Reason, Details, Error,
            toUnixTimestamp64Milli(ScoredAt) AS scored_ms
     FROM scores FINAL
     WHERE TenantId = {tenant:String} AND ExperimentId = {experiment:String}
       ${ruleId === null ? '' : 'AND RuleId = {rule:String}'}
       ${after === null ? '' : 'AND (RuleId, ScenarioIndex, Replica, RunId) > ({after_rule:String}, {after_index:UInt32}, {after_replica:UInt32}, {after_run:String})'}
     ORDER BY RuleId, ScenarioIndex, Replica, RunId
     LIMIT {limit:UInt32}`,
    {
      tenant,
      experiment: experimentId,
      limit: limit + 1,
      ...(ruleId === null ? {} : { rule: ruleId }),
      ...(after === null ? {} : { after_rule: after[0], after_index: Number(after[1]), after_replica: Number(after[2]), after_run: after[3] }),
    },
  );
  const items = rows.slice(0, limit).map((r) => ({
    experiment_id: experimentId,
    rule_id: r.RuleId,
    rule_name: r.RuleName,
    rule_type: r.RuleType,
    run_id: r.RunId,
    scenario_id: r.ScenarioId,
    replica: Number(r.Replica),
    score: r.Graded === 1 ? r.Score : null,
    passed: r.Graded === 1 ? r.Passed === 1 : null,
    judge_failure: r.JudgeFailure === 1,
    reason: r.Reason,
    details: JSON.parse(r.Details) as unknown,
    error: r.Error === '' ? null : r.Error,
    request_id: r.RequestId,
    scored_at: new Date(Number(r.scored_ms)).toISOString(),
  }));
  const last = rows.length > limit ? rows[limit - 1]! : null;
  return { items, next: last ? encodeCursor([last.RuleId, String(last.ScenarioIndex), String(last.Replica), last.RunId]) : null };
}

function scoreCursor(raw: unknown): string[] | null {
  const key = decodeCursor(raw, 4);
  if (key && (!/^\d+$/.test(key[1]!) || !/^\d+$/.test(key[2]!))) throw badRequest('cursor', 'is not a cursor returned by this endpoint');
  return key;
}

export function scoringRouter(deps: { kernel: Kernel; specs: SpecCatalog; experiments: ExperimentCatalog; rules: ScoreRuleCatalog }): Router {
  const { kernel, specs, experiments, rules } = deps;
  const { config, store } = kernel;
  const router = new Router();
  const principal = (ctx: Context) => ctx.state.principal as Principal;

  router.post('/v1/score-rules', async (ctx) => {
    const p = principal(ctx);
    const request = parseRuleRequest(jsonBody(ctx));
    if (request.eval_id !== null) {
      try {
        specs.get(p.tenant, request.eval_id);
      } catch (err) {
        if (err instanceof AppError && err.code === 'not_found') throw badRequest('eval_id', `no spec "${request.eval_id}" of yours exists (the rule is scoped to experiments of that spec)`);
        throw err;
      }
    }
    const now = Date.now();
    const { type, ...fields } = request.config;
    const rule: ScoreRuleChanged = { tenant: p.tenant, event_id: newEventId(), ts: now, rule_id: newScoreRuleId(), name: request.name, eval_id: request.eval_id, type, config: JSON.stringify(fields), created_at: now };
    await rules.put(rule);
    ctx.status = 201;
    ctx.body = ruleFromEvent(rule);
  });

  router.get('/v1/score-rules', (ctx) => {
    checkQueryParams(ctx, ['eval_id']);
    const evalId = ctx.query.eval_id as string | undefined;
    const items = rules
      .list(principal(ctx).tenant)
      .filter((r) => evalId === undefined || r.eval_id === evalId)
      .map(ruleFromEvent);
    ctx.body = { items, count: items.length };
  });

  router.get('/v1/score-rules/:id', (ctx) => {
    checkQueryParams(ctx, []);
    ctx.body = ruleFromEvent(rules.owned(principal(ctx), ctx.params.id));
  });

  router.delete('/v1/score-rules/:id', async (ctx) => {
    await rules.delete(rules.owned(principal(ctx), ctx.params.id));
    ctx.body = { id: ctx.params.id, deleted: true };
  });

  router.post('/v1/experiments/:id/score', async (ctx) => {
    const p = principal(ctx);
    const b = jsonBody(ctx);
    for (const field of Object.keys(b)) if (field !== 'rule_ids') throw badRequest(field, 'unknown field; accepted: rule_ids');
    const ids = b.rule_ids;
    if (ids !== undefined && (!Array.isArray(ids) || ids.length === 0 || ids.length > RULE_IDS_MAX || !ids.every((id) => typeof id === 'string' && id !== ''))) {
      throw badRequest('rule_ids', `must be a list of 1 to ${RULE_IDS_MAX} score rule ids (rule_...); leave it out to apply every rule of the experiment's spec and every global rule`);
    }
    const experiment = experiments.owned(p, ctx.params.id);
    if (experiment.status !== 'completed') {
      throw new AppError('conflict', `experiment ${experiment.experiment_id} is ${experiment.status}; only a completed experiment's runs are scored offline`);
    }
    const applies = (r: ScoreRuleChanged) => r.eval_id === null || r.eval_id === experiment.spec_id;
    let chosen: ScoreRuleChanged[];
    if (ids === undefined) {
      chosen = rules.list(p.tenant).filter(applies);
      if (chosen.length === 0) throw badRequest('rule_ids', `no score rule applies to experiment ${experiment.experiment_id} (none is global or scoped to spec "${experiment.spec_id}"); create one with POST /v1/score-rules`);
    } else {
      chosen = [...new Set(ids as string[])].map((id, i) => {
        const rule = rules.get(id);
        if (!rule) throw badRequest(`rule_ids[${i}]`, `no score rule ${id} exists`);
        if (rule.tenant !== p.tenant) throw new AppError('forbidden', `rule_ids[${i}]: score rule ${id} belongs to another tenant`);
        if (!applies(rule)) throw badRequest(`rule_ids[${i}]`, `score rule ${id} is scoped to spec "${rule.eval_id}", and experiment ${experiment.experiment_id} runs spec "${experiment.spec_id}"`);
        return rule;
      });
    }
    const request: ScoreRequested = {
      tenant: p.tenant,
      event_id: newEventId(),
      ts: Date.now(),
      request_id: ctx.state.requestId as string,
      experiment_id: experiment.experiment_id,
      rules: JSON.stringify(chosen.map(ruleFromEvent)),
      run: null,
    };
    await publish(kernel, TOPICS.scoreRequests, [{ key: experiment.experiment_id, tenant: p.tenant, value: request }]);
    ctx.status = 202;
    ctx.body = { request_id: request.request_id, experiment_id: experiment.experiment_id, rule_ids: chosen.map((r) => r.rule_id), runs: experiment.total_runs, status: 'queued' };
  });

  /** The score records of one experiment, optionally of one rule: a page, or every one as NDJSON. */
  const listScores = async (ctx: Context, experimentId: string, ruleId: string | undefined) => {
    if (ruleId === '') throw badRequest('rule_id', 'must not be empty');
    const limit = parseLimit(ctx.query.limit, config);
    const cursor = scoreCursor(ctx.query.cursor);
    const experiment = experiments.owned(principal(ctx), experimentId);
    const page = (after: string[] | null, size: number) => scorePage(store, experiment.tenant, experiment.experiment_id, ruleId ?? null, after, size);
    if (wantsNdjson(ctx)) {
      let first = true;
      ctx.type = 'application/x-ndjson';
      ctx.body = ndjsonStream(
        (next) => {
          const after = first ? cursor : scoreCursor(next ?? undefined);
          first = false;
          return page(after, config.maxPageSize);
        },
        ctx.query.limit === undefined ? null : limit,
      );
      return;
    }
    const { items, next } = await page(cursor, limit);
    ctx.body = { items, ...(next ? { next_cursor: next } : {}), count: items.length };
  };

  router.get('/v1/experiments/:id/scores', async (ctx) => {
    checkQueryParams(ctx, ['rule_id']);
    await listScores(ctx, ctx.params.id, ctx.query.rule_id as string | undefined);
  });

  router.get('/v1/scores', async (ctx) => {
    checkQueryParams(ctx, ['experiment_id', 'rule_id']);
    const experimentId = ctx.query.experiment_id as string | undefined;
    if (experimentId === undefined || experimentId === '') throw badRequest('experiment_id', 'is required: the experiment whose scores to list');
    await listScores(ctx, experimentId, ctx.query.rule_id as string | undefined);
  });

  return router;
}
