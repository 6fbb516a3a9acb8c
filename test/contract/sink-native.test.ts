/**
 * On chDB the sink stores trace events as Native blocks made from the log's Avro records at the
 * byte level (sink/trace-event-block.ts) instead of mapping them to rows in JS objects
 * (traceEventRows, still the path of the ClickHouse server). Both must store the same rows: one
 * varied batch goes through each into two tables of the same shape and every column is compared.
 * Records written by another version of the schema are stored too (read through the resolver and
 * re-encoded), and bytes that are not a value of the schema fail the block rather than store garbage.
 */
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
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
import { traceEventRows } from '../../services/sink/rows.ts';
import { TRACE_EVENT_BLOCK_COLUMN_NAMES, traceEventBlock, type TraceRecordBody } from '../../services/sink/trace-event-block.ts';

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
      event({
        event_id: 'a1',
        event_type: 'llm_call',
        cost: { input_tokens: 1200, output_tokens: 30, cache_read_tokens: 7, reasoning_tokens: 9, model: 'gpt-4o', estimated_usd: 0.0123 },
        metadata: { 'gen_ai.system': 'openai', n: '3' },
      }),
      event({
        event_id: 'a2',
        status: 'error',
        parent_span_id: 'b7ad6b7169203331',
        span_id: 'c1',
        input: '{"cmd":"ls ☃"}',
        output: 'ünïcode\nline\ttab "quoted" \\ back',
        cost: { input_tokens: 0, output_tokens: 0, cache_read_tokens: 0, reasoning_tokens: 0, model: '', estimated_usd: 0 },
      }),
      event({ event_id: 'a3', phase: 'start', duration_ms: 0, ts_us: 1_764_000_000_000_001 }),
      event({ event_id: 'a4', phase: 'end', duration_ms: 4_000_000, input: '', output: '' }),
      event({
        event_id: 'a5',
        ts_us: -14_182_939_999_999,
        trace_id: '',
        metadata: { a: '1', b: '', ключ: 'значение' },
        cost: { input_tokens: 2 ** 40, output_tokens: 1, cache_read_tokens: 0, reasoning_tokens: 0, model: 'm', estimated_usd: 1e-9 },
      }),
      event({ event_id: 'a6', event_type: 'llm', status: 'errors' }),
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
  {
    tenant: 'acme',
    event_id: 'b3',
    ts: 1_764_000_003_000,
    sandbox_id: '',
    experiment_id: '',
    agent: '',
    agent_snapshot_id: '',
    agent_version: 7,
    scenario_id: '',
    run_id: '',
    events: [event({ event_id: 'c1' })],
  },
];

describe("the sink on chDB: the log's Avro records as Native blocks", () => {
  let root: string;
  let log: EmbeddedLog;
  let serde: EventSerde;
  let store: ChdbStore;
  let registry: BuiltInRegistry;

  before(async () => {
    root = await mkdtemp(join(tmpdir(), 'svc-sink-native-'));
    log = new EmbeddedLog({ dir: join(root, 'log'), fsync: 'never' });
    await log.start(catalog);
    registry = new BuiltInRegistry(log);
    await registry.start();
    serde = new EventSerde(registry, catalog);
    await serde.init();
    store = new ChdbStore({ path: join(root, 'chdb') });
    await store.migrate();
  });

  after(async () => {
    await store?.close();
    await log?.close();
    await rm(root, { recursive: true, force: true });
  });

  const record = (value: Buffer, offset: number): LogRecord & { value: Buffer } => ({
    topic: TOPICS.traces,
    partition: offset % 3,
    offset,
    key: null,
    value,
    headers: {},
    timestamp: 0,
  });

  const stored = (table: string) => store.query(`SELECT * FROM ${table} ORDER BY EventId`);

  /** As the sink does: each record's value in this process's schema, then one block of them all. */
  async function insertBlock(records: Array<LogRecord & { value: Buffer }>, into = 'trace_events'): Promise<void> {
    const bodies: TraceRecordBody[] = await Promise.all(
      records.map(async (r) => ({ partition: r.partition, offset: r.offset, body: await serde.currentBody(TOPICS.traces, r.value) })),
    );
    const block = traceEventBlock(bodies);
    assert.ok(block, 'the records hold events');
    await store.insertNative({ table: into, columns: TRACE_EVENT_BLOCK_COLUMN_NAMES, block: block.parts });
    block.release();
  }

  async function bothWays(batches: TraceEventsIngested[], firstOffset: number, table: string): Promise<Array<Record<string, unknown>>> {
    await store.command(`CREATE TABLE ${table}_from_rows AS trace_events`);
    await store.command(`CREATE TABLE ${table} AS trace_events`);
    const records = batches.map((batch, i) => record(serde.encode(TOPICS.traces, batch), firstOffset + i));
    await store.insert(
      `${table}_from_rows`,
      batches.flatMap((batch, i) => traceEventRows(batch, records[i])),
    );
    await insertBlock(records, table);
    const expected = await stored(`${table}_from_rows`);
    assert.deepEqual(await stored(table), expected);
    return expected;
  }

  it('stores every column as the JS row mapping does', async () => {
    const expected = await bothWays(BATCHES, 40, 'varied');
    assert.equal(expected.length, 8);
    // The cases the comparison rests on really are in the rows.
    const byId = new Map(expected.map((r) => [r.EventId, r]));
    assert.equal(byId.get('a1')!.HasCost, 1);
    assert.equal(byId.get('a2')!.HasCost, 1, 'a cost of zeros is a cost');
    assert.equal(byId.get('b1')!.HasCost, 0);
    assert.equal(byId.get('b1')!.SandboxId, null);
    assert.deepEqual(byId.get('a1')!.ResourceAttributes, {
      'svc.agent_snapshot_id': 'snap-1',
      'svc.agent_version': '0',
      'svc.scenario_id': 'scn-1',
      'svc.run_id': 'run-1',
    });
    assert.deepEqual(byId.get('c1')!.ResourceAttributes, { 'svc.agent_version': '7' });
    assert.equal(byId.get('a5')!.Timestamp, '1969-07-20 20:17:40.000001000', 'a time before the epoch');
    assert.equal(byId.get('a5')!.InputTokens, '1099511627776');
  });

  it('stores a large batch whose columns outgrow their first guess', async () => {
    const events = Array.from({ length: 3000 }, (_, i) =>
      event({
        event_id: `big-${i}`,
        span_id: `s${i}`,
        ts_us: 1_764_000_000_000_000 + i,
        input: 'é'.repeat(i % 7 === 0 ? 3000 : 10),
        output: i % 2 ? null : 'x',
        metadata: Object.fromEntries(Array.from({ length: i % 5 }, (_, k) => [`k${k}`, 'v'.repeat(k * 40)])),
      }),
    );
    const batches = [0, 1, 2].map((b) => ({ ...BATCHES[0]!, event_id: `big-batch-${b}`, events: events.slice(b * 1000, (b + 1) * 1000) }));
    const expected = await bothWays(batches, 60, 'large');
    assert.equal(expected.length, 3000);
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
    await insertBlock([record(olderSerde.encode(TOPICS.traces, batch), 90)]);
    const [got] = await store.query<{ SpanName: string; LogOffset: string }>("SELECT SpanName, LogOffset FROM trace_events WHERE EventId = 'old-1'");
    assert.deepEqual(got, { SpanName: 'from-an-older-writer', LogOffset: '90' });
  });

  it('fails the block on bytes that are not a value of the schema, storing nothing', async () => {
    const good = serde.encode(TOPICS.traces, BATCHES[1]);
    const before = await store.query<{ n: string }>('SELECT count() AS n FROM trace_events');
    const bad = [good.subarray(0, good.length - 9), Buffer.concat([good, Buffer.from([2])]), Buffer.concat([good.subarray(0, 5), Buffer.from([0x7f, 0xff])])];
    for (const [i, value] of bad.entries()) {
      await assert.rejects(insertBlock([record(good, 100), record(value, 101 + i)]), /not a value of the schema/);
    }
    assert.deepEqual(await store.query<{ n: string }>('SELECT count() AS n FROM trace_events'), before);
  });

  it('keeps a block intact while later blocks are made, and reuses its buffers once released', async () => {
    const columns = TRACE_EVENT_BLOCK_COLUMN_NAMES;
    const body = (batch: TraceEventsIngested) => serde.encode(TOPICS.traces, batch).subarray(5);
    const first = traceEventBlock([{ partition: 1, offset: 200, body: body({ ...BATCHES[1]!, events: [event({ event_id: 'held-1', tool: 'first' })] }) }])!;
    const second = traceEventBlock([{ partition: 1, offset: 201, body: body({ ...BATCHES[1]!, events: [event({ event_id: 'held-2', tool: 'second' })] }) }])!;
    await store.insertNative({ table: 'trace_events', columns, block: second.parts });
    await store.insertNative({ table: 'trace_events', columns, block: first.parts });
    const got = await store.query<{ EventId: string; SpanName: string }>(
      "SELECT EventId, SpanName FROM trace_events WHERE EventId LIKE 'held-%' ORDER BY EventId",
    );
    assert.deepEqual(got, [
      { EventId: 'held-1', SpanName: 'first' },
      { EventId: 'held-2', SpanName: 'second' },
    ]);
    first.release();
    const third = traceEventBlock([{ partition: 1, offset: 202, body: body(BATCHES[1]!) }])!;
    assert.equal(third.parts.at(-1)!.buffer, first.parts.at(-1)!.buffer, "the released buffers are the next block's");
    third.release();
    second.release();
  });

  it('writes blocks over a few inbox files instead of a file per insert', async () => {
    const columns = TRACE_EVENT_BLOCK_COLUMN_NAMES;
    const insert = async (i: number) => {
      const block = traceEventBlock([
        { partition: 2, offset: 300 + i, body: serde.encode(TOPICS.traces, { ...BATCHES[1]!, events: [event({ event_id: `inbox-${i}` })] }).subarray(5) },
      ])!;
      await store.insertNative({ table: 'trace_events', columns, block: block.parts });
      block.release();
    };
    for (let i = 0; i < 10; i++) await insert(i);
    await Promise.all([10, 11, 12].map(insert));
    const inbox = await readdir(join(root, 'chdb', 'svc-native-inserts'));
    assert.ok(inbox.length <= 3, `inbox files: ${inbox.join(', ')}`);
    const [{ n }] = await store.query<{ n: string }>("SELECT count() AS n FROM trace_events WHERE EventId LIKE 'inbox-%'");
    assert.equal(n, '13');
  });

  it('makes no block of records without events', () => {
    assert.equal(traceEventBlock([{ partition: 0, offset: 1, body: serde.encode(TOPICS.traces, { ...BATCHES[1]!, events: [] }).subarray(5) }]), null);
  });
});
