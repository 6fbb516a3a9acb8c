import type { Context, Next } from 'koa';
import { koaBody } from 'koa-body';
import { checkJsonDepth } from '../json-depth.ts';
import { readIngestBody } from '../traces/ingest-http.ts';

/**
 * Reads request bodies: an ingest request's (marked by middleware/request-limits.ts) as raw
 * bytes, parsed later in a worker thread (traces/ingest.ts); any other as JSON or text, a JSON
 * body's nesting checked before any handler walks the value.
 */
export function bodyParsing() {
  const parseBody = koaBody({
    jsonLimit: '32mb',
    textLimit: '32mb',
    includeUnparsed: true,
    jsonStrict: true,
    text: true,
    urlencoded: false,
    multipart: false,
    json: true,
    onError: (err) => {
      throw err;
    },
  });
  return async (ctx: Context, next: Next) => {
    if (!ctx.state.ingest) {
      return parseBody(ctx, () => {
        const { body, rawBody } = ctx.request as { body?: unknown; rawBody?: unknown };
        if (ctx.request.is('json') && typeof body === 'object' && body !== null && typeof rawBody === 'string') checkJsonDepth(rawBody);
        return next();
      });
    }
    ctx.state.rawBody = await readIngestBody(ctx);
    return next();
  };
}
