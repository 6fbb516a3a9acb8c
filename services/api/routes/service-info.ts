/**
 * What the service says about itself: GET /health (no key: the log and the store reachable),
 * GET /metrics (Prometheus, the admin key) and the spec document's JSON Schema (no key: for
 * editors, yaml-language-server, and CI checks of spec files).
 */
import Router from '@koa/router';
import type { Kernel } from '../../kernel/actor.ts';
import type { Principal } from '../../kernel/auth.ts';
import { AppError } from '../../kernel/errors.ts';
import { SPEC_JSON_SCHEMA, SPEC_SCHEMA_PATH } from '../../domain/spec.ts';

/** The log and the store, each reachable or not; ok when both are. */
async function health(kernel: Kernel): Promise<{ ok: boolean; body: object }> {
  const [log, store] = await Promise.all([
    kernel.log.endOffsets('svc.tenants').then(
      () => true,
      () => false,
    ),
    kernel.store.ping().catch(() => false),
  ]);
  return {
    ok: log && store,
    body: { status: log && store ? 'ok' : 'degraded', log: { backend: kernel.log.kind, ok: log }, store: { backend: kernel.store.kind, ok: store } },
  };
}

export function serviceInfoRouter(kernel: Kernel): Router {
  const router = new Router();
  const { metrics } = kernel;

  router.get('/health', async (ctx) => {
    const { ok, body } = await health(kernel);
    ctx.status = ok ? 200 : 503;
    ctx.body = body;
  });

  router.get(SPEC_SCHEMA_PATH, (ctx) => {
    ctx.type = 'application/schema+json';
    ctx.set('Cache-Control', 'public, max-age=3600');
    ctx.body = SPEC_JSON_SCHEMA;
  });

  router.get('/metrics', async (ctx) => {
    if ((ctx.state.principal as Principal).kind !== 'admin') throw new AppError('forbidden', 'metrics need the admin key');
    ctx.type = metrics.registry.contentType;
    ctx.body = await metrics.render(kernel.log);
  });

  return router;
}
