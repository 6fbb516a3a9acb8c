/**
 * POST /v1/traces: events without a sandbox, stamped with the key's tenant (traces/ingest.ts);
 * with `Prefer: respond-async`, answered once the log holds them, and GET /v1/traces/visibility
 * says when a token's events are queryable.
 * GET /v1/traces: the tenant's trace events from ClickHouse, oldest first, keyset-paginated on
 * (Timestamp, EventId), or streamed as NDJSON (traces/trace-event-reads.ts).
 */
import Router from '@koa/router';
import type { Kernel } from '../../kernel/actor.ts';
import type { Principal } from '../../kernel/auth.ts';
import { checkQueryParams } from '../pagination.ts';
import { MAX_INGEST_BODY_BYTES, type TraceIngest, untagged } from '../traces/ingest.ts';
import { ingestAnswer, postedBody, prefersRespondAsync, requireJson } from '../traces/ingest-http.ts';
import { decodeVisibilityToken } from '../traces/visibility-token.ts';
import { badRequest } from '../../kernel/errors.ts';
import { parseDuration } from '../../kernel/duration.ts';
import { answerPages } from '../traces/paged-answer.ts';
import { TRACE_FILTERS, traceEventItems, traceFilters } from '../traces/trace-event-reads.ts';

/** Longest a visibility check waits (`wait`). */
const MAX_VISIBILITY_WAIT_MS = 30_000;

function queryDuration(raw: string, field: string, maxMs: number): number {
  let ms: number;
  try {
    ms = parseDuration(raw);
  } catch {
    throw badRequest(field, 'must be a duration such as 500ms or 5s');
  }
  if (ms > maxMs) throw badRequest(field, `must be at most ${maxMs / 1000}s`);
  return ms;
}

export function tracesRouter(kernel: Kernel, ingest: TraceIngest): Router {
  const router = new Router();
  const { config, store } = kernel;

  router.post('/v1/traces', async (ctx) => {
    const principal = ctx.state.principal as Principal;
    requireJson(ctx);
    const respondAsync = prefersRespondAsync(ctx);
    const decoded = await ingest.ingest(postedBody(ctx), {
      endpoint: '/v1/traces',
      format: 'trace-json',
      maxBodyBytes: MAX_INGEST_BODY_BYTES,
      keyId: principal.keyId,
      source: untagged(principal.tenant),
      respondAsync,
    });
    ctx.body = ingestAnswer(ctx, decoded, respondAsync);
  });

  // Before /v1/traces/:id (spans.ts): `visibility` is no trace id.
  router.get('/v1/traces/visibility', async (ctx) => {
    checkQueryParams(ctx, ['token', 'wait']);
    const positions = decodeVisibilityToken(ctx.query.token);
    const waitMs = ctx.query.wait === undefined ? 0 : queryDuration(ctx.query.wait as string, 'wait', MAX_VISIBILITY_WAIT_MS);
    ctx.body = { visible: await kernel.visibility.visible(positions, waitMs) };
  });

  router.get('/v1/traces', async (ctx) => {
    const principal = ctx.state.principal as Principal;
    checkQueryParams(ctx, TRACE_FILTERS);
    const filters = traceFilters(ctx.query as Record<string, string | undefined>);
    await answerPages(ctx, config, (after, pageSize) => traceEventItems(store, principal.tenant, filters, after, pageSize));
  });

  return router;
}
