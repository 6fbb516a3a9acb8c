/**
 * chDB with no service around it, for `npm run bench` (run as a child process: libchdb binds one
 * data directory per process and is large to fork from, so the bench process never loads it).
 *
 *   node --import tsx test/load/chdb-direct.ts ceiling <traces|otlp> <events> [rows|native] [dir] [batch rows]
 *     The ingest ceiling: the bench's own request bodies as the sink would store them, into a
 *     fresh store on a temp dir, in batches of 20,000 events (or `batch rows`), two at
 *     a time like the sink's two insert lanes. `rows`: the rows services/sink/rows.ts builds,
 *     through ChdbStore.insert (JSONCompactEachRow; the sink's path on a ClickHouse server).
 *     `native`: the log records' Native blocks (sink/trace-event-block.ts), made beforehand,
 *     through ChdbStore.insertNative (the sink's path on chDB). Prints {"rows_per_s": n} and the
 *     process's CPU per row while inserting (chDB's threads, merges included). With a `dir`, the
 *     store is made there and left for the caller to remove (the bench removes its stores at the
 *     end: on a journal-less ext4, thousands of inodes just removed slow the next run's inserts).
 *   node --import tsx test/load/chdb-direct.ts fill <data dir> <events>
 *     Fills <data dir>/chdb (the service's store) with <events> realistic trace events (see FILL)
 *     and prints the trace ids, experiments, sandboxes and agents to query.
 *   node --import tsx test/load/chdb-direct.ts optimize <data dir>
 *     Merges trace_events down (OPTIMIZE ... FINAL) and prints the parts before and after.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { ChdbStore } from '../../services/kernel/store/chdb-store.ts';
import type { LogRecord } from '../../services/kernel/log/event-log.ts';
import type { TraceEvent, TraceEventsIngested } from '../../services/domain/events/trace-events.ts';
import { traceEventRows } from '../../services/sink/rows.ts';
import { TRACE_EVENT_BLOCK_COLUMN_NAMES, traceEventBlock, type TraceRecordBody } from '../../services/sink/trace-event-block.ts';
import { EmbeddedLog } from '../../services/kernel/log/embedded/embedded-log.ts';
import { BuiltInRegistry } from '../../services/kernel/schema/registry.ts';
import { EventSerde } from '../../services/kernel/schema/serde.ts';
import { loadCatalog, TOPICS } from '../../services/kernel/topics.ts';
import { validateTraceBatch } from '../../services/api/traces/validate-events.ts';
import { decodeOtlpProtobuf, otlpToTraceEvents } from '../../services/api/traces/otlp-mapping.ts';
import { UNTAGGED } from '../../services/api/traces/trace-records.ts';
import { otlpBodies, traceBodies } from './bodies.ts';

const LIMITS = { maxEvents: 1000, maxFieldBytes: 4096 };
const LANES = 2;

/**
 * 10M events shaped like real ingest, generated in ClickHouse: one tenant (the worst case: every
 * filter but the tenant is served by skip indexes); 16 concurrent streams of events (agents
 * running at once), 12 of them in experiment sandboxes, 4 untagged; per stream, traces of 30
 * spans (a tree of fan-out 3, LLM calls and 20 tools, one start/end pair in 10), sandboxes of
 * 10 traces, experiments of 20 sandboxes (about 1,250 experiments and 25,000 sandboxes at 10M);
 * timestamps spread evenly over the last 7 days (8 daily partitions); input and output of a
 * few hundred bytes; span and resource attribute maps. LogPartition 999 (no partition of
 * svc.traces): the sink's replay guard (max LogOffset per partition) never skips a later record.
 * Params {tenant}, {start_us}, {step_us}, {events}.
 */
export const FILL = `
INSERT INTO trace_events (Timestamp, TraceId, SpanId, ParentSpanId, SpanName, SpanKind, ServiceName, ResourceAttributes, SpanAttributes, Duration, StatusCode, StatusMessage, TenantId, EventId, SandboxId, ExperimentId, AgentSnapshotId, EventType, Phase, Input, Output, CostModel, InputTokens, OutputTokens, CacheReadTokens, ReasoningTokens, EstimatedUsd, HasCost, IngestedAt, LogPartition, LogOffset)
SELECT ts, trace_id, span_id, parent_id, span_name, if(event_type = 'llm_call', 'Client', 'Internal'), agent,
  if(tagged, map('svc.agent_snapshot_id', snapshot, 'svc.agent_version', '1', 'svc.scenario_id', concat('scn-', toString(exp_no), '-', toString(sandbox_no % 20)), 'svc.run_id', concat('run-', toString(sandbox_no))), map()),
  if(event_type = 'llm_call', map('gen_ai.system', 'openai', 'gen_ai.request.model', 'gpt-4o', 'gen_ai.usage.input_tokens', toString(h % 4000)), map('tool.name', span_name, 'exit_code', toString(h % 3))),
  (h % 5000) * 1000000, if(h % 50 = 0, 'Error', 'Ok'), '', {tenant:String},
  lower(hex(MD5(concat('ev', toString(n))))), if(tagged, concat('sb-', lower(hex(sandbox_no))), NULL), if(tagged, concat('exp-', lower(hex(exp_no))), ''), snapshot,
  event_type, phase,
  concat('{"command":"', span_name, ' --step ', toString(pos), ' /workspace/src/module_', toString(h % 997), '.py","cwd":"/workspace","env":{"PATH":"/usr/bin"}} ', repeat('context line of the prompt; ', 6), toString(h)),
  if(phase = 'start', '', concat('{"exit_code":0,"stdout":"', repeat('output text row ', 10), toString(h % 100003), '"}')),
  if(event_type = 'llm_call', 'gpt-4o', ''), if(event_type = 'llm_call', h % 4000, 0), if(event_type = 'llm_call', h % 500, 0), 0, 0,
  if(event_type = 'llm_call', (h % 4000) * 0.0000025, 0), event_type = 'llm_call', toDateTime64(ts, 3), 999, n
FROM (
  SELECT number AS n, n % 16 AS stream, intDiv(n, 16) AS seq, stream < 12 AS tagged,
    seq % 30 AS pos, stream * 1000000 + intDiv(seq, 30) AS trace_no, stream * 1000000 + intDiv(seq, 300) AS sandbox_no, stream * 100000 + intDiv(seq, 6000) AS exp_no,
    cityHash64(n) AS h,
    fromUnixTimestamp64Micro(toInt64({start_us:Int64} + n * {step_us:Float64}), 'UTC') AS ts,
    lower(hex(MD5(concat('t', toString(trace_no))))) AS trace_id,
    pos % 10 = 6 AS is_end, if(is_end, pos - 1, pos) AS p, if(is_end, n - 16, n) AS pn,
    substring(lower(hex(MD5(concat('s', toString(pn))))), 1, 16) AS span_id,
    intDiv(p - 1, 3) AS pp0, if(pp0 % 10 = 6, pp0 - 1, pp0) AS ppos,
    if(p = 0, '', substring(lower(hex(MD5(concat('s', toString(pn - 16 * (p - ppos)))))), 1, 16)) AS parent_id,
    multiIf(p % 3 = 0, 'llm_call', p % 3 = 1, 'tool_call', 'tool_use') AS event_type,
    multiIf(pos % 10 = 5, 'start', is_end, 'end', 'complete') AS phase,
    if(event_type = 'llm_call', 'chat gpt-4o', ['bash', 'read_file', 'write_file', 'edit_file', 'grep', 'python', 'http_get', 'search', 'list_dir', 'git_diff', 'pytest', 'npm_test', 'curl', 'sed', 'find', 'cat', 'apply_patch', 'browser_open', 'sql_query', 'ls'][1 + (cityHash64(pn) % 20)]) AS span_name,
    if(tagged, concat('agent-', toString(exp_no % 12)), '') AS agent,
    if(tagged, concat('snap-', toString(exp_no % 12)), '') AS snapshot
  FROM numbers({events:UInt64})
)`;

type Args = string[];

async function ceiling([kind, eventsArg, format = 'rows', keepIn, batchArg = '20000']: Args): Promise<void> {
  const events = Number(eventsArg);
  const batchRows = Number(batchArg);
  if (!(batchRows >= 1)) throw new Error(`batch rows: ${batchArg} is not a positive number`);
  const dir = await mkdtemp(path.join(keepIn ?? os.tmpdir(), 'svc-bench-chdb-'));
  const log = new EmbeddedLog({ dir: path.join(dir, 'log'), fsync: 'never' });
  const catalog = loadCatalog().filter((t) => t.name === TOPICS.schemas || t.name === TOPICS.traces);
  await log.start(catalog);
  const registry = new BuiltInRegistry(log);
  await registry.start();
  const serde = new EventSerde(registry, catalog);
  await serde.init();
  // The events of each distinct body, as ingest would hand them to the log.
  const perBody: TraceEvent[][] =
    kind === 'otlp'
      ? otlpBodies(20).map((b) => otlpToTraceEvents(decodeOtlpProtobuf(b, LIMITS.maxEvents), LIMITS).events)
      : traceBodies(8).map((b) => validateTraceBatch(JSON.parse(b), LIMITS));
  let offset = 0;
  /** Per batch, its event count and how it is inserted. */
  const batches: Array<{ rows: number; insert: () => Promise<void> }> = [];
  const total = events + 2 * batchRows; // two batches warm up
  const store = new ChdbStore({ path: path.join(dir, 'chdb') });
  for (let b = 0; b * batchRows < total; b++) {
    const rows: Array<Record<string, unknown>> = [];
    const records: TraceRecordBody[] = [];
    let count = 0;
    for (let i = 0; count < batchRows; i++) {
      const source = perBody[(b * 20 + i) % perBody.length];
      // A fresh event id per copy, as ingest gives every accepted event its own.
      const value: TraceEventsIngested = {
        tenant: 'bench',
        event_id: `r${b}-${i}`,
        ts: Date.now(),
        ...UNTAGGED,
        events: source.map((e, k) => ({ ...e, event_id: `${b}-${i}-${k}` })),
      };
      const record = {
        topic: TOPICS.traces,
        partition: offset % 6,
        offset: offset++,
        key: null,
        value: serde.encode(TOPICS.traces, value),
        headers: {},
        timestamp: Date.now(),
      } satisfies LogRecord;
      if (format === 'native') records.push({ partition: record.partition, offset: record.offset, body: await serde.currentBody(TOPICS.traces, record.value) });
      else rows.push(...traceEventRows(value, record));
      count += source.length;
    }
    const block = format === 'native' ? traceEventBlock(records)! : null;
    batches.push({
      rows: count,
      insert: block
        ? () => store.insertNative({ table: 'trace_events', columns: TRACE_EVENT_BLOCK_COLUMN_NAMES, block: block.parts })
        : () => store.insert('trace_events', rows),
    });
  }
  try {
    await store.migrate();
    await Promise.all(batches.slice(0, 2).map((batch) => batch.insert()));
    const measured = batches.slice(2);
    let next = 0;
    const cpu = process.cpuUsage();
    const started = performance.now();
    await Promise.all(
      Array.from({ length: LANES }, async () => {
        while (next < measured.length) await measured[next++].insert();
      }),
    );
    const seconds = (performance.now() - started) / 1000;
    const used = process.cpuUsage(cpu);
    const rows = measured.reduce((n, b) => n + b.rows, 0);
    console.log(JSON.stringify({ rows_per_s: rows / seconds, cpu_us_per_row: (used.user + used.system) / rows, rows, batch_rows: batchRows, format }));
  } finally {
    await store.close();
    await log.close();
    if (!keepIn) await rm(dir, { recursive: true, force: true });
  }
}

async function fill([dataDir, eventsArg]: Args): Promise<void> {
  const events = Number(eventsArg);
  const store = new ChdbStore({ path: path.join(dataDir, 'chdb') });
  try {
    await store.migrate();
    const day = 86_400_000_000;
    const end = Math.floor((Date.now() * 1000) / day) * day + day / 2; // noon today, UTC: 8 daily partitions
    const start = end - 7 * day;
    // SVC_BENCH_QUERY_FILL_BLOCK_ROWS: parts of this many rows, as the sink's inserts make them
    // (about 3,300 under the bench's load), instead of the engine's million-row blocks.
    const blockRows = Number(process.env.SVC_BENCH_QUERY_FILL_BLOCK_ROWS ?? 0);
    if (!Number.isSafeInteger(blockRows) || blockRows < 0)
      throw new Error(`SVC_BENCH_QUERY_FILL_BLOCK_ROWS: ${process.env.SVC_BENCH_QUERY_FILL_BLOCK_ROWS} is not a row count`);
    const started = performance.now();
    await store.command(
      blockRows
        ? `${FILL} SETTINGS max_block_size = ${blockRows}, max_insert_block_size = ${blockRows}, min_insert_block_size_rows = ${blockRows}, min_insert_block_size_bytes = 0`
        : FILL,
      { tenant: 'default', start_us: start, step_us: (end - start) / events, events },
    );
    const fillSeconds = (performance.now() - started) / 1000;
    const sample = async (sql: string) => (await store.query<{ v: string }>(sql)).map((r) => r.v);
    const out = {
      fill_seconds: fillSeconds,
      parts: await parts(store),
      traces: await sample("SELECT TraceId AS v FROM trace_events WHERE ParentSpanId = '' AND cityHash64(TraceId) % 997 = 1 LIMIT 1 BY TraceId LIMIT 500"),
      experiments: await sample("SELECT DISTINCT ExperimentId AS v FROM trace_events WHERE ExperimentId != '' LIMIT 500"),
      sandboxes: await sample('SELECT DISTINCT SandboxId AS v FROM trace_events WHERE SandboxId IS NOT NULL AND cityHash64(SandboxId) % 13 = 1 LIMIT 500'),
      agents: await sample("SELECT DISTINCT ServiceName AS v FROM trace_events WHERE ServiceName != '' LIMIT 50"),
    };
    console.log(JSON.stringify(out));
  } finally {
    await store.close();
  }
}

async function parts(store: ChdbStore): Promise<{ parts: number; partitions: number; bytes: number }> {
  const [r] = await store.query<{ parts: string; partitions: string; bytes: string }>(
    "SELECT count() AS parts, uniqExact(partition) AS partitions, sum(bytes_on_disk) AS bytes FROM system.parts WHERE active AND database = currentDatabase() AND table = 'trace_events'",
  );
  return { parts: Number(r.parts), partitions: Number(r.partitions), bytes: Number(r.bytes) };
}

async function optimize([dataDir]: Args): Promise<void> {
  const store = new ChdbStore({ path: path.join(dataDir, 'chdb') });
  try {
    const before = await parts(store);
    const started = performance.now();
    await store.command('OPTIMIZE TABLE trace_events FINAL');
    console.log(JSON.stringify({ before, after: await parts(store), seconds: (performance.now() - started) / 1000 }));
  } finally {
    await store.close();
  }
}

const [mode, ...rest] = process.argv.slice(2);
const modes: Record<string, (args: Args) => Promise<void>> = { ceiling, fill, optimize };
if (!modes[mode]) throw new Error(`usage: chdb-direct.ts ceiling <traces|otlp> <events> [rows|native] [dir] | fill <data dir> <events> | optimize <data dir>`);
await modes[mode](rest);
