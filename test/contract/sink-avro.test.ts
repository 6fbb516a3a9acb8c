/**
 * On chDB the sink stores trace events by handing the log's Avro records to the engine
 * (sink/log-records.ts, rows.ts traceEventSelect) instead of mapping them to rows in JS
 * (traceEventRows, still the path of the ClickHouse server). Both must store the same rows: one
 * varied batch goes through each into two tables of the same shape and every column is compared.
 * Records written by another version of the schema are stored too (read through the resolver and
 * re-encoded), and bytes the engine cannot read fail the insert rather than store garbage.
 */
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import type { TraceEvent, TraceEventsIngested } from '../../services/domain/events/trace-events.ts';
import { EmbeddedLog } from '../../services/kernel/log/embedded/embedded-log.ts';
import type { LogRecord, TopicSpec } from '../../services/kernel/log/event-log.ts';
import { BuiltInRegistry } from '../../services/kernel/schema/registry.ts';
import { EventSerde } from '../../services/kernel/schema/serde.ts';
import { ChdbStore } from '../../services/kernel/store/chdb-store.ts';
import { loadCatalog, REPO_ROOT, TOPICS } from '../../services/kernel/topics.ts';
import { LogRecordContainers } from '../../services/sink/log-records.ts';
import { TRACE_EVENT_COLUMNS, traceEventRows, traceEventSelect } from '../../services/sink/rows.ts';

const catalog: TopicSpec[] = loadCatalog().filter((t) => t.name === TOPICS.schemas || t.name === TOPICS.traces);

function event(over: Partial<TraceEvent>): TraceEvent {
  return {
    event_id: 'e',
    ts_us: 1_764_000_000_123_456,
    event_type: 'tool_call',
    tool: 'bash',
    phase: 'complete',
    trace_id: '0af7651916cd43dd8448eb211c80319c',
    span_id: 'b7ad6b7169203331',
    parent_span_id: null,
    duration_ms: 12,
    status: 'ok',
    input: null,
    output: null,
    cost: null,
    metadata: {},
    ...over,
  };
}

/** Batches covering every column's cases: nulls and empties, zero cost vs none, unicode, tags. */
const BATCHES: TraceEventsIngested[] = [
  {
    tenant: 'acme',
    event_id: 'b1',
    ts: 1_764_000_001_234,
    sandbox_id: 'sb-1',
    experiment_id: 'exp-1',
    agent: 'coder',
    agent_snapshot_id: 'snap-1',
    agent_version: 0,
    scenario_id: 'scn-1',
    run_id: 'run-1',
    events: [
      event({ event_id: 'a1', event_type: 'llm_call', cost: { input_tokens: 1200, output_tokens: 30, cache_read_tokens: 7, reasoning_tokens: 9, model: 'gpt-4o', estimated_usd: 0.0123 }, metadata: { 'gen_ai.system': 'openai', n: '3' } }),
      event({ event_id: 'a2', status: 'error', parent_span_id: 'b7ad6b7169203331', span_id: 'c1', input: '{"cmd":"ls ☃"}', output: 'ünïcode\nline\ttab "quoted" \\ back', cost: { input_tokens: 0, output_tokens: 0, cache_read_tokens: 0, reasoning_tokens: 0, model: '', estimated_usd: 0 } }),
      event({ event_id: 'a3', phase: 'start', duration_ms: 0, ts_us: 1_764_000_000_000_001 }),
      event({ event_id: 'a4', phase: 'end', duration_ms: 4_000_000, input: '', output: '' }),
    ],
  },
  {
    tenant: 'other',
    event_id: 'b2',
    ts: 1_764_000_002_000,
    sandbox_id: null,
    experiment_id: null,
    agent: null,
    agent_snapshot_id: null,
    agent_version: null,
    scenario_id: null,
    run_id: null,
    events: [event({ event_id: 'b1', tool: 'read_file', metadata: { path: '/workspace/x', '': 'empty key' } })],
  },
  { tenant: 'acme', event_id: 'b3', ts: 1_764_000_003_000, sandbox_id: '', experiment_id: '', agent: '', agent_snapshot_id: '', agent_version: 7, scenario_id: '', run_id: '', events: [event({ event_id: 'c1' })] },
];

describe('the sink on chDB: the log\'s Avro records stored by the engine', () => {
  let root: string;
  let log: EmbeddedLog;
  let serde: EventSerde;
  let store: ChdbStore;
  let containers: LogRecordContainers;
  let registry: BuiltInRegistry;

  before(async () => {
    root = await mkdtemp(join(tmpdir(), 'svc-sink-avro-'));
    log = new EmbeddedLog({ dir: join(root, 'log'), fsync: 'never' });
    await log.start(catalog);
    registry = new BuiltInRegistry(log);
    await registry.start();
    serde = new EventSerde(registry, catalog);
    await serde.init();
    store = new ChdbStore({ path: join(root, 'chdb') });
    await store.migrate();
    containers = new LogRecordContainers(serde, TOPICS.traces);
  });

  after(async () => {
    await store?.close();
    await log?.close();
    await rm(root, { recursive: true, force: true });
  });

  const record = (value: Buffer, offset: number): LogRecord & { value: Buffer } => ({ topic: TOPICS.traces, partition: offset % 3, offset, key: null, value, headers: {}, timestamp: 0 });

  const stored = (table: string) => store.query(`SELECT * FROM ${table} ORDER BY EventId`);

  it('stores every column as the JS row mapping does', async () => {
    await store.command('CREATE TABLE trace_events_from_rows AS trace_events');
    const records = BATCHES.map((batch, i) => record(serde.encode(TOPICS.traces, batch), 40 + i));
    await store.insert('trace_events_from_rows', BATCHES.flatMap((batch, i) => traceEventRows(batch, records[i])));
    const rows = await Promise.all(records.map((r) => containers.row(r)));
    await store.insertAvro({ table: 'trace_events', columns: TRACE_EVENT_COLUMNS, select: traceEventSelect, container: containers.container(rows) });

    const expected = await stored('trace_events_from_rows');
    assert.equal(expected.length, 6);
    assert.deepEqual(await stored('trace_events'), expected);
    // The cases the comparison rests on really are in the rows.
    const byId = new Map(expected.map((r) => [r.EventId, r]));
    assert.equal(byId.get('a1')!.HasCost, 1);
    assert.equal(byId.get('a2')!.HasCost, 1, 'a cost of zeros is a cost');
    assert.equal(byId.get('b1')!.HasCost, 0);
    assert.equal(byId.get('b1')!.SandboxId, null);
    assert.deepEqual(byId.get('a1')!.ResourceAttributes, { 'svc.agent_snapshot_id': 'snap-1', 'svc.agent_version': '0', 'svc.scenario_id': 'scn-1', 'svc.run_id': 'run-1' });
    assert.deepEqual(byId.get('c1')!.ResourceAttributes, { 'svc.agent_version': '7' });
  });

  it('stores a record written with another version of the schema', async () => {
    // An older service's schema: TraceEventsIngested before `run_id` existed.
    const current = JSON.parse(await readFile(join(REPO_ROOT, 'schemas', 'trace-events-ingested.avsc'), 'utf8'));
    const older = { ...current, fields: current.fields.filter((f: { name: string }) => f.name !== 'run_id') };
    const dir = join(root, 'older-schemas');
    await mkdir(dir, { recursive: true });
    await writeFile(join(dir, 'trace-events-ingested.avsc'), JSON.stringify(older));
    const olderSerde = new EventSerde(registry, catalog, dir);
    await olderSerde.init();
    assert.notEqual(olderSerde.schemaId(TOPICS.traces), serde.schemaId(TOPICS.traces));

    const { run_id: _, ...batch } = { ...BATCHES[1], event_id: 'old', events: [event({ event_id: 'old-1', tool: 'from-an-older-writer' })] };
    const row = await containers.row(record(olderSerde.encode(TOPICS.traces, batch), 90));
    await store.insertAvro({ table: 'trace_events', columns: TRACE_EVENT_COLUMNS, select: traceEventSelect, container: containers.container([row]) });
    const [got] = await store.query<{ SpanName: string; LogOffset: string }>("SELECT SpanName, LogOffset FROM trace_events WHERE EventId = 'old-1'");
    assert.deepEqual(got, { SpanName: 'from-an-older-writer', LogOffset: '90' });
  });

  it('fails the insert on bytes that are not a value of the schema, storing nothing', async () => {
    const good = serde.encode(TOPICS.traces, BATCHES[1]);
    const truncated = good.subarray(0, good.length - 9);
    const before = await store.query<{ n: string }>('SELECT count() AS n FROM trace_events');
    const rows = [await containers.row(record(good, 100)), await containers.row(record(truncated, 101))];
    await assert.rejects(store.insertAvro({ table: 'trace_events', columns: TRACE_EVENT_COLUMNS, select: traceEventSelect, container: containers.container(rows) }));
    assert.deepEqual(await store.query<{ n: string }>('SELECT count() AS n FROM trace_events'), before);
  });
});
