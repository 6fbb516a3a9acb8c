import type { Context, Next } from 'koa';
import type { Auth } from '../../kernel/auth.ts';
import { AppError } from '../../kernel/errors.ts';
import { SPEC_SCHEMA_PATH } from '../../domain/spec.ts';

/** Reachable without a key. */
const PUBLIC_PATHS = new Set(['/health', SPEC_SCHEMA_PATH]);
/** The OTLP exporter's endpoint, which a sandbox token may also post to. */
const OTLP_PATH = '/otel/v1/traces';
/** Where the built-in schema registry is served: all a service key reaches. */
export const SCHEMA_REGISTRY_PREFIX = '/schema-registry';

/**
 * Sets `ctx.state.principal` from the Authorization header (a 401 without a valid one), except
 * on the public paths. A sandbox token is valid only for its own sandbox's resources, and its
 * OTLP exporter; a service key only for the schema registry.
 */
export function authentication(auth: Auth) {
  return async (ctx: Context, next: Next) => {
    if (PUBLIC_PATHS.has(ctx.path)) return next();
    const principal = auth.authenticate(ctx.get('Authorization') || undefined);
    ctx.state.principal = principal;
    if (principal.kind === 'sandbox' && !ctx.path.startsWith(`/v1/sandboxes/${principal.keyId}`) && ctx.path !== OTLP_PATH) {
      throw new AppError('forbidden', 'a sandbox token is valid only for its own sandbox (/v1/sandboxes/<its id>) and /otel/v1/traces');
    }
    if (principal.kind === 'service' && !ctx.path.startsWith(`${SCHEMA_REGISTRY_PREFIX}/`)) {
      throw new AppError('forbidden', `the service key (SVC_SERVICE_KEY) is valid only for ${SCHEMA_REGISTRY_PREFIX}`);
    }
    return next();
  };
}
