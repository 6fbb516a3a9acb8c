import type { Context, Next } from 'koa';
import type { Kernel } from '../../kernel/actor.ts';
import { newRequestId } from '../../kernel/ids.ts';

/**
 * Every request gets an id (also in `X-Request-Id`), counts in the HTTP metrics by its matched
 * route, and one log line with its tenant, status and duration.
 */
export function requestLog({ metrics, logger }: Kernel) {
  return async (ctx: Context, next: Next) => {
    ctx.state.requestId = newRequestId();
    ctx.set('X-Request-Id', ctx.state.requestId);
    const started = performance.now();
    try {
      await next();
    } finally {
      const route = (ctx as { _matchedRoute?: string })._matchedRoute ?? 'unmatched';
      const ms = performance.now() - started;
      metrics.httpRequests.inc({ route, method: ctx.method, status: String(ctx.status) });
      metrics.httpDuration.observe({ route, method: ctx.method }, ms / 1000);
      logger.info(
        { request_id: ctx.state.requestId, tenant: ctx.state.principal?.tenant, method: ctx.method, route, status: ctx.status, ms: Math.round(ms) },
        'request',
      );
    }
  };
}
