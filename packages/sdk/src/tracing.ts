/**
 * Client-side tracing: events are queued in memory and posted in batches to the sandbox's trace
 * endpoint, or to POST /v1/traces, or nowhere (service-spec.md, "Trace events written by
 * clients"). Posting is fire-and-forget: nothing here throws into, or waits inside, the agent.
 */
import { AsyncLocalStorage } from 'node:async_hooks';
import { randomBytes, randomUUID } from 'node:crypto';

export type EventType = 'llm_call' | 'tool_use' | 'tool_call';
export type Phase = 'start' | 'end' | 'complete' | 'invoked';

export interface TraceCost {
  model: string;
  input_tokens: number;
  output_tokens: number;
  cache_read_tokens: number;
  reasoning_tokens: number;
  estimated_usd: number;
}

/** One event as POST /v1/traces accepts it. */
export interface TraceEventBody {
  event_id: string;
  ts: string;
  event_type: EventType;
  tool: string;
  phase: Phase;
  span_id: string;
  parent_span_id?: string;
  trace_id: string;
  duration_ms: number;
  status: 'ok' | 'error';
  input?: string;
  output?: string;
  cost?: TraceCost;
  metadata?: Record<string, string>;
}

/** What a caller gives; ids, timestamp and tree links are filled in. */
export type EventInput = Omit<TraceEventBody, 'event_id' | 'ts' | 'span_id' | 'trace_id' | 'duration_ms' | 'status'> &
  Partial<Pick<TraceEventBody, 'ts' | 'span_id' | 'trace_id' | 'duration_ms' | 'status'>>;

export interface Span {
  span_id: string;
  trace_id: string;
}

export interface TracerOptions {
  baseUrl?: string;
  apiKey?: string;
  sandboxId?: string;
  /** Events per POST; also the queue length that triggers a flush. */
  batchSize?: number;
  flushIntervalMs?: number;
  /** Past this many queued events the oldest are dropped (and counted in `dropped`). */
  maxQueue?: number;
  /** Per-request timeout, so a hung destination cannot hold a flush forever. */
  requestTimeoutMs?: number;
  /**
   * Each POST is answered once the service holds the events durably (`Prefer: respond-async`),
   * not once they are queryable: fire and forget (default). `false`: read-your-writes, slower.
   * `visible()` waits for what was posted so far to become queryable.
   */
  respondAsync?: boolean;
}

/** Server-side truncation is at about 4 KB; cutting here too keeps batches small. */
const MAX_FIELD_CHARS = 4096;

export function newSpanId(): string {
  return randomBytes(8).toString('hex');
}

/** JSON of a value for an event's input/output, never throwing (cycles, BigInt). */
export function toField(value: unknown): string | undefined {
  if (value === undefined) return undefined;
  let text: string;
  try {
    text = typeof value === 'string' ? value : (JSON.stringify(value) ?? String(value));
  } catch {
    text = String(value);
  }
  return text.length > MAX_FIELD_CHARS ? text.slice(0, MAX_FIELD_CHARS) : text;
}

export class Tracer {
  /** Where batches go, or null: tracing is a no-op. */
  readonly endpoint: string | null;
  /** Events dropped because the queue was full or the service refused them. */
  dropped = 0;
  private readonly apiKey: string | undefined;
  private readonly batchSize: number;
  private readonly maxQueue: number;
  private readonly requestTimeoutMs: number;
  private readonly respondAsync: boolean;
  /** what the service acknowledged before it was queryable: the visibility tokens of every batch, merged */
  private lastToken: string | null = null;
  private readonly baseUrl: string;
  private readonly spans = new AsyncLocalStorage<Span>();
  private queue: TraceEventBody[] = [];
  private inFlight: Promise<boolean> | null = null;
  private timer: NodeJS.Timeout | null = null;

  constructor(options: TracerOptions = {}) {
    const baseUrl = (options.baseUrl ?? process.env.SVC_BASE_URL ?? '').replace(/\/+$/, '');
    this.apiKey = options.apiKey ?? process.env.SVC_API_KEY;
    const sandboxId = options.sandboxId ?? process.env.SVC_SANDBOX_ID;
    this.endpoint = !baseUrl
      ? null
      : sandboxId
        ? `${baseUrl}/v1/sandboxes/${encodeURIComponent(sandboxId)}/trace`
        : this.apiKey
          ? `${baseUrl}/v1/traces`
          : null;
    this.batchSize = options.batchSize ?? 100;
    this.maxQueue = options.maxQueue ?? 10_000;
    this.requestTimeoutMs = options.requestTimeoutMs ?? 10_000;
    this.respondAsync = options.respondAsync ?? true;
    this.baseUrl = baseUrl;
    if (this.endpoint) {
      this.timer = setInterval(() => void this.flush(), options.flushIntervalMs ?? 1000);
      // The interval must not keep a finished agent alive.
      this.timer.unref();
    }
  }

  get enabled(): boolean {
    return this.endpoint !== null;
  }

  /** Events queued and not yet posted. */
  get pending(): number {
    return this.queue.length;
  }

  /** The span the caller runs in, if any. */
  currentSpan(): Span | undefined {
    return this.spans.getStore();
  }

  /** Queues one event; returns its span id. Parent and trace default to the enclosing span. */
  emit(event: EventInput): string {
    const spanId = event.span_id ?? newSpanId();
    if (!this.endpoint) return spanId;
    const parent = this.currentSpan();
    const parentSpanId = event.parent_span_id ?? parent?.span_id;
    const full: TraceEventBody = {
      ...event,
      event_id: randomUUID(),
      ts: event.ts ?? new Date().toISOString(),
      span_id: spanId,
      trace_id: event.trace_id ?? parent?.trace_id ?? spanId,
      duration_ms: Math.max(0, Math.round(event.duration_ms ?? 0)),
      status: event.status ?? 'ok',
      ...(parentSpanId !== undefined && { parent_span_id: parentSpanId }),
    };
    this.enqueue([full]);
    if (this.queue.length >= this.batchSize) void this.flush();
    return spanId;
  }

  /**
   * Runs `fn` as a span: a `start` event, then an `end` event with its duration and status
   * `error` if it threw (the error is rethrown). Spans started inside become its children.
   */
  async traced<T>(name: string, fn: () => T | Promise<T>, options: { event_type?: EventType; input?: unknown } = {}): Promise<Awaited<T>> {
    const parent = this.currentSpan();
    const span: Span = { span_id: newSpanId(), trace_id: parent?.trace_id ?? '' };
    if (!span.trace_id) span.trace_id = span.span_id;
    const eventType = options.event_type ?? 'tool_call';
    const base = { event_type: eventType, tool: name, span_id: span.span_id, trace_id: span.trace_id, ...(parent && { parent_span_id: parent.span_id }) };
    this.emit({ ...base, phase: 'start', input: toField(options.input) });
    const started = performance.now();
    try {
      const result = await this.spans.run(span, fn);
      this.emit({ ...base, phase: 'end', duration_ms: performance.now() - started, output: toField(result) });
      return result;
    } catch (err) {
      this.emit({
        ...base,
        phase: 'end',
        status: 'error',
        duration_ms: performance.now() - started,
        output: toField(err instanceof Error ? err.message : err),
      });
      throw err;
    }
  }

  /** Runs `fn` with `span` as the enclosing span (used by wrappers that emit their own events). */
  withSpan<T>(span: Span, fn: () => T): T {
    return this.spans.run(span, fn);
  }

  /** Posts everything queued now; resolves when done, never rejects. */
  async flush(): Promise<void> {
    if (!this.endpoint) return;
    // One post at a time, so batches arrive in order and a slow destination is not piled on;
    // when the post in flight failed, waiting callers give up until the next interval.
    while (this.inFlight) if (!(await this.inFlight)) return;
    if (this.queue.length === 0) return;
    this.inFlight = this.drain();
    try {
      await this.inFlight;
    } finally {
      this.inFlight = null;
    }
  }

  /**
   * Flushes, then waits up to `waitMs` until everything posted so far is queryable (with
   * respond-async posts; at once otherwise). False when it is not by then or cannot be told.
   */
  async visible(waitMs = 10_000): Promise<boolean> {
    await this.flush();
    if (!this.endpoint || this.queue.length > 0) return this.queue.length === 0;
    if (!this.lastToken) return true;
    try {
      const url = `${this.baseUrl}/v1/traces/visibility?token=${encodeURIComponent(this.lastToken)}&wait=${Math.max(0, Math.round(waitMs))}ms`;
      const res = await fetch(url, {
        headers: { ...(this.apiKey && { authorization: `Bearer ${this.apiKey}` }) },
        signal: AbortSignal.timeout(waitMs + this.requestTimeoutMs),
      });
      return res.ok && ((await res.json()) as { visible?: boolean }).visible === true;
    } catch {
      return false;
    }
  }

  /**
   * Stops the interval and makes a last flush; then, for respond-async posts, waits (at most
   * `waitMs`) until what was posted is queryable, so a read after shutdown sees it.
   */
  async shutdown(waitMs = 10_000): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    await this.flush();
    if (this.lastToken) await this.visible(waitMs);
  }

  private enqueue(events: TraceEventBody[]): void {
    this.queue.push(...events);
    const excess = this.queue.length - this.maxQueue;
    if (excess > 0) {
      this.queue.splice(0, excess);
      this.dropped += excess;
    }
  }

  /** Posts batches until the queue is empty; false when the destination failed. */
  private async drain(): Promise<boolean> {
    while (this.queue.length > 0) {
      const batch = this.queue.splice(0, this.batchSize);
      const outcome = await this.post(batch);
      if (outcome === 'retry') {
        // Back to the front for the next flush; client-made event ids make a resend count once.
        this.queue.unshift(...batch);
        this.enqueue([]);
        return false;
      }
      if (outcome === 'rejected') this.dropped += batch.length;
    }
    return true;
  }

  private async post(batch: TraceEventBody[]): Promise<'ok' | 'retry' | 'rejected'> {
    try {
      const res = await fetch(this.endpoint!, {
        method: 'POST',
        headers: {
          'content-type': 'application/json',
          ...(this.apiKey && { authorization: `Bearer ${this.apiKey}` }),
          ...(this.respondAsync && { prefer: 'respond-async' }),
        },
        body: JSON.stringify({ events: batch }),
        signal: AbortSignal.timeout(this.requestTimeoutMs),
      });
      await res.arrayBuffer().catch(() => undefined);
      if (res.ok) {
        const token = res.headers.get('svc-visibility-token');
        if (token) this.lastToken = mergeVisibilityTokens(this.lastToken, token);
        return 'ok';
      }
      // A 4xx other than 429 will fail the same way again: give the batch up.
      return res.status === 429 || res.status >= 500 ? 'retry' : 'rejected';
    } catch {
      return 'retry';
    }
  }
}

/**
 * One visibility token for two (the service's `v1.` + base64url of `partition:offset` pairs): the
 * later offset of each partition, so one check covers every batch posted so far.
 */
export function mergeVisibilityTokens(a: string | null, b: string): string {
  if (!a) return b;
  const pairs = new Map<string, number>();
  for (const token of [a, b]) {
    if (!token.startsWith('v1.')) return b;
    for (const pair of Buffer.from(token.slice(3), 'base64url').toString('utf8').split(',')) {
      const [partition, offset] = pair.split(':');
      if (partition !== undefined && offset !== undefined) pairs.set(partition, Math.max(Number(offset), pairs.get(partition) ?? -1));
    }
  }
  return `v1.${Buffer.from([...pairs].map(([p, o]) => `${p}:${o}`).join(',')).toString('base64url')}`;
}

let defaultTracer: Tracer | null = null;

/** The process-wide tracer built from SVC_* env vars; flushed once when the event loop empties. */
export function getTracer(): Tracer {
  if (!defaultTracer) {
    const tracer = (defaultTracer = new Tracer());
    // `once`: a destination that keeps failing must not hold the process at exit.
    if (tracer.enabled) process.once('beforeExit', () => void tracer.shutdown());
  }
  return defaultTracer;
}

/** `traced()` on the default tracer. */
export function traced<T>(name: string, fn: () => T | Promise<T>, options?: { event_type?: EventType; input?: unknown }): Promise<Awaited<T>> {
  return getTracer().traced(name, fn, options);
}
