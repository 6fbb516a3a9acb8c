/**
 * Score rules and offline scoring (docs/scoring.md): rules are created, listed and deleted here
 * (svc.score-rules; the body in scoring/score-rule-request.ts); `POST /v1/experiments/:id/score`
 * enqueues the scoring of a completed experiment's stored runs (scoring/score-request.ts,
 * svc.score-requests, carried out by the scorer) and answers 202 at once; the score records it
 * produces are read from ClickHouse (scoring/score-records.ts).
 */
import Router from '@koa/router';
import { idempotencySeed } from '../middleware/idempotency.ts';
import type { Context } from 'koa';
import type { Kernel } from '../../kernel/actor.ts';
import type { Principal } from '../../kernel/auth.ts';
import { badRequest } from '../../kernel/errors.ts';
import { ruleFromEvent } from '../../domain/score-rules.ts';
import type { ExperimentCatalog } from '../catalogs/experiment-catalog.ts';
import type { ScoreRuleCatalog } from '../catalogs/score-rule-catalog.ts';
import type { SpecCatalog } from '../catalogs/spec-catalog.ts';
import { checkQueryParams, pageOf, wantsNdjson } from '../pagination.ts';
import { jsonBody } from '../request-body.ts';
import { parseScoreQuery, scoreRecords, scoreStream } from '../scoring/score-records.ts';
import { parseRuleIds, requestScoring } from '../scoring/score-request.ts';
import { newScoreRule, parseRuleRequest } from '../scoring/score-rule-request.ts';

type Deps = { kernel: Kernel; specs: SpecCatalog; experiments: ExperimentCatalog; rules: ScoreRuleCatalog };

const principal = (ctx: Context) => ctx.state.principal as Principal;

export function scoringRouter(deps: Deps): Router {
  const router = new Router();
  ruleRoutes(router, deps);
  scoreRoutes(router, deps);
  return router;
}

/** Score rules: create, list, get, delete. */
function ruleRoutes(router: Router, { specs, rules }: Deps): void {
  router.post('/v1/score-rules', async (ctx) => {
    const seed = idempotencySeed(ctx);
    const rule = newScoreRule(specs, principal(ctx).tenant, parseRuleRequest(jsonBody(ctx)), seed);
    // A retry after a crash that came after the rule was stored: the rule the first try made.
    const made = seed === null ? undefined : rules.get(rule.rule_id);
    if (!made) await rules.put(rule);
    ctx.status = 201;
    ctx.body = ruleFromEvent(made ?? rule);
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
}

/** Offline scoring of an experiment, and the score records it produces. */
function scoreRoutes(router: Router, { kernel, experiments, rules }: Deps): void {
  const { config, store } = kernel;

  router.post('/v1/experiments/:id/score', async (ctx) => {
    const ids = parseRuleIds(jsonBody(ctx));
    const experiment = experiments.owned(principal(ctx), ctx.params.id);
    ctx.status = 202;
    ctx.body = await requestScoring(kernel, rules, experiment, ids, ctx.state.requestId as string);
  });

  /** The score records of one experiment, optionally of one rule (`rule_id`): a page, or every one as NDJSON. */
  const listScores = async (ctx: Context, experimentId: string) => {
    const query = parseScoreQuery(ctx.query, config);
    const experiment = experiments.owned(principal(ctx), experimentId);
    if (wantsNdjson(ctx)) {
      ctx.type = 'application/x-ndjson';
      ctx.body = scoreStream(store, experiment, query, config.maxPageSize);
      return;
    }
    const { items, next } = await scoreRecords(store, experiment, query);
    ctx.body = pageOf(items, next);
  };

  router.get('/v1/experiments/:id/scores', async (ctx) => {
    checkQueryParams(ctx, ['rule_id']);
    await listScores(ctx, ctx.params.id);
  });

  router.get('/v1/scores', async (ctx) => {
    checkQueryParams(ctx, ['experiment_id', 'rule_id']);
    const experimentId = ctx.query.experiment_id as string | undefined;
    if (experimentId === undefined || experimentId === '') throw badRequest('experiment_id', 'is required: the experiment whose scores to list');
    await listScores(ctx, experimentId);
  });
}
