/**
 * POST /v1/traces: events without a sandbox, stamped with the key's tenant (traces/ingest.ts).
 * GET /v1/traces: the tenant's trace events from ClickHouse, oldest first, keyset-paginated on
 * (Timestamp, EventId), or streamed as NDJSON (traces/trace-event-reads.ts).
 */
import Router from '@koa/router';
import type { Kernel } from '../../kernel/actor.ts';
import type { Principal } from '../../kernel/auth.ts';
import { checkQueryParams } from '../pagination.ts';
import { MAX_INGEST_BODY_BYTES, type TraceIngest, untagged } from '../traces/ingest.ts';
import { postedBody, requireJson } from '../traces/ingest-http.ts';
import { answerPages } from '../traces/paged-answer.ts';
import { TRACE_FILTERS, traceEventItems, traceFilters } from '../traces/trace-event-reads.ts';

export function tracesRouter(kernel: Kernel, ingest: TraceIngest): Router {
  const router = new Router();
  const { config, store } = kernel;

  router.post('/v1/traces', async (ctx) => {
    const principal = ctx.state.principal as Principal;
    requireJson(ctx);
    const decoded = await ingest.ingest(postedBody(ctx), { endpoint: '/v1/traces', format: 'trace-json', maxBodyBytes: MAX_INGEST_BODY_BYTES, keyId: principal.keyId, source: untagged(principal.tenant) });
    ctx.body = { ingested: decoded.count };
  });

  router.get('/v1/traces', async (ctx) => {
    const principal = ctx.state.principal as Principal;
    checkQueryParams(ctx, TRACE_FILTERS);
    const filters = traceFilters(ctx.query as Record<string, string | undefined>);
    await answerPages(ctx, config, (after, pageSize) => traceEventItems(store, principal.tenant, filters, after, pageSize));
  });

  return router;
}
