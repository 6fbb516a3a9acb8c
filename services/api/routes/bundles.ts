/**
 * Task-file bundles: POST /v1/bundles (the .tar.gz as the raw body, streamed to the blob store
 * through the same checks as an agent's bundle), GET /v1/bundles and GET /v1/bundles/:digest.
 * Specs name them by digest (setup.bundles, grader.bundles, build.context: docs/spec-format.md).
 */
import Router from '@koa/router';
import type { Context } from 'koa';
import type { Principal } from '../../kernel/auth.ts';
import type { Config } from '../../kernel/config.ts';
import { AppError, badRequest } from '../../kernel/errors.ts';
import { idempotencySeed } from '../middleware/idempotency.ts';
import { bundleView, type BundleCatalog } from '../catalogs/bundle-catalog.ts';
import { checkQueryParams, decodeCursor, encodeCursor, parseLimit } from '../pagination.ts';

const GZIP_TYPES = ['application/gzip', 'application/x-gzip', 'application/octet-stream', 'application/x-tar'];
const DIGEST = /^sha256:[0-9a-f]{64}$/;

export function bundlesRouter(bundles: BundleCatalog, config: Config): Router {
  const router = new Router();
  const tenant = (ctx: Context) => (ctx.state.principal as Principal).tenant;
  const limit = { bytes: config.bundleMaxSizeBytes, name: 'bundles.max_size' };

  router.post('/v1/bundles', async (ctx) => {
    if (!ctx.is(GZIP_TYPES)) throw new AppError('unsupported_media_type', 'body: send the .tar.gz bytes as the body, with Content-Type: application/gzip');
    // A body declared past the limit is refused before it is read (and the connection closed).
    if (Number(ctx.get('Content-Length') || 0) > 2 * limit.bytes) {
      ctx.set('Connection', 'close');
      throw new AppError('payload_too_large', `bundle: larger than the size limit of ${limit.bytes} bytes (${limit.name})`);
    }
    const received = await bundles.store.receive(ctx.req, limit);
    if (received.sizeBytes === 0) {
      await bundles.store.discard(received);
      throw badRequest('bundle', 'is empty: send a .tar.gz archive as the body');
    }
    const { bundle, created } = await bundles.put(tenant(ctx), received, idempotencySeed(ctx));
    ctx.status = created ? 201 : 200;
    ctx.body = bundle;
  });

  router.get('/v1/bundles', (ctx) => {
    checkQueryParams(ctx, []);
    const size = parseLimit(ctx.query.limit, config);
    const after = decodeCursor(ctx.query.cursor, 1)?.[0];
    const rest = bundles.list(tenant(ctx)).filter((r) => after === undefined || r.digest > after);
    const items = rest.slice(0, size);
    ctx.body = {
      items: items.map(bundleView),
      ...(rest.length > size ? { next_cursor: encodeCursor([items[items.length - 1]!.digest]) } : {}),
      count: items.length,
    };
  });

  router.get('/v1/bundles/:digest', (ctx) => {
    checkQueryParams(ctx, []);
    if (!DIGEST.test(ctx.params.digest)) throw badRequest('digest', 'must be sha256: and 64 lowercase hex digits');
    ctx.body = bundles.get(tenant(ctx), ctx.params.digest);
  });

  return router;
}
