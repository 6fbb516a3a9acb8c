/**
 * Operator endpoints, guarded by the admin key (SVC_API_KEY): tenants and their plans, tenant
 * API keys (create, list, rotate, revoke), and the dead-letter topic. docs/api.md documents them.
 */
import Router from '@koa/router';
import { idempotencySeed } from '../middleware/idempotency.ts';
import type { Context, Next } from 'koa';
import type { Kernel } from '../../kernel/actor.ts';
import { PLANS, type ApiKeyRecord, type Auth, type Plan, type Principal } from '../../kernel/auth.ts';
import { AppError, badRequest, notFound } from '../../kernel/errors.ts';
import { checkQueryParams, decodeCursor, encodeCursor, pageOf, parseLimit } from '../pagination.ts';
import { jsonBody } from '../request-body.ts';

function requireAdmin(ctx: Context, next: Next) {
  const principal = ctx.state.principal as Principal;
  if (principal.kind !== 'admin') throw new AppError('forbidden', 'admin endpoints need the admin key (SVC_API_KEY)');
  return next();
}

function keyView(k: ApiKeyRecord) {
  return { id: k.key_id, tenant: k.tenant, name: k.name, prefix: k.prefix, status: k.status, created_at: new Date(k.created_at).toISOString() };
}

export function adminRouter(kernel: Kernel, auth: Auth): Router {
  const router = new Router({ prefix: '/v1/admin' });
  router.use(requireAdmin);

  router.get('/tenants', (ctx) => {
    const items = auth.listTenants().map((t) => ({ ...t, created_at: new Date(t.created_at).toISOString() }));
    ctx.body = { items, count: items.length };
  });

  router.get('/tenants/:tenant', (ctx) => {
    const t = auth.tenant(ctx.params.tenant);
    if (!t) throw notFound('tenant', ctx.params.tenant);
    ctx.body = { ...t, created_at: new Date(t.created_at).toISOString() };
  });

  router.put('/tenants/:tenant', async (ctx) => {
    const b = jsonBody(ctx);
    if (b.plan !== undefined && !PLANS.includes(b.plan as Plan)) throw badRequest('plan', `must be one of ${PLANS.join(', ')}`);
    const quota = b.max_concurrent_sandboxes;
    if (quota !== undefined && quota !== null && (typeof quota !== 'number' || !Number.isInteger(quota) || quota < 0)) {
      throw badRequest('max_concurrent_sandboxes', 'must be a non-negative integer or null');
    }
    const t = await auth.putTenant(ctx.params.tenant, { plan: b.plan as Plan | undefined, max_concurrent_sandboxes: quota as number | null | undefined });
    ctx.body = { ...t, created_at: new Date(t.created_at).toISOString() };
  });

  router.post('/keys', async (ctx) => {
    const b = jsonBody(ctx);
    if (typeof b.tenant !== 'string') throw badRequest('tenant', 'is required: the tenant the key belongs to');
    if (b.name !== undefined && b.name !== null && (typeof b.name !== 'string' || b.name.length > 200))
      throw badRequest('name', 'must be a string of at most 200 characters');
    const { record, secret } = await auth.createKey(b.tenant, (b.name as string | undefined) ?? null, idempotencySeed(ctx));
    ctx.status = 201;
    ctx.body = { ...keyView(record), key: secret };
  });

  router.get('/keys', (ctx) => {
    checkQueryParams(ctx, ['tenant']);
    const items = auth.listKeys(typeof ctx.query.tenant === 'string' ? ctx.query.tenant : undefined).map(keyView);
    ctx.body = { items, count: items.length };
  });

  router.post('/keys/:id/rotate', async (ctx) => {
    const { record, secret } = await auth.rotateKey(ctx.params.id);
    ctx.body = { ...keyView(record), key: secret };
  });

  router.delete('/keys/:id', async (ctx) => {
    const existing = auth.key(ctx.params.id);
    ctx.body = keyView(existing.status === 'revoked' ? existing : await auth.revokeKey(ctx.params.id));
  });

  router.get('/dead-letters', async (ctx) => {
    checkQueryParams(ctx, ['topic']);
    const limit = parseLimit(ctx.query.limit, kernel.config);
    const key = decodeCursor(ctx.query.cursor, 4);
    const conditions: string[] = [];
    const params: Record<string, unknown> = { page: limit + 1 };
    if (typeof ctx.query.topic === 'string') {
      conditions.push('Topic = {topic:String}');
      params.topic = ctx.query.topic;
    }
    if (key) {
      conditions.push('(FailedAt, Topic, Partition, Offset) < (parseDateTime64BestEffort({at:String}, 3), {t:String}, {p:UInt32}, {o:UInt64})');
      Object.assign(params, { at: key[0], t: key[1], p: key[2], o: key[3] });
    }
    const rows = await kernel.store.query<Record<string, string>>(
      `SELECT formatDateTime(FailedAt, '%Y-%m-%dT%H:%i:%S.%fZ', 'UTC') AS failed_at, Topic AS topic, Partition AS partition, Offset AS offset,
              GroupId AS group_id, TenantId AS tenant, Key AS key, Error AS error, Attempts AS attempts
       FROM dead_letters ${conditions.length ? `WHERE ${conditions.join(' AND ')}` : ''}
       ORDER BY FailedAt DESC, Topic DESC, Partition DESC, Offset DESC LIMIT {page:UInt32}`,
      params,
    );
    const items = rows.slice(0, limit);
    const last = rows.length > limit ? items[items.length - 1] : null;
    ctx.body = pageOf(items, last && encodeCursor([last.failed_at, last.topic, String(last.partition), String(last.offset)]));
  });

  return router;
}
