/**
 * Validation of trace events posted by clients (POST /v1/traces, and the sandbox and OTLP
 * ingest paths of later issues). Every problem is a 400 naming the field, e.g. `events[3].ts`.
 * Valid events are normalised into the TraceEvent shape of schemas/trace-events-ingested.avsc.
 */
import { badRequest } from '../../kernel/errors.ts';
import type { TraceEvent } from '../../domain/events/trace-events.ts';
import { eventIds } from '../../kernel/ids.ts';
import { isObject } from '../../kernel/is-object.ts';
import { redactSecrets } from '../../kernel/tenant-secrets.ts';

export const EVENT_TYPES = ['llm_call', 'tool_use', 'tool_call'] as const;
const PHASES = ['start', 'end', 'complete', 'invoked'] as const;
const STATUSES = ['ok', 'error'] as const;

const ISO_8601 = /^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?(Z|[+-]\d{2}:?\d{2})$/;
const ID = /^[\x21-\x7e]{1,128}$/;

/** Parses an ISO 8601 timestamp with a zone into microseconds since the epoch; null if invalid. */
export function parseTimestampUs(value: unknown): number | null {
  if (typeof value !== 'string') return null;
  const m = ISO_8601.exec(value);
  if (!m) return null;
  const second = secondMs(m[1]!, m[3]!);
  if (Number.isNaN(second)) return null;
  const fraction = (m[2] ?? '').padEnd(9, '0');
  return second * 1000 + Number(fraction.slice(0, 6));
}

/**
 * The epoch milliseconds of a whole second with its zone. Date.parse was most of the parse's
 * time, and the events of a batch mostly share their second: the last answer is kept.
 */
let lastSecond = { text: '', zone: '', ms: NaN };
function secondMs(text: string, zone: string): number {
  if (text !== lastSecond.text || zone !== lastSecond.zone) lastSecond = { text, zone, ms: Date.parse(`${text}${zone}`) };
  return lastSecond.ms;
}

/** Formats microseconds since the epoch as ISO 8601 UTC: milliseconds, or microseconds when present. */
export function formatTimestampUs(us: number): string {
  const ms = Math.floor(us / 1000);
  const iso = new Date(ms).toISOString();
  const micros = us - ms * 1000;
  return micros === 0 ? iso : `${iso.slice(0, -1)}${String(micros).padStart(3, '0')}Z`;
}

/** Limits of one ingest request, and the secret values its text is redacted of as it is cut. */
export interface TraceLimits {
  maxEvents: number;
  maxFieldBytes: number;
  secrets?: Record<string, string>;
}

function optionalString(event: Record<string, unknown>, field: string, at: string): string | null {
  const value = event[field];
  if (value === undefined || value === null) return null;
  if (typeof value !== 'string') throw badRequest(`${at}.${field}`, 'must be a string');
  return value;
}

function oneOf<T extends string>(value: unknown, allowed: readonly T[], field: string, fallback?: T): T {
  if (value === undefined && fallback !== undefined) return fallback;
  if (typeof value !== 'string' || !(allowed as readonly string[]).includes(value)) {
    throw badRequest(field, `must be one of ${allowed.join(', ')}`);
  }
  return value as T;
}

function nonNegativeInt(value: unknown, field: string, fallback = 0): number {
  if (value === undefined || value === null) return fallback;
  if (typeof value !== 'number' || !Number.isSafeInteger(value) || value < 0) throw badRequest(field, 'must be a non-negative integer');
  return value;
}

function validateCost(value: unknown, at: string): TraceEvent['cost'] {
  if (value === undefined || value === null) return null;
  if (!isObject(value)) throw badRequest(at, 'must be an object');
  const usd = value.estimated_usd ?? 0;
  if (typeof usd !== 'number' || !Number.isFinite(usd) || usd < 0) throw badRequest(`${at}.estimated_usd`, 'must be a non-negative number');
  const model = value.model ?? '';
  if (typeof model !== 'string') throw badRequest(`${at}.model`, 'must be a string');
  return {
    input_tokens: nonNegativeInt(value.input_tokens, `${at}.input_tokens`),
    output_tokens: nonNegativeInt(value.output_tokens, `${at}.output_tokens`),
    cache_read_tokens: nonNegativeInt(value.cache_read_tokens, `${at}.cache_read_tokens`),
    reasoning_tokens: nonNegativeInt(value.reasoning_tokens, `${at}.reasoning_tokens`),
    model,
    estimated_usd: usd,
  };
}

function validateMetadata(value: unknown, at: string): Record<string, string> {
  if (value === undefined || value === null) return {};
  if (!isObject(value)) throw badRequest(at, 'must be an object');
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(value)) out[k] = typeof v === 'string' ? v : JSON.stringify(v);
  return out;
}

function validateEvent(raw: unknown, at: string, limits: TraceLimits, serverId: () => string): TraceEvent {
  if (!isObject(raw)) throw badRequest(at, 'must be an object');
  const ts = parseTimestampUs(raw.ts);
  if (ts === null) throw badRequest(`${at}.ts`, 'must be an ISO 8601 timestamp with a zone, e.g. 2026-01-31T12:00:00.000Z');
  const spanId = raw.span_id;
  if (typeof spanId !== 'string' || !ID.test(spanId)) throw badRequest(`${at}.span_id`, 'must be a non-empty string of at most 128 visible characters');
  const parent = optionalString(raw, 'parent_span_id', at);
  if (parent !== null && parent !== '' && !ID.test(parent)) throw badRequest(`${at}.parent_span_id`, 'must be at most 128 visible characters');
  const traceId = optionalString(raw, 'trace_id', at);
  if (traceId !== null && !ID.test(traceId)) throw badRequest(`${at}.trace_id`, 'must be a non-empty string of at most 128 visible characters');
  const eventId = optionalString(raw, 'event_id', at);
  if (eventId !== null && !ID.test(eventId)) throw badRequest(`${at}.event_id`, 'must be a non-empty string of at most 128 visible characters');
  const tool = raw.tool;
  if (typeof tool !== 'string' || tool.length === 0 || tool.length > 256)
    throw badRequest(`${at}.tool`, 'must be a non-empty string of at most 256 characters');
  const input = optionalString(raw, 'input', at);
  const output = optionalString(raw, 'output', at);
  return {
    event_id: eventId ?? serverId(),
    ts_us: ts,
    event_type: oneOf(raw.event_type, EVENT_TYPES, `${at}.event_type`),
    tool,
    phase: oneOf(raw.phase, PHASES, `${at}.phase`),
    trace_id: traceId ?? '',
    span_id: spanId,
    parent_span_id: parent === '' ? null : parent,
    duration_ms: nonNegativeInt(raw.duration_ms, `${at}.duration_ms`),
    status: oneOf(raw.status, STATUSES, `${at}.status`, 'ok'),
    // Redacted before the cut: a value across it would leave its beginning (the rest of the event is redacted after).
    input: input === null ? null : redactSecrets(input, limits.secrets ?? {}, { maxBytes: limits.maxFieldBytes }),
    output: output === null ? null : redactSecrets(output, limits.secrets ?? {}, { maxBytes: limits.maxFieldBytes }),
    cost: validateCost(raw.cost, `${at}.cost`),
    metadata: validateMetadata(raw.metadata, `${at}.metadata`),
  };
}

/**
 * Without a `trace_id`, an event's trace is the span id of its root, reached through
 * `parent_span_id` (docs/decisions.md). Resolved within the batch; when the chain leaves the batch
 * the last parent named is taken as the root.
 */
function resolveTraceIds(events: TraceEvent[]): void {
  const parentOf = new Map<string, string | null>();
  const traceOf = new Map<string, string>();
  for (const e of events) {
    if (!parentOf.has(e.span_id) || e.parent_span_id !== null) parentOf.set(e.span_id, e.parent_span_id);
    if (e.trace_id !== '') traceOf.set(e.span_id, e.trace_id);
  }
  for (const e of events) {
    if (e.trace_id !== '') continue;
    let span = e.span_id;
    const seen = new Set<string>();
    while (!traceOf.has(span)) {
      const parent = parentOf.get(span);
      if (parent === undefined || parent === null || seen.has(parent)) break;
      seen.add(span);
      span = parent;
    }
    e.trace_id = traceOf.get(span) ?? span;
  }
}

/**
 * Accepts `{events: [...]}` or a bare array; returns the normalised events. An event without an
 * `event_id` gets `idOf('event <its position>')`.
 */
export function validateTraceBatch(body: unknown, limits: TraceLimits, idOf = eventIds(null)): TraceEvent[] {
  const list = Array.isArray(body) ? body : isObject(body) ? body.events : undefined;
  const field = Array.isArray(body) ? 'body' : 'events';
  if (!Array.isArray(list)) throw badRequest(field, 'must be an array of trace events');
  if (list.length > limits.maxEvents) throw badRequest(field, `at most ${limits.maxEvents} events per request, got ${list.length}`);
  const events = list.map((raw, i) => validateEvent(raw, `${field}[${i}]`, limits, () => idOf(`event ${i}`)));
  resolveTraceIds(events);
  return events;
}
