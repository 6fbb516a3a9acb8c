/**
 * Experiments (docs/experiments.md): create, run and cancel (experiments/lifecycle.ts), compare,
 * RunResults, the list, metrics, scenarios, eval history and export, each read model in its own
 * file under experiments/. Live state comes from the ExperimentCatalog; runs, scores and traces
 * from ClickHouse.
 */
import Router from '@koa/router';
import type { Context } from 'koa';
import type { Kernel } from '../../kernel/actor.ts';
import type { Auth, Principal } from '../../kernel/auth.ts';
import { experimentMetrics } from '../../queries/run-facts.ts';
import type { AgentCatalog } from '../catalogs/agent-catalog.ts';
import type { ExperimentCatalog } from '../catalogs/experiment-catalog.ts';
import type { SpecCatalog } from '../catalogs/spec-catalog.ts';
import type { DatasetCatalog } from '../catalogs/dataset-catalog.ts';
import { compareRequest } from '../experiments/compare-request.ts';
import { parseCreateRequest } from '../experiments/create-request.ts';
import { evalHistory } from '../experiments/eval-history.ts';
import { listExperiments } from '../experiments/experiment-list.ts';
import { createdCursor } from '../experiments/experiment-rows.ts';
import { exportDownload, parseExportFormat } from '../experiments/export-bundle.ts';
import { ExperimentLifecycle } from '../experiments/lifecycle.ts';
import { idempotencySeed } from '../middleware/idempotency.ts';
import { runResults } from '../experiments/run-results.ts';
import { parseScenarioQuery, SCENARIO_PARAMS, scenarioPage } from '../experiments/scenario-page.ts';
import { checkQueryParams, pageOf, parseLimit } from '../pagination.ts';
import { jsonBody } from '../request-body.ts';

const pageBody = <T>(page: { items: T[]; next: string | null }) => pageOf(page.items, page.next);

type Deps = { kernel: Kernel; auth: Auth; specs: SpecCatalog; agents: AgentCatalog; experiments: ExperimentCatalog; datasets: DatasetCatalog };

/** What the handlers use: the store, the config, the catalogs, and the caller's experiment of an id (404, 403 otherwise). */
function handlerContext({ kernel, specs, experiments }: Deps) {
  const principal = (ctx: Context) => ctx.state.principal as Principal;
  const owned = (ctx: Context, id: string) => experiments.owned(principal(ctx), id);
  return { kernel, config: kernel.config, store: kernel.store, specs, experiments, principal, owned };
}

type HandlerContext = ReturnType<typeof handlerContext>;

export function experimentsRouter(deps: Deps): Router {
  const router = new Router();
  const h = handlerContext(deps);
  experimentRoutes(router, h, new ExperimentLifecycle(deps));
  readRoutes(router, h);
  return router;
}

/** The experiments resource: create, list, compare, one's RunResults, run, cancel, export. */
function experimentRoutes(router: Router, { kernel, config, store, experiments, principal, owned }: HandlerContext, lifecycle: ExperimentLifecycle): void {
  router.post('/v1/experiments', async (ctx) => {
    const request = parseCreateRequest(jsonBody(ctx));
    ctx.status = 201;
    ctx.body = await lifecycle.create(principal(ctx).tenant, request, idempotencySeed(ctx));
  });

  router.get('/v1/experiments', async (ctx) => {
    checkQueryParams(ctx, []);
    const limit = parseLimit(ctx.query.limit, config);
    // The summaries come from tables other actors feed (the aggregator's experiments, the scorer's
    // run scores): read once they hold what their topics held, so the list agrees with GET /:id.
    await Promise.all(['experiments', 'run_scores'].map((table) => kernel.visibility.waitForTable(table, null, config.replyTimeout)));
    ctx.body = pageBody(await listExperiments(store, principal(ctx).tenant, createdCursor(ctx.query.cursor), limit));
  });

  router.post('/v1/experiments/compare', async (ctx) => {
    ctx.body = await compareRequest(store, experiments, principal(ctx), jsonBody(ctx));
  });

  router.get('/v1/experiments/:id', async (ctx) => {
    checkQueryParams(ctx, []);
    const experiment = owned(ctx, ctx.params.id);
    ctx.body = await runResults(store, experiment, experiments.plan(experiment), config.baseUrl);
  });

  router.post('/v1/experiments/:id/run', async (ctx) => {
    const experiment = owned(ctx, ctx.params.id);
    ctx.status = 202;
    ctx.body = await lifecycle.run(experiment);
  });

  router.post('/v1/experiments/:id/cancel', async (ctx) => {
    ctx.body = await lifecycle.cancel(owned(ctx, ctx.params.id));
  });

  router.get('/v1/experiments/:id/export', async (ctx) => {
    checkQueryParams(ctx, []);
    const format = parseExportFormat(ctx.query.format);
    const experiment = owned(ctx, ctx.params.id);
    const download = await exportDownload(kernel, experiment, experiments.plan(experiment), format);
    ctx.type = download.type;
    ctx.set('Content-Disposition', `attachment; filename="${download.filename}"`);
    ctx.body = download.body;
  });
}

/** Reads beside the resource: an experiment's metrics, its scenarios, and an eval's history. */
function readRoutes(router: Router, { config, store, specs, experiments, principal, owned }: HandlerContext): void {
  router.get('/v1/metrics/experiments/:id', async (ctx) => {
    checkQueryParams(ctx, []);
    const experiment = owned(ctx, ctx.params.id);
    ctx.body = await experimentMetrics(store, experiment.tenant, experiment.experiment_id, experiments.plan(experiment).scoring);
  });

  router.get('/v1/scenarios', async (ctx) => {
    checkQueryParams(ctx, SCENARIO_PARAMS);
    const query = parseScenarioQuery(ctx.query, config);
    const experiment = owned(ctx, query.experiment_id);
    ctx.body = pageBody(await scenarioPage(store, experiment, experiments.plan(experiment), config.baseUrl, query));
  });

  router.get('/v1/evals/:id/history', async (ctx) => {
    checkQueryParams(ctx, []);
    const limit = parseLimit(ctx.query.limit, config);
    const cursor = createdCursor(ctx.query.cursor);
    ctx.body = pageBody(await evalHistory(store, specs, principal(ctx).tenant, ctx.params.id, cursor, limit));
  });
}
