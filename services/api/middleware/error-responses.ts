import type { Context, Next } from 'koa';
import { AppError, type ErrorCode } from '../../kernel/errors.ts';
import type { Logger } from '../../kernel/logger.ts';

/** Status codes raised by Koa and koa-body themselves, mapped onto the error catalog. */
const HTTP_TO_CODE: Record<number, ErrorCode> = {
  400: 'bad_request',
  401: 'unauthorized',
  403: 'forbidden',
  404: 'not_found',
  409: 'conflict',
  413: 'payload_too_large',
  415: 'unsupported_media_type',
  429: 'rate_limited',
};

/**
 * Renders every failure as `{message, error}` from the error catalog. Client errors keep their
 * message; anything unexpected is a 500 `internal` that names the request id, never a stack.
 */
export function errorMiddleware(logger: Logger) {
  return async (ctx: Context, next: Next) => {
    try {
      await next();
      if (ctx.status === 404 && ctx.body === undefined) {
        throw new AppError('not_found', `no route ${ctx.method} ${ctx.path}`);
      }
    } catch (err) {
      renderError(ctx, err, logger);
    }
  };
}

export function renderError(ctx: Context, err: unknown, logger: Logger): void {
  const error = toAppError(err);
  if (error.code === 'internal') {
    logger.error({ err: error.cause ?? err, request_id: ctx.state.requestId, tenant: ctx.state.principal?.tenant, path: ctx.path }, 'request failed');
  }
  ctx.status = error.status;
  if (error.retryAfter !== undefined) ctx.set('Retry-After', String(error.retryAfter));
  ctx.body = { message: error.code === 'internal' ? `internal error (request ${ctx.state.requestId})` : error.message, error: error.code };
}

function toAppError(err: unknown): AppError {
  if (err instanceof AppError) return err;
  const status = (err as { status?: unknown; statusCode?: unknown })?.status ?? (err as { statusCode?: unknown })?.statusCode;
  if (typeof status === 'number' && HTTP_TO_CODE[status]) {
    const code = HTTP_TO_CODE[status];
    const raw = (err as Error).message;
    const message =
      code === 'bad_request' && /JSON|Unexpected|token/i.test(raw)
        ? `body: invalid JSON (${raw})`
        : code === 'payload_too_large'
          ? `body: larger than the limit (${raw})`
          : raw;
    return new AppError(code, message);
  }
  return new AppError('internal', 'internal error', { cause: err });
}
