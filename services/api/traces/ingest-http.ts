/**
 * Trace ingest as HTTP sees it: the checks and reads of a request that come before TraceIngest
 * (ingest.ts), which takes only bytes and header values.
 */
import type { Context } from 'koa';
import getRawBody from 'raw-body';
import { AppError } from '../../kernel/errors.ts';
import { MAX_INGEST_BODY_BYTES, tooLarge, type IngestBody } from './ingest.ts';
import { idempotencySeed } from '../middleware/idempotency.ts';

/** JSON ingest bodies are JSON: anything else is 415. */
export function requireJson(ctx: Context): void {
  if (!ctx.request.is('json')) throw new AppError('unsupported_media_type', `Content-Type must be application/json, got ${ctx.get('Content-Type') || 'none'}`);
}

/** Reads an ingest request's body as bytes (middleware/body-parsing.ts, before the idempotency check fingerprints it). */
export async function readIngestBody(ctx: Context): Promise<Buffer> {
  try {
    return await getRawBody(ctx.req, { limit: MAX_INGEST_BODY_BYTES });
  } catch (err) {
    // The rest of the body stays unread: close the connection rather than parse it as the next request.
    ctx.set('Connection', 'close');
    if ((err as { type?: string }).type === 'entity.too.large') throw tooLarge(MAX_INGEST_BODY_BYTES);
    throw new AppError('bad_request', `body: could not be read (${(err as Error).message})`);
  }
}

/** The body an ingest request posted (read by readIngestBody), how it is encoded, and its idempotency seed. */
export function postedBody(ctx: Context): IngestBody {
  return { bytes: ctx.state.rawBody as Buffer, contentEncoding: ctx.get('Content-Encoding'), idSeed: idempotencySeed(ctx) };
}

/** Whether the client asked to be answered before its events are queryable (RFC 7240 `Prefer: respond-async`). */
export function prefersRespondAsync(ctx: Context): boolean {
  return ctx
    .get('Prefer')
    .split(',')
    .some((preference) => preference.split(';')[0]!.trim().toLowerCase() === 'respond-async');
}

/**
 * Marks an answer given once the events were durably in the log, not yet queryable:
 * `Preference-Applied: respond-async` and the `SVC-Visibility-Token` to wait on (none when
 * nothing was stored), and 202 where the endpoint's protocol allows (OTLP answers 200).
 */
export function markRespondedAsync(ctx: Context, token: string | null, status: 200 | 202): void {
  ctx.set('Preference-Applied', 'respond-async');
  if (token) ctx.set('SVC-Visibility-Token', token);
  ctx.status = status;
}

/** The JSON answer of a trace-json ingest: `{ingested}`, and the visibility token of a respond-async one (202). */
export function ingestAnswer(
  ctx: Context,
  result: { count: number; visibilityToken: string | null },
  respondAsync: boolean,
): { ingested: number; visibility_token?: string } {
  if (!respondAsync) return { ingested: result.count };
  markRespondedAsync(ctx, result.visibilityToken, 202);
  return { ingested: result.count, ...(result.visibilityToken ? { visibility_token: result.visibilityToken } : {}) };
}
