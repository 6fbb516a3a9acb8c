import type { Context, Next } from 'koa';
import type { Config } from '../../kernel/config.ts';
import { AppError } from '../../kernel/errors.ts';
import type { Principal } from '../../kernel/auth.ts';
import { RateLimiter } from './rate-limit.ts';
import { SCHEMA_REGISTRY_PREFIX } from './authentication.ts';

/**
 * Ingest endpoints are limited in events per second, not requests (docs/decisions.md): their
 * events count against the key in traces/ingest.ts, and here only their number in progress is.
 */
const INGEST_PATHS = [/^\/v1\/traces$/, /^\/v1\/sandboxes\/[^/]+\/trace$/, /^\/otel\/v1\/traces$/];

/**
 * Per-key limits of authenticated requests (the public paths have no principal and no limit):
 * reads and writes per second, except operator calls (the admin key on /v1/admin/* and the
 * schema registry, and the service key, with which a starting process registers its ~20
 * subjects at once: docs/performance.md); an ingest
 * request is marked `ctx.state.ingest` (its body is read raw, middleware/body-parsing.ts) and
 * counts toward the ingest requests in progress.
 */
export function requestLimits(config: Config) {
  const reads = new RateLimiter(config.rateLimitReads, 'read requests');
  const writes = new RateLimiter(config.rateLimitWrites, 'write requests');
  let ingestInFlight = 0;
  return async (ctx: Context, next: Next) => {
    const principal = ctx.state.principal as Principal | undefined;
    if (!principal) return next();
    const operatorCall =
      principal.kind === 'service' || (principal.kind === 'admin' && (ctx.path.startsWith('/v1/admin/') || ctx.path.startsWith(`${SCHEMA_REGISTRY_PREFIX}/`)));
    ctx.state.ingest = ctx.method === 'POST' && INGEST_PATHS.some((p) => p.test(ctx.path));
    if (!ctx.state.ingest) {
      if (!operatorCall) (ctx.method === 'GET' || ctx.method === 'HEAD' ? reads : writes).take(principal.keyId);
      return next();
    }
    // Pushback instead of unbounded memory: an ingest request holds its body until its events
    // are queryable, so when the sink falls behind, requests pile up here and the next is refused
    // before its body is read. Accepted events are on the log already and are never dropped.
    if (ingestInFlight >= config.ingestMaxInFlight) {
      throw new AppError(
        'overloaded',
        `the service is behind on trace ingest (${config.ingestMaxInFlight} ingest requests in progress); retry after the Retry-After delay`,
        { retryAfter: 1 },
      );
    }
    ingestInFlight++;
    try {
      return await next();
    } finally {
      ingestInFlight--;
    }
  };
}
