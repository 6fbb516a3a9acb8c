import type { Context, Next } from 'koa';
import type { Auth } from '../../kernel/auth.ts';
import { AppError } from '../../kernel/errors.ts';
import { SPEC_SCHEMA_PATH } from '../../domain/spec.ts';

/** Reachable without a key. */
const PUBLIC_PATHS = new Set(['/health', SPEC_SCHEMA_PATH]);
/** Beyond its own sandbox's paths, what a sandbox token may reach: its OTLP exporter's endpoint, and whether what it posted is queryable yet. */
const SANDBOX_TOKEN_PATHS = new Set(['/otel/v1/traces', '/v1/traces/visibility']);
/** Where the built-in schema registry is served: all a service key reaches. */
export const SCHEMA_REGISTRY_PREFIX = '/schema-registry';

/**
 * Sets `ctx.state.principal` from the Authorization header (a 401 without a valid one), except
 * on the public paths. A sandbox token is valid only for its own sandbox's resources, its OTLP
 * exporter and visibility checks; a service key only for the schema registry.
 */
export function authentication(auth: Auth) {
  return async (ctx: Context, next: Next) => {
    if (PUBLIC_PATHS.has(ctx.path)) return next();
    const principal = auth.authenticate(ctx.get('Authorization') || undefined);
    ctx.state.principal = principal;
    if (principal.kind === 'sandbox' && !ctx.path.startsWith(`/v1/sandboxes/${principal.keyId}`) && !SANDBOX_TOKEN_PATHS.has(ctx.path)) {
      throw new AppError('forbidden', 'a sandbox token is valid only for its own sandbox (/v1/sandboxes/<its id>), /otel/v1/traces and /v1/traces/visibility');
    }
    if (principal.kind === 'service' && !ctx.path.startsWith(`${SCHEMA_REGISTRY_PREFIX}/`)) {
      throw new AppError('forbidden', `the service key (SVC_SERVICE_KEY) is valid only for ${SCHEMA_REGISTRY_PREFIX}`);
    }
    return next();
  };
}
