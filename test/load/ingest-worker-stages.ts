/**
 * What each stage of the ingest worker (services/api/traces/ingest-worker.ts) costs, in µs per
 * event, on the bench's bodies (1,000 events each: POST's trace JSON, or OTLP protobuf), in this
 * process alone:
 *
 *   node --import tsx test/load/ingest-worker-stages.ts [traces|otlp] [rounds]
 *
 * The stages as the worker runs them. traces: the body's text, the JSON depth check, JSON.parse,
 * validation; otlp: the protobuf decoding, the mapping onto trace events; then for both
 * redaction (no secrets here), the records, and their Avro wire encoding. The first tenth of the
 * rounds warms the JIT up and is not counted.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import avro from 'avsc';
import { checkJsonDepth } from '../../services/api/json-depth.ts';
import { decodeOtlpProtobuf, otlpToTraceEvents } from '../../services/api/traces/otlp-mapping.ts';
import { redactTraceEvents, traceRecords, UNTAGGED } from '../../services/api/traces/trace-records.ts';
import { validateTraceBatch } from '../../services/api/traces/validate-events.ts';
import type { TraceEvent } from '../../services/domain/events/trace-events.ts';
import { eventIds } from '../../services/kernel/ids.ts';
import { WireEncoder } from '../../services/kernel/schema/serde.ts';
import { otlpBodies, traceBodies } from './bodies.ts';

const kind = process.argv[2] === 'otlp' ? 'otlp' : 'traces';
const rounds = Number(process.argv[3] ?? 60);
const warmup = Math.ceil(rounds / 10);
const schema = JSON.parse(readFileSync(path.join(import.meta.dirname, '../../schemas/trace-events-ingested.avsc'), 'utf8'));
const type = avro.Type.forSchema(schema);
const encoder = new WireEncoder();
const bodies = kind === 'otlp' ? otlpBodies(8) : traceBodies(8).map((b) => Buffer.from(b));
const limits = { maxEvents: 1000, maxFieldBytes: 4096, secrets: {} };
const ms = new Map<string, number>();
let events = 0;

/** The body's events, timing each stage with `lap`. */
function parse(body: Uint8Array, lap: (stage: string) => void, idOf: (part: string) => string): TraceEvent[] {
  if (kind === 'otlp') {
    const request = decodeOtlpProtobuf(body, limits.maxEvents);
    lap('protobuf decode');
    const { events } = otlpToTraceEvents(request, limits);
    lap('OTLP mapping');
    return events;
  }
  const text = Buffer.from(body.buffer, body.byteOffset, body.byteLength).toString('utf8'); // a view, as the worker's inflate makes
  lap('text');
  checkJsonDepth(text);
  lap('depth check');
  const json = JSON.parse(text);
  lap('JSON.parse');
  const batch = validateTraceBatch(json, limits, idOf);
  lap('validate');
  return batch;
}

for (let round = 0; round < rounds; round++) {
  const counted = round >= warmup;
  for (const body of bodies) {
    let at = performance.now();
    const lap = (stage: string) => {
      const now = performance.now();
      if (counted) ms.set(stage, (ms.get(stage) ?? 0) + now - at);
      at = now;
    };
    const idOf = eventIds(null);
    const batch = parse(body, lap, idOf);
    redactTraceEvents(batch, {});
    lap('redact');
    const records = traceRecords('bench', batch, UNTAGGED, Date.now(), idOf);
    lap('records');
    for (const r of records) encoder.encode(type, 1, r.value);
    lap('Avro encode');
    if (counted) events += batch.length;
  }
}

const us = (v: number) => ((v * 1000) / events).toFixed(2);
console.log(`${kind}\n| stage | µs per event |\n|---|---:|`);
for (const [stage, v] of ms) console.log(`| ${stage} | ${us(v)} |`);
console.log(`| in all | ${us([...ms.values()].reduce((a, b) => a + b, 0))} |`);
console.log(`(${events.toLocaleString('en-US')} events after ${warmup} warm-up rounds)`);
