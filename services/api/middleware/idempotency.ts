import type { Context, Next } from 'koa';
import type { Kernel } from '../../kernel/actor.ts';
import { EntityCatalog } from '../../kernel/entity-view.ts';
import { AppError, badRequest } from '../../kernel/errors.ts';
import { renderError } from './error-responses.ts';
import { createHash } from 'node:crypto';
import { newEventId, sha256Hex } from '../../kernel/ids.ts';
import { TOPICS } from '../../kernel/topics.ts';
import type { Principal } from '../../kernel/auth.ts';

interface RecordedResponse {
  tenant: string;
  event_id: string;
  ts: number;
  key_id: string;
  idempotency_key: string;
  fingerprint: string;
  status: number;
  content_type: string;
  body: Buffer;
}

const UNPARSED = Symbol.for('unparsedBody');
const HEADER_VALUE = /^[\x21-\x7e]{1,255}$/;

/**
 * `Idempotency-Key` on POST: the first response (2xx or a client error other than 409/429) is
 * recorded on the svc.idempotency topic and replayed, without re-running, to a retry with the
 * same key from the same API key within SVC_IDEMPOTENCY_TTL. Because the record is an event on
 * the log, the cache survives a restart. Reusing a key for a different request is a 409, as is
 * a retry that arrives while the first is still running.
 *
 * The response is recorded after the request's own events are on the log, so a crash in between
 * leaves them there unanswered, and the retry runs the request again. `ctx.state.idempotencySeed`
 * (tenant, key, Idempotency-Key and the request's fingerprint) is what the handlers derive their
 * server-made ids from, so that run makes the same events, which consumers keep once (trace
 * ingest: traces/ingest.ts), and the same entities, which the handlers find and answer with
 * instead of making another (an experiment, a sandbox).
 */
/** The seed of this request's server-made ids (an `Idempotency-Key` request's), or null. */
export function idempotencySeed(ctx: Context): string | null {
  return (ctx.state.idempotencySeed as string | undefined) ?? null;
}

export class Idempotency extends EntityCatalog<RecordedResponse> {
  private readonly inFlight = new Set<string>();

  constructor(kernel: Kernel) {
    super(kernel, TOPICS.idempotency);
  }

  middleware() {
    return async (ctx: Context, next: Next) => {
      const idempotencyKey = ctx.get('Idempotency-Key');
      if (ctx.method !== 'POST' || idempotencyKey === '') return next();
      if (!HEADER_VALUE.test(idempotencyKey)) throw badRequest('Idempotency-Key header', 'must be 1-255 visible ASCII characters');
      const principal = ctx.state.principal as Principal;
      const mapKey = `${principal.keyId}:${idempotencyKey}`;
      const body = (ctx.request as { body?: Record<symbol, unknown> }).body;
      // Ingest bodies are read raw (traces/ingest.ts), the others parsed by koa-body.
      const raw: unknown = ctx.state.rawBody ?? body?.[UNPARSED];
      const fingerprint = createHash('sha256')
        .update(`${ctx.method} ${ctx.url}\n`)
        .update(Buffer.isBuffer(raw) || typeof raw === 'string' ? raw : JSON.stringify(body ?? null))
        .digest('hex');

      const recorded = this.view.entities.get(mapKey);
      if (recorded && recorded.ts + this.kernel.config.idempotencyTtl > Date.now()) {
        if (recorded.fingerprint !== fingerprint) {
          throw new AppError('conflict', `Idempotency-Key "${idempotencyKey}" was already used for a different request`);
        }
        ctx.status = recorded.status;
        ctx.type = recorded.content_type;
        ctx.body = recorded.body;
        ctx.set('Idempotent-Replayed', 'true');
        return;
      }
      if (this.inFlight.has(mapKey)) throw new AppError('conflict', `a request with Idempotency-Key "${idempotencyKey}" is still in progress`);
      this.inFlight.add(mapKey);
      ctx.state.idempotencySeed = sha256Hex(`${principal.tenant}\n${mapKey}\n${fingerprint}`);
      try {
        try {
          await next();
        } catch (err) {
          renderError(ctx, err, this.kernel.logger);
        }
        if (ctx.status >= 500 || ctx.status === 409 || ctx.status === 429 || ctx.status === 401) return;
        await this.testHold(idempotencyKey);
        const payload =
          ctx.body === undefined || ctx.body === null
            ? Buffer.alloc(0)
            : Buffer.isBuffer(ctx.body)
              ? ctx.body
              : Buffer.from(typeof ctx.body === 'string' ? ctx.body : JSON.stringify(ctx.body));
        const record: RecordedResponse = {
          tenant: principal.tenant,
          event_id: newEventId(),
          ts: Date.now(),
          key_id: principal.keyId,
          idempotency_key: idempotencyKey,
          fingerprint,
          status: ctx.status,
          content_type: ctx.response.get('Content-Type') || 'application/json; charset=utf-8',
          body: payload,
        };
        await this.append([{ key: mapKey, tenant: principal.tenant, value: record }]);
      } finally {
        this.inFlight.delete(mapKey);
      }
    };
  }

  /** SVC_TEST_IDEMPOTENCY_HOLD: a window between handling and recording, for crash tests to kill the process in. */
  private async testHold(idempotencyKey: string): Promise<void> {
    const ms = this.kernel.config.testIdempotencyHold;
    if (ms === 0) return;
    this.kernel.logger.warn({ idempotency_key: idempotencyKey, hold_ms: ms }, 'holding before recording the idempotent response');
    await new Promise((resolve) => setTimeout(resolve, ms));
  }
}
