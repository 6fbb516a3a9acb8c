/**
 * POST /otel/v1/traces: OTLP/HTTP trace ingest, protobuf or JSON, optionally gzip'd. Spans become
 * trace events of the key's tenant; with a sandbox token, of that sandbox, tagged and redacted
 * like POST /v1/sandboxes/:id/trace (docs/traces.md, "OTLP"); the answer is an
 * ExportTraceServiceResponse in the request's encoding, with partialSuccess for dropped spans.
 */
import Router from '@koa/router';
import type { Principal } from '../../kernel/auth.ts';
import { AppError } from '../../kernel/errors.ts';
import { encodeOtlpResponse, otlpJsonResponse } from '../traces/otlp-mapping.ts';
import type { SandboxCatalog } from '../catalogs/sandbox-catalog.ts';
import { type TraceIngest, untagged } from '../traces/ingest.ts';
import { markRespondedAsync, postedBody, prefersRespondAsync } from '../traces/ingest-http.ts';

/** Most bytes of an OTLP request body, after decompression. */
const MAX_BODY_BYTES = 16 * 1024 * 1024;

export function otlpRouter(ingest: TraceIngest, sandboxes: SandboxCatalog): Router {
  const router = new Router();

  router.post('/otel/v1/traces', async (ctx) => {
    const principal = ctx.state.principal as Principal;
    const type = ctx.request.is('application/x-protobuf', 'application/json');
    if (type !== 'application/x-protobuf' && type !== 'application/json') {
      throw new AppError('unsupported_media_type', `Content-Type must be application/x-protobuf or application/json, got ${ctx.get('Content-Type') || 'none'}`);
    }
    const format = type === 'application/x-protobuf' ? 'otlp-protobuf' : 'otlp-json';
    // A sandbox token posts as its sandbox (tagged, its secrets redacted), a key as its tenant.
    const source = principal.kind === 'sandbox' ? sandboxes.traceSource(sandboxes.owned(principal, principal.keyId)) : untagged(principal.tenant);
    const respondAsync = prefersRespondAsync(ctx);
    const decoded = await ingest.ingest(postedBody(ctx), {
      endpoint: '/otel/v1/traces',
      format,
      maxBodyBytes: MAX_BODY_BYTES,
      keyId: principal.keyId,
      source,
      respondAsync,
    });
    // OTLP/HTTP answers success with 200 only: the token is in the headers.
    if (respondAsync) markRespondedAsync(ctx, decoded.visibilityToken, 200);

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
