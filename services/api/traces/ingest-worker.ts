/**
 * The CPU-bound half of trace ingest, run in worker threads (piscina) so the api's event loop
 * only moves bytes: inflate, parse (trace JSON, OTLP protobuf or OTLP/JSON), validate, redact,
 * and encode the svc.traces records in the wire format. Measured on 2 cores, this work was
 * about half of the event loop's time per ingested event (docs/performance.md).
 *
 * A request's own mistakes come back as `{ok: false, code, message}` (they are AppErrors here,
 * but errors do not cross threads as classes); anything else rejects the task.
 */
import zlib from 'node:zlib';
import { workerData } from 'node:worker_threads';
import avro from 'avsc';
import { AppError, type ErrorCode } from '../../kernel/errors.ts';
import { eventIds } from '../../kernel/ids.ts';
import type { TraceEvent } from '../../domain/events/trace-events.ts';
import { WireEncoder } from '../../kernel/schema/serde.ts';
import { decodeOtlpProtobuf, otlpToTraceEvents } from './otlp-mapping.ts';
import { redactTraceEvents, traceRecords, type IngestContext } from './trace-records.ts';
import { validateTraceBatch } from './validate-events.ts';
import { checkJsonDepth } from '../json-depth.ts';

export type IngestFormat = 'trace-json' | 'otlp-protobuf' | 'otlp-json';

export interface IngestTask {
  format: IngestFormat;
  /** The request body as received. */
  body: Uint8Array;
  gzip: boolean;
  /** Most bytes of the body after inflating. */
  maxBodyBytes: number;
  limits: { maxEvents: number; maxFieldBytes: number };
  tenant: string;
  context: IngestContext;
  /** Values to redact, by secret name. */
  secrets: Record<string, string>;
  ts: number;
  /** The seed of the ids the server makes (IngestBody.idSeed). */
  idSeed: string | null;
}

export type IngestOutcome =
  | { ok: true; count: number; rejected: number; errors: string[]; records: Array<{ key: string; value: Uint8Array }> }
  | { ok: false; code: ErrorCode; message: string };

export interface IngestWorkerData {
  /** The svc.traces value schema and its registry id, as the api process registered them. */
  schema: avro.Schema;
  schemaId: number;
}

const { schema, schemaId } = workerData as IngestWorkerData;
const type = avro.Type.forSchema(schema);
const encoder = new WireEncoder();

function inflate(task: IngestTask): Buffer {
  const body = Buffer.from(task.body.buffer, task.body.byteOffset, task.body.byteLength);
  if (!task.gzip) return body;
  try {
    return zlib.gunzipSync(body, { maxOutputLength: task.maxBodyBytes });
  } catch (err) {
    if ((err as { code?: string }).code === 'ERR_BUFFER_TOO_LARGE')
      throw new AppError('payload_too_large', `body: larger than the limit of ${task.maxBodyBytes} bytes`);
    throw new AppError('bad_request', `body: not valid gzip (${(err as Error).message})`);
  }
}

function parseJson(body: Buffer): unknown {
  const text = body.toString('utf8');
  checkJsonDepth(text);
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new AppError('bad_request', `body: invalid JSON (${(err as Error).message})`);
  }
}

function events(task: IngestTask, body: Buffer, idOf: (part: string) => string): { events: TraceEvent[]; rejected: number; errors: string[] } {
  // Fields cut at the limits are redacted as they are cut.
  const limits = { ...task.limits, secrets: task.secrets };
  switch (task.format) {
    case 'trace-json':
      return { events: validateTraceBatch(parseJson(body), limits, idOf), rejected: 0, errors: [] };
    case 'otlp-json':
      return otlpToTraceEvents(parseJson(body), limits);
    case 'otlp-protobuf':
      return otlpToTraceEvents(decodeOtlpProtobuf(body, limits.maxEvents), limits);
  }
}

export default function encodeIngest(task: IngestTask): IngestOutcome {
  try {
    const idOf = eventIds(task.idSeed);
    const mapped = events(task, inflate(task), idOf);
    redactTraceEvents(mapped.events, task.secrets);
    const records = mapped.events.length === 0 ? [] : traceRecords(task.tenant, mapped.events, task.context, task.ts, idOf);
    return {
      ok: true,
      count: mapped.events.length,
      rejected: mapped.rejected,
      errors: mapped.errors,
      records: records.map((r) => ({ key: r.key, value: encoder.encode(type, schemaId, r.value) })),
    };
  } catch (err) {
    if (err instanceof AppError) return { ok: false, code: err.code, message: err.message };
    throw err;
  }
}
