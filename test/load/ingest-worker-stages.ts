/**
 * What each stage of the ingest worker (services/api/traces/ingest-worker.ts) costs, in µs per
 * event, on the bench's POST bodies (1,000 events of ~650 bytes each), in this process alone:
 *
 *   node --import tsx test/load/ingest-worker-stages.ts [rounds]
 *
 * The stages as the worker runs them: the body's text, the JSON depth check, JSON.parse,
 * validation, redaction (no secrets here), the records, and their Avro wire encoding. The first
 * tenth of the rounds warms the JIT up and is not counted.
 */
import { readFileSync } from 'node:fs';
import path from 'node:path';
import avro from 'avsc';
import { checkJsonDepth } from '../../services/api/json-depth.ts';
import { redactTraceEvents, traceRecords, UNTAGGED } from '../../services/api/traces/trace-records.ts';
import { validateTraceBatch } from '../../services/api/traces/validate-events.ts';
import { eventIds } from '../../services/kernel/ids.ts';
import { WireEncoder } from '../../services/kernel/schema/serde.ts';
import { traceBodies } from './bodies.ts';

const rounds = Number(process.argv[2] ?? 60);
const warmup = Math.ceil(rounds / 10);
const schema = JSON.parse(readFileSync(path.join(import.meta.dirname, '../../schemas/trace-events-ingested.avsc'), 'utf8'));
const type = avro.Type.forSchema(schema);
const encoder = new WireEncoder();
const bodies = traceBodies(8).map((b) => Buffer.from(b));
const limits = { maxEvents: 1000, maxFieldBytes: 4096, secrets: {} };
const stages = ['text', 'depth check', 'JSON.parse', 'validate', 'redact', 'records', 'Avro encode'] as const;
const ms = new Map<string, number>(stages.map((s) => [s, 0]));
let events = 0;

for (let round = 0; round < rounds; round++) {
  const counted = round >= warmup;
  for (const body of bodies) {
    let at = performance.now();
    const lap = (stage: (typeof stages)[number]) => {
      const now = performance.now();
      if (counted) ms.set(stage, ms.get(stage)! + now - at);
      at = now;
    };
    const text = body.toString('utf8');
    lap('text');
    checkJsonDepth(text);
    lap('depth check');
    const json = JSON.parse(text);
    lap('JSON.parse');
    const idOf = eventIds(null);
    const batch = validateTraceBatch(json, limits, idOf);
    lap('validate');
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
console.log('| stage | µs per event |\n|---|---:|');
for (const [stage, v] of ms) console.log(`| ${stage} | ${us(v)} |`);
console.log(`| in all | ${us([...ms.values()].reduce((a, b) => a + b, 0))} |`);
console.log(`(${events.toLocaleString('en-US')} events after ${warmup} warm-up rounds)`);
