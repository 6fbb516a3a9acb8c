import type { Context } from 'koa';
import { badRequest } from '../kernel/errors.ts';

/** The request's JSON object body; an absent body is `{}`, anything but an object a 400. */
export function jsonBody(ctx: Context): Record<string, unknown> {
  const b = ctx.request.body;
  if (b === undefined || b === null || b === '') return {};
  if (typeof b !== 'object' || Array.isArray(b)) throw badRequest('body', 'must be a JSON object');
  return b as Record<string, unknown>;
}
