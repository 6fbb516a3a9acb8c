/**
 * The Koa app: request ids, metrics and logs, errors from the catalog, the analysts' SQL
 * endpoint, auth, per-key limits, body parsing, Idempotency-Key, then one router per resource.
 */
import Koa from 'koa';
import Router from '@koa/router';
import type { Kernel } from '../kernel/actor.ts';
import type { Auth, Principal } from '../kernel/auth.ts';
import { AppError } from '../kernel/errors.ts';
import type { BuiltInRegistry } from '../kernel/schema/registry.ts';
import { authentication, SCHEMA_REGISTRY_PREFIX } from './middleware/authentication.ts';
import { bodyParsing } from './middleware/body-parsing.ts';
import { errorMiddleware } from './middleware/error-responses.ts';
import type { Idempotency } from './middleware/idempotency.ts';
import { requestLimits } from './middleware/request-limits.ts';
import { requestLog } from './middleware/request-log.ts';
import { adminRouter } from './routes/admin.ts';
import { agentsRouter } from './routes/agents.ts';
import { experimentsRouter } from './routes/experiments.ts';
import { otlpRouter } from './routes/otlp.ts';
import { sandboxesRouter } from './routes/sandboxes.ts';
import { sandboxShellRouter } from './routes/sandbox-shell.ts';
import { dashboard } from './routes/dashboard.ts';
import { schemaRegistryRouter } from './routes/schema-registry.ts';
import { scoringRouter } from './routes/scoring.ts';
import { secretsRouter } from './routes/secrets.ts';
import { serviceInfoRouter } from './routes/service-info.ts';
import { spansRouter } from './routes/spans.ts';
import { specsRouter } from './routes/specs.ts';
import { sqlEndpoint } from './routes/sql.ts';
import { tracesRouter } from './routes/traces.ts';
import type { AgentCatalog } from './catalogs/agent-catalog.ts';
import type { ExperimentCatalog } from './catalogs/experiment-catalog.ts';
import type { RunnerRoster } from './catalogs/runner-roster.ts';
import type { SandboxCatalog } from './catalogs/sandbox-catalog.ts';
import type { ScoreRuleCatalog } from './catalogs/score-rule-catalog.ts';
import type { AlertCatalog } from './catalogs/alert-catalog.ts';
import type { AlertEvaluator } from './alerts/evaluation-requester.ts';
import { alertsRouter } from './routes/alerts.ts';
import type { DatasetCatalog } from './catalogs/dataset-catalog.ts';
import { datasetsRouter } from './routes/datasets.ts';
import type { BundleCatalog } from './catalogs/bundle-catalog.ts';
import { bundlesRouter } from './routes/bundles.ts';
import type { SpecCatalog } from './catalogs/spec-catalog.ts';
import type { SandboxRequester } from './sandboxes/sandbox-requester.ts';
import type { TerminalRelay } from './sandboxes/terminal-relay.ts';
import type { TraceIngest } from './traces/ingest.ts';
import type { TenantSecrets } from '../kernel/tenant-secrets.ts';

export interface AppDeps {
  kernel: Kernel;
  ingest: TraceIngest;
  auth: Auth;
  idempotency: Idempotency;
  specs: SpecCatalog;
  agents: AgentCatalog;
  secrets: TenantSecrets;
  sandboxes: SandboxCatalog;
  runners: RunnerRoster;
  experiments: ExperimentCatalog;
  scoreRules: ScoreRuleCatalog;
  alerts: AlertCatalog;
  alertEvaluator: AlertEvaluator;
  datasets: DatasetCatalog;
  bundles: BundleCatalog;
  requester: SandboxRequester;
  /** The sandboxes' terminal sessions (the shell). */
  terminals: TerminalRelay;
  /** The built-in schema registry, when this process serves it. */
  registry: BuiltInRegistry | null;
}

export function createApp(deps: AppDeps): Koa {
  const { kernel, auth, idempotency } = deps;
  const app = new Koa();
  app.proxy = false;
  app.use(requestLog(kernel));
  app.use(errorMiddleware(kernel.logger));
  // The analysts' SQL endpoint speaks ClickHouse's HTTP interface (its own auth, raw body, text
  // errors), so it sits before the auth, limits and body parsing below.
  app.use(sqlEndpoint(kernel, auth));
  // The dashboard's static files (/ui) need no key: the page sends the tenant's key itself.
  app.use(dashboard());
  app.use(authentication(auth));
  app.use(requestLimits(kernel.config));
  app.use(bodyParsing());
  app.use(idempotency.middleware());
  for (const router of routers(deps)) app.use(router.routes()).use(router.allowedMethods());
  return app;
}

/** One router per resource, in the order they are matched. */
function routers({
  kernel,
  alerts,
  alertEvaluator,
  auth,
  specs,
  agents,
  bundles,
  secrets,
  sandboxes,
  runners,
  experiments,
  scoreRules,
  datasets,
  requester,
  terminals,
  ingest,
  registry,
}: AppDeps): Router[] {
  return [
    serviceInfoRouter(kernel),
    tracesRouter(kernel, ingest),
    otlpRouter(ingest, sandboxes),
    specsRouter(specs),
    agentsRouter(agents, kernel.config),
    bundlesRouter(bundles, kernel.config),
    spansRouter(kernel, agents),
    secretsRouter(secrets),
    sandboxesRouter({ kernel, auth, specs, agents, sandboxes, runners, requester, ingest }),
    sandboxShellRouter({ kernel, auth, specs, agents, sandboxes, runners, requester, terminals }),
    experimentsRouter({ kernel, auth, specs, agents, experiments, datasets }),
    datasetsRouter(kernel, datasets),
    scoringRouter({ kernel, specs, experiments, rules: scoreRules }),
    alertsRouter({ kernel, specs, experiments, alerts, evaluator: alertEvaluator }),
    adminRouter(kernel, auth),
    ...(registry ? [adminSchemaRegistry(registry)] : []),
  ];
}

/** The built-in schema registry under /schema-registry, for the admin key and the service key. */
function adminSchemaRegistry(registry: BuiltInRegistry): Router {
  const router = new Router({ prefix: SCHEMA_REGISTRY_PREFIX });
  router.use(async (ctx, next) => {
    const { kind } = ctx.state.principal as Principal;
    if (kind !== 'admin' && kind !== 'service') throw new AppError('forbidden', 'the schema registry needs the admin key or the service key (SVC_SERVICE_KEY)');
    return next();
  });
  const inner = schemaRegistryRouter(registry);
  router.use(inner.routes(), inner.allowedMethods());
  return router;
}
