/**
 * The one way trace events enter the service, whatever the endpoint (POST /v1/traces,
 * POST /v1/sandboxes/:id/trace, POST /otel/v1/traces): the body is parsed, validated, redacted
 * and encoded by a worker thread (ingest-worker.ts), the events are stamped with the tenant and
 * the tags of where they came from, appended to svc.traces, and the request is answered once
 * the sink made them queryable (read-your-writes); or, when the client prefers
 * (`Prefer: respond-async`), as soon as the log holds them durably, with a visibility token to
 * wait on later (GET /v1/traces/visibility). Such answers stop (503 `overloaded`) while the sink
 * is more than SVC_INGEST_MAX_LAG records behind, so what is acknowledged but not yet queryable
 * stays bounded.
 */
import os from 'node:os';
import { Piscina } from 'piscina';
import { publishEncoded, type Kernel } from '../../kernel/actor.ts';
import { AppError } from '../../kernel/errors.ts';
import { TOPICS } from '../../kernel/topics.ts';
import type { RecordPosition } from '../../kernel/log/event-log.ts';
import { encodeVisibilityToken } from './visibility-token.ts';
import type { IngestFormat, IngestOutcome, IngestTask, IngestWorkerData } from './ingest-worker.ts';
import { RateLimiter } from '../middleware/rate-limit.ts';
import { UNTAGGED, type IngestContext } from './trace-records.ts';

/** Most bytes of an ingest request body, as sent and after inflating; OTLP allows less. */
export const MAX_INGEST_BODY_BYTES = 32 * 1024 * 1024;

/** A body larger than `limit` bytes: 413. */
export const tooLarge = (limit: number) => new AppError('payload_too_large', `body: larger than the limit of ${limit} bytes`);

/** An ingest request's body as it was posted: its bytes and its Content-Encoding header ('' when none). */
export interface IngestBody {
  bytes: Buffer;
  contentEncoding: string;
  /**
   * With an Idempotency-Key, the request's seed (middleware/idempotency.ts): the ids the server
   * makes (events without an `event_id`, records) derive from it, so a retry of a request that
   * was appended but never answered stores the same events again, which the store keeps once.
   * Null: random ids.
   */
  idSeed: string | null;
}

/** A decoded ingest request: how many events it holds (for the rate limit) and their encoded records. */
export type DecodedIngest = Extract<IngestOutcome, { ok: true }>;

/** Where a request's events come from: their tenant, the tags they carry, the secret values to redact. */
export interface TraceSource {
  tenant: string;
  context: IngestContext;
  secrets: Record<string, string>;
}

/** Events posted with an API key: the key's tenant, no sandbox, nothing to redact. */
export function untagged(tenant: string): TraceSource {
  return { tenant, context: UNTAGGED, secrets: {} };
}

/** One ingest request, as its endpoint describes it. */
export interface IngestRequest {
  endpoint: string;
  format: IngestFormat;
  maxBodyBytes: number;
  keyId: string;
  source: TraceSource;
  /** answer once the log holds the events (with a visibility token), not once they are queryable */
  respondAsync?: boolean;
}

/** What was ingested, and the visibility token of a respond-async answer (else null). */
export type IngestResult = DecodedIngest & { visibilityToken: string | null };

/** How often a respond-async ingest reads the sink's lag. */
const LAG_READ_MS = 250;

export class TraceIngest {
  private pool: Piscina<IngestTask, IngestOutcome> | null = null;
  private lag = 0;
  private lagReadAt = 0;
  /** Trace events per second per API key, whichever endpoint they come through. */
  private readonly limiter: RateLimiter;

  constructor(private readonly kernel: Kernel) {
    this.limiter = new RateLimiter(kernel.config.rateLimitIngestEvents, 'ingested trace events');
  }

  /**
   * One ingest request end to end: decode its body in a worker, count its events against the
   * key's rate limit, append them and wait until they are queryable. Returns what was decoded
   * (OTLP answers with the spans it rejected).
   */
  async ingest(body: IngestBody, request: IngestRequest): Promise<IngestResult> {
    if (request.respondAsync) await this.checkLag();
    const { metrics } = this.kernel;
    let stage = metrics.ingestStageSeconds.startTimer({ stage: 'decode' });
    const decoded = await this.decode(body, request.format, request.maxBodyBytes, request.source);
    stage();
    this.limiter.take(request.keyId, decoded.count);
    stage = metrics.ingestStageSeconds.startTimer({ stage: 'append' });
    const positions = await this.append(request.source.tenant, decoded);
    stage();
    if (!request.respondAsync) {
      stage = metrics.ingestStageSeconds.startTimer({ stage: 'visible' });
      await this.kernel.visibility.waitFor(positions, this.kernel.config.replyTimeout);
      stage();
    }
    metrics.ingestedEvents.inc({ endpoint: request.endpoint }, decoded.count);
    return { ...decoded, visibilityToken: request.respondAsync && positions.length > 0 ? encodeVisibilityToken(positions) : null };
  }

  /** 503 `overloaded` while the sink is further behind than SVC_INGEST_MAX_LAG records (read at most every LAG_READ_MS). */
  private async checkLag(): Promise<void> {
    if (Date.now() - this.lagReadAt > LAG_READ_MS) {
      this.lagReadAt = Date.now();
      this.lag = await this.kernel.visibility.lag(TOPICS.traces);
    }
    const max = this.kernel.config.ingestMaxLag;
    if (this.lag > max)
      throw new AppError(
        'overloaded',
        `the sink is ${this.lag} trace records behind (more than SVC_INGEST_MAX_LAG, ${max}); retry after the Retry-After delay`,
        { retryAfter: 1 },
      );
  }

  async start(): Promise<void> {
    const { serde } = this.kernel;
    const workerData: IngestWorkerData = { schema: serde.type(TOPICS.traces).schema() as IngestWorkerData['schema'], schemaId: serde.schemaId(TOPICS.traces) };
    this.pool = new Piscina({
      filename: new URL('./ingest-worker.mjs', import.meta.url).href,
      workerData,
      // One per core: while the event loop appends and waits, the workers parse the next bodies.
      maxThreads: os.availableParallelism(),
      minThreads: 1,
      idleTimeout: 60_000,
    });
    // A worker that fails outside a task (e.g. cannot load) is logged; its tasks reject as 500s.
    this.pool.on('error', (err: unknown) => this.kernel.logger.error({ err }, 'ingest worker failed'));
  }

  async stop(): Promise<void> {
    await this.pool?.destroy();
    this.pool = null;
  }

  /** Has a worker parse, validate, redact and encode the request body; a 4xx AppError for a bad body. */
  private async decode(posted: IngestBody, format: IngestFormat, maxBodyBytes: number, source: TraceSource): Promise<DecodedIngest> {
    const encoding = (posted.contentEncoding || 'identity').toLowerCase();
    if (encoding !== 'identity' && encoding !== 'gzip')
      throw new AppError('unsupported_media_type', `Content-Encoding ${encoding} is not supported (gzip or none)`);
    const body = posted.bytes;
    if (body.length > maxBodyBytes) throw tooLarge(maxBodyBytes);
    const { config } = this.kernel;
    // Moved, not copied, to the worker when the body owns its memory (raw-body's concat of a large body does).
    const transferList = body.byteOffset === 0 && body.byteLength === body.buffer.byteLength ? [body.buffer as ArrayBuffer] : [];
    const task: IngestTask = {
      format,
      body,
      gzip: encoding === 'gzip',
      maxBodyBytes,
      limits: { maxEvents: config.traceEventsPerRequest, maxFieldBytes: config.traceFieldBytes },
      tenant: source.tenant,
      context: source.context,
      secrets: source.secrets,
      ts: Date.now(),
      idSeed: posted.idSeed,
    };
    let outcome: IngestOutcome;
    try {
      outcome = await this.run(task, transferList);
    } catch (err) {
      if ((err as Error).name === 'AbortError')
        throw new AppError('unavailable', `the ingest workers did not answer within ${config.replyTimeout} ms`, { retryAfter: 1 });
      throw err;
    }
    if (!outcome.ok) throw new AppError(outcome.code, outcome.message);
    return outcome;
  }

  /** A task on the pool, given up after SVC_REPLY_TIMEOUT (a worker that cannot start never answers). */
  private run(task: IngestTask, transferList: ArrayBuffer[]): Promise<IngestOutcome> {
    return this.pool!.run(task, { transferList, signal: AbortSignal.timeout(this.kernel.config.replyTimeout) });
  }

  /** Appends decoded records; resolves with where they are once the log holds them durably. */
  private async append(tenant: string, decoded: DecodedIngest): Promise<RecordPosition[]> {
    if (decoded.records.length === 0) return [];
    const records = decoded.records.map((r) => ({ key: r.key, tenant, value: Buffer.from(r.value.buffer, r.value.byteOffset, r.value.byteLength) }));
    return publishEncoded(this.kernel, TOPICS.traces, records);
  }
}
