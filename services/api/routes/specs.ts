/**
 * Specs: POST raw YAML (`application/x-yaml` or `text/yaml`), GET list, GET one (`?version=N`
 * pins an older version), DELETE. The record is `{id, version, created_at, spec, yaml}`.
 */
import Router from '@koa/router';
import { idempotencySeed } from '../middleware/idempotency.ts';
import type { Context } from 'koa';
import getRawBody from 'raw-body';
import type { Principal } from '../../kernel/auth.ts';
import { AppError, badRequest } from '../../kernel/errors.ts';
import { checkQueryParams } from '../pagination.ts';
import type { SpecCatalog } from '../catalogs/spec-catalog.ts';

const YAML_TYPES = ['application/x-yaml', 'application/yaml', 'text/yaml', 'text/x-yaml'];
const MAX_SPEC_BYTES = 1024 * 1024;

async function yamlBody(ctx: Context): Promise<string> {
  if (!ctx.is(YAML_TYPES)) {
    throw new AppError('unsupported_media_type', `body: send the spec as raw YAML with Content-Type ${YAML_TYPES.slice(0, 3).join(' or ')}`);
  }
  // koa-body parses text/* itself; the application/ types arrive unread.
  const parsed = (ctx.request as { body?: unknown }).body;
  const text = typeof parsed === 'string' && parsed !== '' ? parsed : await getRawBody(ctx.req, { limit: MAX_SPEC_BYTES, encoding: 'utf8' });
  if (text.trim() === '') throw badRequest('body', 'the spec document is empty');
  return text;
}

function versionParam(raw: unknown): number | undefined {
  if (raw === undefined) return undefined;
  if (typeof raw !== 'string' || !/^[1-9]\d*$/.test(raw)) throw badRequest('version', 'must be a positive integer');
  return Number(raw);
}

export function specsRouter(specs: SpecCatalog): Router {
  const router = new Router({ prefix: '/v1/specs' });
  const tenant = (ctx: Context) => (ctx.state.principal as Principal).tenant;

  router.post('/', async (ctx) => {
    ctx.status = 201;
    ctx.body = await specs.put(tenant(ctx), await yamlBody(ctx), idempotencySeed(ctx));
  });

  router.get('/', (ctx) => {
    checkQueryParams(ctx, []);
    const items = specs.list(tenant(ctx));
    ctx.body = { items, count: items.length };
  });

  router.get('/:id', (ctx) => {
    checkQueryParams(ctx, ['version']);
    ctx.body = specs.get(tenant(ctx), ctx.params.id, versionParam(ctx.query.version)).record;
  });

  router.delete('/:id', async (ctx) => {
    await specs.delete(tenant(ctx), ctx.params.id);
    ctx.body = { id: ctx.params.id, deleted: true };
  });

  return router;
}
