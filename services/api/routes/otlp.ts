/**
 * POST /otel/v1/traces: OTLP/HTTP trace ingest, protobuf or JSON, optionally gzip'd. Spans become
 * trace events of the key's tenant; with a sandbox token, of that sandbox, tagged and redacted
 * like POST /v1/sandboxes/:id/trace (docs/traces.md, "OTLP"); the answer is an
 * ExportTraceServiceResponse in the request's encoding, with partialSuccess for dropped spans.
 */
import { promisify } from 'node:util';
import zlib from 'node:zlib';
import Router from '@koa/router';
import getRawBody from 'raw-body';
import type { Kernel } from '../../kernel/actor.ts';
import type { Principal } from '../../kernel/auth.ts';
import { AppError } from '../../kernel/errors.ts';
import type { RateLimiter } from '../middleware/rate-limit.ts';
import { decodeOtlpProtobuf, encodeOtlpResponse, otlpJsonResponse, otlpToTraceEvents } from '../traces/otlp.ts';
import type { SandboxDirectory } from '../sandboxes.ts';
import { ingestTraceEvents, redactTraceEvents, sandboxContext, UNTAGGED } from '../traces/ingest.ts';

/** Most bytes of an OTLP request body, after decompression. */
const MAX_BODY_BYTES = 16 * 1024 * 1024;
const gunzip = promisify(zlib.gunzip);

const tooLarge = () => new AppError('payload_too_large', `body: larger than the limit of ${MAX_BODY_BYTES} bytes`);

/** The protobuf body, read here because koa-body leaves non-JSON, non-text bodies unread. */
async function protobufBody(req: Parameters<typeof getRawBody>[0], encoding: string): Promise<Buffer> {
  const raw = await getRawBody(req, { limit: MAX_BODY_BYTES });
  if (encoding === 'identity') return raw;
  if (encoding !== 'gzip') throw new AppError('unsupported_media_type', `Content-Encoding ${encoding} is not supported (gzip or none)`);
  try {
    return await gunzip(raw, { maxOutputLength: MAX_BODY_BYTES });
  } catch (err) {
    if ((err as { code?: string }).code === 'ERR_BUFFER_TOO_LARGE') throw tooLarge();
    throw new AppError('bad_request', `body: not valid gzip (${(err as Error).message})`);
  }
}

export function otlpRouter(kernel: Kernel, sandboxes: SandboxDirectory, ingestLimiter: RateLimiter): Router {
  const router = new Router();
  const { config } = kernel;

  router.post('/otel/v1/traces', async (ctx) => {
    const principal = ctx.state.principal as Principal;
    const type = ctx.request.is('application/x-protobuf', 'application/json');
    let request: unknown;
    if (type === 'application/x-protobuf') {
      request = decodeOtlpProtobuf(await protobufBody(ctx.req, (ctx.get('Content-Encoding') || 'identity').toLowerCase()));
    } else if (type === 'application/json') {
      // koa-body has parsed (and inflated) it under its own, larger limit.
      const unparsed = (ctx.request.body as Record<symbol, unknown> | undefined)?.[Symbol.for('unparsedBody')];
      if (typeof unparsed === 'string' && Buffer.byteLength(unparsed) > MAX_BODY_BYTES) throw tooLarge();
      request = ctx.request.body;
    } else {
      throw new AppError('unsupported_media_type', `Content-Type must be application/x-protobuf or application/json, got ${ctx.get('Content-Type') || 'none'}`);
    }

    const { events, rejected, errors } = otlpToTraceEvents(request, { maxEvents: config.traceEventsPerRequest, maxFieldBytes: config.traceFieldBytes });
    ingestLimiter.take(principal.keyId, events.length);
    if (principal.kind === 'sandbox') {
      const sandbox = sandboxes.owned(principal, principal.keyId);
      redactTraceEvents(events, sandboxes.secretsOf(sandbox));
      await ingestTraceEvents(kernel, principal.tenant, events, sandboxContext(sandbox));
    } else {
      await ingestTraceEvents(kernel, principal.tenant, events, UNTAGGED);
    }
    kernel.metrics.ingestedEvents.inc({ endpoint: '/otel/v1/traces' }, events.length);

    const partial = rejected > 0 ? { rejectedSpans: rejected, errorMessage: errors.join('; ') } : null;
    if (type === 'application/x-protobuf') {
      ctx.type = 'application/x-protobuf';
      ctx.body = Buffer.from(encodeOtlpResponse(partial));
    } else {
      ctx.body = otlpJsonResponse(partial);
    }
  });

  return router;
}
