/**
 * OTLP trace ingest (POST /otel/v1/traces): decoding an ExportTraceServiceRequest (protobuf with
 * the official opentelemetry-proto schema in ./otlp-proto, or OTLP/JSON) and mapping its spans
 * onto trace events. The mapping is documented in docs/traces.md, section "OTLP".
 */
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import protobuf from 'protobufjs';
import { badRequest } from '../../kernel/errors.ts';
import type { TraceEvent } from '../../domain/events/trace-events.ts';
import type { TraceLimits } from './validate-events.ts';
import { isObject } from '../../kernel/is-object.ts';
import { redactSecrets } from '../../kernel/tenant-secrets.ts';
import { readTraceRequest } from './otlp-wire.ts';

const PROTO_DIR = fileURLToPath(new URL('./otlp-proto/', import.meta.url));
const root = new protobuf.Root();
// Imports in the .proto files are relative to the opentelemetry-proto repository root.
root.resolvePath = (_origin, target) => (path.isAbsolute(target) ? target : path.join(PROTO_DIR, target));
root.loadSync('opentelemetry/proto/collector/trace/v1/trace_service.proto');
const ResponseType = root.lookupType('opentelemetry.proto.collector.trace.v1.ExportTraceServiceResponse');

/**
 * Decodes protobuf bytes into the OTLP/JSON-like object shape (camelCase, ids as bytes, enums as
 * numbers), its 64-bit integers left as protobufjs's Long objects: making them strings (long.js
 * divides in JavaScript) cost as much as the decoding itself, 1.9 µs per span.
 */
export function decodeOtlpProtobuf(body: Uint8Array, maxSpans: number): unknown {
  let read: ReturnType<typeof readTraceRequest>;
  try {
    read = readTraceRequest(body, maxSpans);
  } catch (err) {
    throw badRequest('body', `not an OTLP ExportTraceServiceRequest protobuf (${(err as Error).message})`);
  }
  if (read.spans > maxSpans) throw tooManySpans(maxSpans, read.spans);
  return read.request;
}

const tooManySpans = (max: number, got: number) => badRequest('resourceSpans', `at most ${max} spans per request, got ${got}`);

interface OtlpPartialSuccess {
  rejectedSpans: number;
  errorMessage: string;
}

/** An ExportTraceServiceResponse as protobuf bytes. */
export function encodeOtlpResponse(partial: OtlpPartialSuccess | null): Uint8Array {
  return ResponseType.encode(ResponseType.fromObject(partial ? { partialSuccess: partial } : {})).finish();
}

/** An ExportTraceServiceResponse in OTLP/JSON (int64 as a string, as proto3 JSON has it). */
export function otlpJsonResponse(partial: OtlpPartialSuccess | null): object {
  return partial ? { partialSuccess: { rejectedSpans: String(partial.rejectedSpans), errorMessage: partial.errorMessage } } : {};
}

type Obj = Record<string, unknown>;

function list(value: unknown, field: string): unknown[] {
  if (value === undefined || value === null) return [];
  if (!Array.isArray(value)) throw badRequest(field, 'must be an array');
  return value;
}

/** A span's problem: the span is dropped and counted in partialSuccess. */
class SpanRejected extends Error {}

/** A 64-bit integer as protobuf decoding leaves it (a Long: two 32-bit halves), as a bigint. */
function longValue(value: protobuf.Long): bigint {
  const bits = (BigInt(value.high >>> 0) << 32n) | BigInt(value.low >>> 0);
  return value.unsigned ? bits : BigInt.asIntN(64, bits);
}

/** Only what decodeOtlpProtobuf made is a Long: an OTLP/JSON body cannot pass an object for a number. */
function isLong(value: unknown): value is protobuf.Long {
  return value instanceof protobuf.util.Long;
}

/** Trace and span ids: bytes from protobuf, hex from OTLP/JSON; all-zero ids are invalid (OTLP). */
function hexId(value: unknown, bytes: number, field: string, optional: boolean): string | null {
  let hex: string | null = null;
  if (value instanceof Uint8Array) {
    if (value.length === 0 && optional) return null;
    if (value.length === bytes) hex = Buffer.from(value.buffer, value.byteOffset, value.length).toString('hex');
  } else if (value === undefined || value === null || value === '') {
    if (optional) return null;
  } else if (typeof value === 'string' && value.length === bytes * 2 && /^[0-9a-fA-F]+$/.test(value)) {
    hex = value.toLowerCase();
  }
  if (hex === null || /^0+$/.test(hex)) throw new SpanRejected(`${field} must be ${bytes} bytes (${bytes * 2} hex digits), not all zero`);
  return hex;
}

/** fixed64 nanoseconds: a string or number (OTLP/JSON), or a Long after protobuf decoding. */
function nanos(value: unknown, field: string): bigint | null {
  if (isLong(value)) return value.low === 0 && value.high === 0 ? null : longValue(value);
  if (value === undefined || value === null || value === '' || value === 0 || value === '0') return null;
  if (typeof value === 'string' && /^\d+$/.test(value)) return BigInt(value);
  if (typeof value === 'number' && Number.isSafeInteger(value) && value > 0) return BigInt(value);
  throw new SpanRejected(`${field} must be an unsigned integer of nanoseconds`);
}

/** An AnyValue as the string a metadata value is: scalars as text, arrays and maps as JSON. */
function anyValueString(value: unknown): string {
  const v = anyValueJson(value);
  return typeof v === 'string' ? v : v === null ? '' : JSON.stringify(v);
}

function anyValueJson(value: unknown): unknown {
  if (!isObject(value)) return null;
  if (typeof value.stringValue === 'string') return value.stringValue;
  if (typeof value.boolValue === 'boolean') return value.boolValue;
  if (isLong(value.intValue)) return String(longValue(value.intValue));
  if (value.intValue !== undefined) return typeof value.intValue === 'string' ? value.intValue : Number(value.intValue);
  if (value.doubleValue !== undefined) return Number(value.doubleValue);
  if (value.bytesValue instanceof Uint8Array) return Buffer.from(value.bytesValue).toString('base64');
  if (typeof value.bytesValue === 'string') return value.bytesValue;
  if (isObject(value.arrayValue)) return (Array.isArray(value.arrayValue.values) ? value.arrayValue.values : []).map(anyValueJson);
  if (isObject(value.kvlistValue)) {
    const out: Obj = {};
    for (const kv of Array.isArray(value.kvlistValue.values) ? value.kvlistValue.values : [])
      if (isObject(kv) && typeof kv.key === 'string') out[kv.key] = anyValueJson(kv.value);
    return out;
  }
  return null;
}

/** A value cut to the field limit, its secrets redacted before the cut (a value across it would leave its beginning). */
function fieldText(value: string, limits: TraceLimits): string {
  return redactSecrets(value, limits.secrets ?? {}, { maxBytes: limits.maxFieldBytes });
}

function flattenAttributes(attributes: unknown, prefix: string, into: Record<string, string>, limits: TraceLimits): void {
  if (!Array.isArray(attributes)) return;
  for (const kv of attributes) {
    if (isObject(kv) && typeof kv.key === 'string' && kv.key !== '') into[prefix + kv.key] = fieldText(anyValueString(kv.value), limits);
  }
}

const LLM_OPERATIONS = new Set(['chat', 'text_completion', 'generate_content']);
const LLM_MARKERS = ['gen_ai.request.model', 'gen_ai.system', 'gen_ai.provider.name'];

function tokens(attrs: Record<string, string>, key: string): number | undefined {
  const value = attrs[key];
  if (value === undefined) return undefined;
  const n = Number(value);
  if (!Number.isSafeInteger(n) || n < 0) throw new SpanRejected(`attribute ${key} must be a non-negative integer`);
  return n;
}

function costOf(attrs: Record<string, string>): TraceEvent['cost'] {
  const input = tokens(attrs, 'gen_ai.usage.input_tokens');
  const output = tokens(attrs, 'gen_ai.usage.output_tokens');
  const cacheRead = tokens(attrs, 'gen_ai.usage.cache_read.input_tokens');
  const reasoning = tokens(attrs, 'gen_ai.usage.reasoning.output_tokens');
  const usdKey = attrs['svc.cost_usd'] !== undefined ? 'svc.cost_usd' : 'gen_ai.usage.cost';
  const usd = attrs[usdKey] === undefined ? undefined : Number(attrs[usdKey]);
  if (usd !== undefined && (!Number.isFinite(usd) || usd < 0)) throw new SpanRejected(`attribute ${usdKey} must be a non-negative number`);
  if (input === undefined && output === undefined && usd === undefined) return null;
  return {
    input_tokens: input ?? 0,
    output_tokens: output ?? 0,
    cache_read_tokens: cacheRead ?? 0,
    reasoning_tokens: reasoning ?? 0,
    model: attrs['gen_ai.response.model'] ?? attrs['gen_ai.request.model'] ?? '',
    estimated_usd: usd ?? 0,
  };
}

function spanToEvent(span: unknown, resource: Record<string, string>, at: string, limits: TraceLimits): TraceEvent {
  if (!isObject(span)) throw new SpanRejected(`${at} must be an object`);
  const traceId = hexId(span.traceId, 16, `${at}.traceId`, false)!;
  const spanId = hexId(span.spanId, 8, `${at}.spanId`, false)!;
  const parent = hexId(span.parentSpanId, 8, `${at}.parentSpanId`, true);
  const name = typeof span.name === 'string' ? span.name : '';
  if (name === '') throw new SpanRejected(`${at}.name must not be empty`);
  const start = nanos(span.startTimeUnixNano, `${at}.startTimeUnixNano`);
  if (start === null) throw new SpanRejected(`${at}.startTimeUnixNano is missing`);
  const end = nanos(span.endTimeUnixNano, `${at}.endTimeUnixNano`) ?? start;
  if (end < start) throw new SpanRejected(`${at}.endTimeUnixNano is before startTimeUnixNano`);

  // The span's attributes over its resource's, built in place: a spread of the two maps took half
  // the mapping's time and made the records' encoding slower. The resource's keys all begin
  // `resource.`, so the span's own attributes are looked up in the same map.
  const attrs: Record<string, string> = Object.assign({}, resource);
  flattenAttributes(span.attributes, '', attrs, limits);
  const status = isObject(span.status) ? span.status : {};
  const error = status.code === 2 || status.code === 'STATUS_CODE_ERROR';
  if (error && typeof status.message === 'string' && status.message !== '') attrs['otel.status_message'] = fieldText(status.message, limits);

  const operation = attrs['gen_ai.operation.name'];
  const toolUse = operation === 'execute_tool';
  const llm = !toolUse && ((operation !== undefined && LLM_OPERATIONS.has(operation)) || LLM_MARKERS.some((k) => attrs[k] !== undefined));
  const input = attrs['gen_ai.prompt'] ?? attrs['input.value'];
  const output = attrs['gen_ai.completion'] ?? attrs['output.value'];
  const tool = redactSecrets(toolUse ? attrs['gen_ai.tool.name'] || name : name, limits.secrets ?? {});
  return {
    // Deterministic, so an exporter's retry of the same batch is stored once.
    event_id: `otlp-${traceId}-${spanId}`,
    ts_us: Number(start / 1000n),
    event_type: toolUse ? 'tool_use' : llm ? 'llm_call' : 'tool_call',
    tool: tool.length > 256 ? redactSecrets(tool.slice(0, 256), limits.secrets ?? {}, { cut: true }) : tool,
    phase: 'complete',
    trace_id: traceId,
    span_id: spanId,
    parent_span_id: parent,
    duration_ms: Number((end - start) / 1_000_000n),
    status: error ? 'error' : 'ok',
    input: input ?? null,
    output: output ?? null,
    cost: costOf(attrs),
    metadata: attrs,
  };
}

interface OtlpMapped {
  events: TraceEvent[];
  rejected: number;
  /** One line per rejected span (at most a few), for partialSuccess.errorMessage. */
  errors: string[];
}

/**
 * Maps every span of an ExportTraceServiceRequest to a trace event. A malformed request shape is
 * a 400; a malformed span is dropped and counted, so the rest of the batch is stored.
 */
export function otlpToTraceEvents(request: unknown, limits: TraceLimits): OtlpMapped {
  if (!isObject(request)) throw badRequest('body', 'must be an ExportTraceServiceRequest object');
  const resourceSpans = list(request.resourceSpans, 'resourceSpans');
  const batches: { spans: unknown[]; resource: Record<string, string>; at: string }[] = [];
  let total = 0;
  resourceSpans.forEach((rs, i) => {
    if (!isObject(rs)) throw badRequest(`resourceSpans[${i}]`, 'must be an object');
    const resource: Record<string, string> = {};
    if (isObject(rs.resource)) flattenAttributes(rs.resource.attributes, 'resource.', resource, limits);
    list(rs.scopeSpans, `resourceSpans[${i}].scopeSpans`).forEach((ss, j) => {
      if (!isObject(ss)) throw badRequest(`resourceSpans[${i}].scopeSpans[${j}]`, 'must be an object');
      const spans = list(ss.spans, `resourceSpans[${i}].scopeSpans[${j}].spans`);
      total += spans.length;
      batches.push({ spans, resource, at: `resourceSpans[${i}].scopeSpans[${j}].spans` });
    });
  });
  if (total > limits.maxEvents) throw tooManySpans(limits.maxEvents, total);

  const out: OtlpMapped = { events: [], rejected: 0, errors: [] };
  for (const { spans, resource, at } of batches) {
    spans.forEach((span, k) => {
      try {
        const event = spanToEvent(span, resource, `${at}[${k}]`, limits);
        out.events.push(event);
      } catch (err) {
        if (!(err instanceof SpanRejected)) throw err;
        out.rejected++;
        if (out.errors.length < 5) out.errors.push(err.message);
      }
    });
  }
  return out;
}
