/**
 * POST /otel/v1/traces: OTLP/HTTP trace ingest, protobuf or JSON, optionally gzip'd. Spans become
 * trace events of the key's tenant; with a sandbox token, of that sandbox, tagged and redacted
 * like POST /v1/sandboxes/:id/trace (docs/traces.md, "OTLP"); the answer is an
 * ExportTraceServiceResponse in the request's encoding, with partialSuccess for dropped spans.
 */
import Router from '@koa/router';
import type { Kernel } from '../../kernel/actor.ts';
import type { Principal } from '../../kernel/auth.ts';
import { AppError } from '../../kernel/errors.ts';
import type { RateLimiter } from '../middleware/rate-limit.ts';
import { encodeOtlpResponse, otlpJsonResponse } from '../traces/otlp.ts';
import type { SandboxDirectory } from '../sandboxes.ts';
import { sandboxContext, type TraceIngest, UNTAGGED } from '../traces/ingest.ts';

/** Most bytes of an OTLP request body, after decompression. */
const MAX_BODY_BYTES = 16 * 1024 * 1024;

export function otlpRouter(kernel: Kernel, ingest: TraceIngest, sandboxes: SandboxDirectory, ingestLimiter: RateLimiter): Router {
  const router = new Router();

  router.post('/otel/v1/traces', async (ctx) => {
    const principal = ctx.state.principal as Principal;
    const type = ctx.request.is('application/x-protobuf', 'application/json');
    if (type !== 'application/x-protobuf' && type !== 'application/json') {
      throw new AppError('unsupported_media_type', `Content-Type must be application/x-protobuf or application/json, got ${ctx.get('Content-Type') || 'none'}`);
    }
    const format = type === 'application/x-protobuf' ? 'otlp-protobuf' : 'otlp-json';
    const sandbox = principal.kind === 'sandbox' ? sandboxes.owned(principal, principal.keyId) : null;
    const decoded = await ingest.decode(ctx, {
      format,
      maxBodyBytes: MAX_BODY_BYTES,
      tenant: principal.tenant,
      context: sandbox ? sandboxContext(sandbox) : UNTAGGED,
      secrets: sandbox ? sandboxes.secretsOf(sandbox) : {},
    });
    ingestLimiter.take(principal.keyId, decoded.count);
    await ingest.append(principal.tenant, decoded);
    kernel.metrics.ingestedEvents.inc({ endpoint: '/otel/v1/traces' }, decoded.count);

    const { rejected, errors } = decoded;
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
