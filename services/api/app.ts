/**
 * The Koa app: request ids, metrics, errors from the catalog, auth, per-key rate limits,
 * Idempotency-Key, body parsing, then one router per resource.
 */
import Koa, { type Context, type Next } from 'koa';
import Router from '@koa/router';
import { koaBody } from 'koa-body';
import type { Kernel } from '../kernel/actor.ts';
import type { Auth, Principal } from '../kernel/auth.ts';
import { AppError } from '../kernel/errors.ts';
import { newRequestId } from '../kernel/ids.ts';
import type { BuiltInRegistry } from '../kernel/schema/registry.ts';
import { errorMiddleware } from './middleware/error-responses.ts';
import type { Idempotency } from './middleware/idempotency.ts';
import { RateLimiter } from './middleware/rate-limit.ts';
import { adminRouter } from './routes/admin.ts';
import { schemaRegistryRouter } from './routes/schema-registry.ts';
import { tracesRouter } from './routes/traces.ts';
import { otlpRouter } from './routes/otlp.ts';
import { specsRouter } from './routes/specs.ts';
import { agentsRouter } from './routes/agents.ts';
import { spansRouter } from './routes/spans.ts';
import { sqlEndpoint } from './routes/sql.ts';
import type { AgentCatalog } from './catalogs/agent-catalog.ts';
import { SPEC_JSON_SCHEMA, SPEC_SCHEMA_PATH } from '../domain/spec.ts';
import { secretsRouter } from './routes/secrets.ts';
import { sandboxesRouter } from './routes/sandboxes.ts';
import { experimentsRouter } from './routes/experiments.ts';
import { scoringRouter } from './routes/scoring.ts';
import type { ScoreRuleCatalog } from './catalogs/score-rule-catalog.ts';
import type { ExperimentCatalog } from './catalogs/experiment-catalog.ts';
import type { SpecCatalog } from './catalogs/spec-catalog.ts';
import type { SandboxCatalog } from './catalogs/sandbox-catalog.ts';
import { readIngestBody, type TraceIngest } from './traces/ingest.ts';
import { checkJsonDepth } from './json-depth.ts';
import type { TenantSecrets } from '../kernel/tenant-secrets.ts';
import type { Requester } from '../kernel/request-reply.ts';

/** Ingest endpoints are limited in events per second, not requests (DECISIONS.md). */
const OTLP_PATH = '/otel/v1/traces';
const INGEST_PATHS = [/^\/v1\/traces$/, /^\/v1\/sandboxes\/[^/]+\/trace$/, /^\/otel\/v1\/traces$/];
/** Reachable without a key. Operator calls (the admin key on /v1/admin/*) are not rate limited. */
const PUBLIC_PATHS = new Set(['/health', SPEC_SCHEMA_PATH]);

export interface AppDeps {
  kernel: Kernel;
  ingest: TraceIngest;
  auth: Auth;
  idempotency: Idempotency;
  specs: SpecCatalog;
  agents: AgentCatalog;
  secrets: TenantSecrets;
  sandboxes: SandboxCatalog;
  experiments: ExperimentCatalog;
  scoreRules: ScoreRuleCatalog;
  requester: Requester;
  /** The built-in schema registry, when this process serves it. */
  registry: BuiltInRegistry | null;
  health(): Promise<{ ok: boolean; body: object }>;
}

export function createApp({ kernel, auth, idempotency, specs, agents, secrets, sandboxes, experiments, scoreRules, requester, ingest, registry, health }: AppDeps): Koa {
  const { config, metrics, logger } = kernel;
  const app = new Koa();
  app.proxy = false;
  const reads = new RateLimiter(config.rateLimitReads, 'read requests');
  const writes = new RateLimiter(config.rateLimitWrites, 'write requests');
  let ingestInFlight = 0;

  app.use(async (ctx: Context, next: Next) => {
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
      logger.info({ request_id: ctx.state.requestId, tenant: ctx.state.principal?.tenant, method: ctx.method, route, status: ctx.status, ms: Math.round(ms) }, 'request');
    }
  });
  app.use(errorMiddleware(logger));
  // The analysts' SQL endpoint speaks ClickHouse's HTTP interface (its own auth, raw body, text
  // errors), so it sits before the auth, rate limits and body parser below.
  app.use(sqlEndpoint(kernel, auth));

  app.use(async (ctx: Context, next: Next) => {
    if (PUBLIC_PATHS.has(ctx.path)) return next();
    const principal = auth.authenticate(ctx.get('Authorization') || undefined);
    ctx.state.principal = principal;
    // A sandbox token is valid only for its own sandbox's resources, and its OTLP exporter.
    if (principal.kind === 'sandbox' && !ctx.path.startsWith(`/v1/sandboxes/${principal.keyId}`) && ctx.path !== OTLP_PATH) {
      throw new AppError('forbidden', 'a sandbox token is valid only for its own sandbox (/v1/sandboxes/<its id>) and /otel/v1/traces');
    }
    const operatorCall = principal.kind === 'admin' && ctx.path.startsWith('/v1/admin/');
    ctx.state.ingest = ctx.method === 'POST' && INGEST_PATHS.some((p) => p.test(ctx.path));
    if (!ctx.state.ingest) {
      if (!operatorCall) (ctx.method === 'GET' || ctx.method === 'HEAD' ? reads : writes).take(principal.keyId);
      return next();
    }
    // Pushback instead of unbounded memory: an ingest request holds its body until its events
    // are queryable, so when the sink falls behind, requests pile up here and the next is refused
    // before its body is read. Accepted events are on the log already and are never dropped.
    if (ingestInFlight >= config.ingestMaxInFlight) {
      throw new AppError('overloaded', `the service is behind on trace ingest (${config.ingestMaxInFlight} ingest requests in progress); retry after the Retry-After delay`, { retryAfter: 1 });
    }
    ingestInFlight++;
    try {
      return await next();
    } finally {
      ingestInFlight--;
    }
  });

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
  // Ingest bodies are read raw and parsed in a worker thread (traces/ingest.ts).
  app.use(async (ctx: Context, next: Next) => {
    if (!ctx.state.ingest) {
      return parseBody(ctx, () => {
        // A parsed JSON body's text, checked before any handler walks the value.
        const { body, rawBody } = ctx.request as { body?: unknown; rawBody?: unknown };
        if (ctx.request.is('json') && typeof body === 'object' && body !== null && typeof rawBody === 'string') checkJsonDepth(rawBody);
        return next();
      });
    }
    ctx.state.rawBody = await readIngestBody(ctx);
    return next();
  });
  app.use(idempotency.middleware());

  const root = new Router();
  root.get('/health', async (ctx) => {
    const { ok, body } = await health();
    ctx.status = ok ? 200 : 503;
    ctx.body = body;
  });
  // The spec document's JSON Schema, for editors (yaml-language-server) and CI checks of spec files.
  root.get(SPEC_SCHEMA_PATH, (ctx) => {
    ctx.type = 'application/schema+json';
    ctx.set('Cache-Control', 'public, max-age=3600');
    ctx.body = SPEC_JSON_SCHEMA;
  });
  root.get('/metrics', async (ctx) => {
    if ((ctx.state.principal as Principal).kind !== 'admin') throw new AppError('forbidden', 'metrics need the admin key');
    ctx.type = metrics.registry.contentType;
    ctx.body = await metrics.render(kernel.log);
  });

  const routers = [
    root,
    tracesRouter(kernel, ingest),
    otlpRouter(ingest, sandboxes),
    specsRouter(specs),
    agentsRouter(agents, config),
    spansRouter(kernel, agents),
    secretsRouter(secrets),
    sandboxesRouter({ kernel, auth, specs, agents, sandboxes, requester, ingest }),
    experimentsRouter({ kernel, auth, specs, agents, experiments }),
    scoringRouter({ kernel, specs, experiments, rules: scoreRules }),
    adminRouter(kernel, auth),
  ];
  if (registry) {
    const sr = new Router({ prefix: '/schema-registry' });
    sr.use(async (ctx, next) => {
      if ((ctx.state.principal as Principal).kind !== 'admin') throw new AppError('forbidden', 'the schema registry needs the admin key');
      return next();
    });
    const inner = schemaRegistryRouter(registry);
    sr.use(inner.routes(), inner.allowedMethods());
    routers.push(sr);
  }
  for (const router of routers) app.use(router.routes()).use(router.allowedMethods());
  return app;
}
