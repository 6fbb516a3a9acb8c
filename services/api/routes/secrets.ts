/**
 * Tenant-stored secrets, the `dashboard` source of spec secrets: PUT sets one, GET lists their
 * names (never values), DELETE removes one. Values are encrypted on the log.
 */
import Router from '@koa/router';
import type { Context } from 'koa';
import type { Principal } from '../../kernel/auth.ts';
import { badRequest, notFound } from '../../kernel/errors.ts';
import { SECRET_NAME } from '../../domain/spec.ts';
import type { TenantSecrets } from '../../kernel/tenant-secrets.ts';

const MAX_SECRET_BYTES = 64 * 1024;

export function secretsRouter(secrets: TenantSecrets): Router {
  const router = new Router({ prefix: '/v1/secrets' });
  const tenant = (ctx: Context) => (ctx.state.principal as Principal).tenant;
  const name = (ctx: Context) => {
    if (!SECRET_NAME.test(ctx.params.name)) throw badRequest('name', 'must be letters, digits and _, starting with a letter or _');
    return ctx.params.name;
  };

  router.get('/', (ctx) => {
    const items = secrets.list(tenant(ctx));
    ctx.body = { items, count: items.length };
  });

  router.put('/:name', async (ctx) => {
    const n = name(ctx);
    const body = ctx.request.body as { value?: unknown } | undefined;
    if (typeof body?.value !== 'string' || body.value === '') throw badRequest('value', 'is required: the secret as a non-empty string');
    if (Buffer.byteLength(body.value) > MAX_SECRET_BYTES) throw badRequest('value', `must be at most ${MAX_SECRET_BYTES} bytes`);
    await secrets.put(tenant(ctx), n, body.value);
    ctx.body = { name: n, updated_at: new Date().toISOString() };
  });

  router.delete('/:name', async (ctx) => {
    const n = name(ctx);
    if (!secrets.has(tenant(ctx), n)) throw notFound('secret', n);
    await secrets.put(tenant(ctx), n, null);
    ctx.body = { name: n, deleted: true };
  });

  return router;
}
