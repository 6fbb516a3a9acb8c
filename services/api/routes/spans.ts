/**
 * Span reads: GET /v1/traces/:id (every span of one trace), GET /v1/spans (filtered), both
 * keyset-paginated or NDJSON; and GET /v1/agents/:name/traces (an agent's trace events plus
 * metrics). Trace ids are client-made and scoped per tenant: another tenant's trace is 404.
 */
import Router from '@koa/router';
import type { Context } from 'koa';
import type { Kernel } from '../../kernel/actor.ts';
import type { Principal } from '../../kernel/auth.ts';
import { badRequest, notFound } from '../../kernel/errors.ts';
import type { AgentCatalog } from '../catalogs/agent-catalog.ts';
import { checkQueryParams, decodeCursor, encodeCursor, ndjsonStream, parseLimit, wantsNdjson } from '../pagination.ts';
import { traceEventFromRow, traceEventsPage } from './traces.ts';
import { agentEventsWhere, agentMetrics, resolveTrace, SPAN_FILTERS, spanQuery, spansPage, type SpanQuery } from '../traces/span-reads.ts';
import { EVENT_TYPES } from '../traces/validate-events.ts';

export function spansRouter(kernel: Kernel, agents: AgentCatalog): Router {
  const router = new Router();
  const { config, store } = kernel;
  const tenant = (ctx: Context) => (ctx.state.principal as Principal).tenant;

  /** Answers a page of spans, or every span as NDJSON; `empty` decides the answer when the first page has nothing. */
  const respond = async (ctx: Context, query: SpanQuery, empty: () => void) => {
    const limit = parseLimit(ctx.query.limit, config);
    const initial = decodeCursor(ctx.query.cursor, 2);
    if (wantsNdjson(ctx)) {
      let first = true;
      ctx.type = 'application/x-ndjson';
      ctx.body = ndjsonStream(
        async (cursor) => {
          const page = await spansPage(store, tenant(ctx), query, first ? initial : decodeCursor(cursor ?? undefined, 2), config.maxPageSize);
          first = false;
          return { items: page.items, next: page.next ? encodeCursor(page.next) : null };
        },
        ctx.query.limit === undefined ? null : limit,
      );
      return;
    }
    const page = await spansPage(store, tenant(ctx), query, initial, limit);
    if (page.items.length === 0 && initial === null) empty();
    ctx.body = { items: page.items, ...(page.next ? { next_cursor: encodeCursor(page.next) } : {}), count: page.items.length };
  };

  router.get('/v1/traces/:id', async (ctx) => {
    checkQueryParams(ctx, []);
    const id = ctx.params.id;
    const traces = await resolveTrace(store, tenant(ctx), id);
    const query: SpanQuery = { traces: new Map(traces.map((t) => [t, id])), where: ['TraceId IN {traces:Array(String)}'], params: { traces } };
    await respond(ctx, query, () => {
      throw notFound('trace', id);
    });
  });

  router.get('/v1/spans', async (ctx) => {
    checkQueryParams(ctx, SPAN_FILTERS);
    const q = ctx.query as Record<string, string | undefined>;
    const filters: Partial<Record<(typeof SPAN_FILTERS)[number], string>> = {};
    for (const name of SPAN_FILTERS) {
      if (q[name] === undefined) continue;
      if (q[name] === '') throw badRequest(name, 'must not be empty');
      filters[name] = q[name];
    }
    if (filters.event_type !== undefined && !(EVENT_TYPES as readonly string[]).includes(filters.event_type)) {
      throw badRequest('event_type', `must be one of ${EVENT_TYPES.join(', ')}`);
    }
    await respond(ctx, await spanQuery(store, tenant(ctx), filters), () => {});
  });

  router.get('/v1/agents/:name/traces', async (ctx) => {
    checkQueryParams(ctx, ['version']);
    const name = ctx.params.name;
    const raw = ctx.query.version as string | undefined;
    if (raw !== undefined && !/^[1-9]\d{0,8}$/.test(raw)) throw badRequest('version', 'must be a positive integer');
    // Names are per tenant: another tenant's agent is not found, like an unknown one.
    const snapshots = raw === undefined ? agents.versions(tenant(ctx), name) : [agents.byVersion(tenant(ctx), name, Number(raw))];
    const { where, params } = agentEventsWhere(name, snapshots.map((s) => s.id), raw !== undefined);
    const limit = parseLimit(ctx.query.limit, config);
    const [{ rows, next }, metrics] = await Promise.all([
      traceEventsPage(store, { tenant: tenant(ctx), where: [where], params, after: decodeCursor(ctx.query.cursor, 2), pageSize: limit, id: 'EventId' }),
      agentMetrics(store, tenant(ctx), where, params),
    ]);
    const items = rows.map(traceEventFromRow);
    ctx.body = { items, ...(next ? { next_cursor: encodeCursor(next) } : {}), count: items.length, metrics };
  });

  return router;
}
