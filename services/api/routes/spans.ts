/**
 * Span reads: GET /v1/traces/:id (every span of one trace), GET /v1/spans (filtered), both
 * keyset-paginated or NDJSON; and GET /v1/agents/:name/traces (an agent's trace events plus
 * metrics). Trace ids are client-made and scoped per tenant: another tenant's trace is 404.
 * The reads are in traces/span-reads.ts.
 */
import Router from '@koa/router';
import type { Context } from 'koa';
import type { Kernel } from '../../kernel/actor.ts';
import type { Principal } from '../../kernel/auth.ts';
import { badRequest, notFound } from '../../kernel/errors.ts';
import type { AgentCatalog } from '../catalogs/agent-catalog.ts';
import { checkQueryParams, decodeCursor, encodeCursor, pageOf, parseLimit } from '../pagination.ts';
import { answerPages } from '../traces/paged-answer.ts';
import { agentTrace, resolveTrace, SPAN_FILTERS, spanFilters, spanQuery, spansPage, traceSpanQuery, type SpanQuery } from '../traces/span-reads.ts';

export function spansRouter(kernel: Kernel, agents: AgentCatalog): Router {
  const router = new Router();
  const { config, store } = kernel;
  const tenant = (ctx: Context) => (ctx.state.principal as Principal).tenant;
  /** Answers a page of spans, or every span as NDJSON; `empty` decides the answer when the first page has nothing. */
  const answerSpans = (ctx: Context, query: SpanQuery, empty?: () => void) =>
    answerPages(ctx, config, (after, pageSize) => spansPage(store, tenant(ctx), query, after, pageSize), empty);

  router.get('/v1/traces/:id', async (ctx) => {
    checkQueryParams(ctx, []);
    const id = ctx.params.id;
    const { members, bounds } = await resolveTrace(store, tenant(ctx), id);
    const query = traceSpanQuery(new Map(members.map((t) => [t, id])), bounds);
    await answerSpans(ctx, query, () => {
      throw notFound('trace', id);
    });
  });

  router.get('/v1/spans', async (ctx) => {
    checkQueryParams(ctx, SPAN_FILTERS);
    const filters = spanFilters(ctx.query as Record<string, string | undefined>);
    await answerSpans(ctx, await spanQuery(store, tenant(ctx), filters));
  });

  router.get('/v1/agents/:name/traces', async (ctx) => {
    checkQueryParams(ctx, ['version']);
    const name = ctx.params.name;
    const raw = ctx.query.version as string | undefined;
    if (raw !== undefined && !/^[1-9]\d{0,8}$/.test(raw)) throw badRequest('version', 'must be a positive integer');
    // Names are per tenant: another tenant's agent is not found, like an unknown one.
    const snapshots = raw === undefined ? agents.versions(tenant(ctx), name) : [agents.byVersion(tenant(ctx), name, Number(raw))];
    const limit = parseLimit(ctx.query.limit, config);
    const agent = { name, snapshotIds: snapshots.map((s) => s.id), byVersion: raw !== undefined };
    const { items, next, metrics } = await agentTrace(store, tenant(ctx), agent, decodeCursor(ctx.query.cursor, 2), limit);
    ctx.body = { ...pageOf(items, next && encodeCursor(next)), metrics };
  });

  return router;
}
