/**
 * svc.traces records as trace_events rows in ClickHouse's Native format (one block, column after
 * column), made by walking the records' Avro bytes: strings are copied from the record to their
 * column as they are, numbers re-laid as fixed-width little-endian; no JS object per event, no
 * query-time mapping. This is traceEventRows (rows.ts) at the byte level; keep the two in step:
 * test/contract/sink-native.test.ts stores one varied batch both ways and compares every column.
 *
 * Why Native: the engine reads it column by column without parsing, and the INSERT has no
 * expressions to analyse. Measured on chDB (docs/performance.md, "Trace ingest"): an INSERT that made
 * the rows in SQL from the records' Avro spent ~20 ms planning per insert, and chDB alone
 * inserted the same rows at 5.1 µs of CPU per row from Native against 13 from the Avro records.
 *
 * A record that is not a value of the current schema (truncated, corrupt) throws: the sink's
 * batch is then retried write by write, so only that record's write fails (and is dead-lettered
 * by its consumer), as with any insert the store refuses.
 */

/** One svc.traces record: its position on the log and its value's Avro body in this process's schema (no wire header). */
export interface TraceRecordBody {
  partition: number;
  offset: number;
  body: Buffer;
}

/** The columns of the block, in order, with the types the block declares (the engine converts to the table's: String to LowCardinality(String)). */
export const TRACE_EVENT_BLOCK_COLUMNS = [
  ['Timestamp', "DateTime64(9, 'UTC')"],
  ['TraceId', 'String'],
  ['SpanId', 'String'],
  ['ParentSpanId', 'String'],
  ['SpanName', 'String'],
  ['SpanKind', 'String'],
  ['ServiceName', 'String'],
  ['ResourceAttributes', 'Map(String, String)'],
  ['SpanAttributes', 'Map(String, String)'],
  ['Duration', 'UInt64'],
  ['StatusCode', 'String'],
  ['StatusMessage', 'String'],
  ['TenantId', 'String'],
  ['EventId', 'String'],
  ['SandboxId', 'Nullable(String)'],
  ['ExperimentId', 'String'],
  ['AgentSnapshotId', 'String'],
  ['EventType', 'String'],
  ['Phase', 'String'],
  ['Input', 'String'],
  ['Output', 'String'],
  ['CostModel', 'String'],
  ['InputTokens', 'UInt64'],
  ['OutputTokens', 'UInt64'],
  ['CacheReadTokens', 'UInt64'],
  ['ReasoningTokens', 'UInt64'],
  ['EstimatedUsd', 'Float64'],
  ['HasCost', 'UInt8'],
  ['IngestedAt', "DateTime64(3, 'UTC')"],
  ['LogPartition', 'UInt32'],
  ['LogOffset', 'UInt64'],
] as const;

/** The block's column names, in order (the INSERT's column list). */
export const TRACE_EVENT_BLOCK_COLUMN_NAMES: readonly string[] = TRACE_EVENT_BLOCK_COLUMNS.map(([name]) => name);

const TWO_32 = 4_294_967_296;

/** A growable byte buffer a column is written to. */
class Bytes {
  buf: Buffer;
  pos = 0;

  constructor(size: number) {
    this.buf = Buffer.allocUnsafe(size);
  }

  private room(n: number): void {
    if (this.pos + n <= this.buf.length) return;
    const grown = Buffer.allocUnsafe(Math.max(this.buf.length * 2, this.pos + n));
    this.buf.copy(grown, 0, 0, this.pos);
    this.buf = grown;
  }

  u8(v: number): void {
    this.room(1);
    this.buf[this.pos++] = v;
  }

  uvarint(v: number): void {
    this.room(10);
    while (v >= 0x80) {
      this.buf[this.pos++] = (v % 0x80) | 0x80;
      v = Math.floor(v / 0x80);
    }
    this.buf[this.pos++] = v;
  }

  /** A String value: its length, then its bytes from `src`. */
  string(src: Buffer, start: number, end: number): void {
    const n = end - start;
    this.uvarint(n);
    this.room(n);
    // Short strings byte by byte: a native copy costs more than the loop below ~32 bytes.
    if (n < 32) for (let i = start; i < end; i++) this.buf[this.pos++] = src[i]!;
    else this.pos += src.copy(this.buf, this.pos, start, end);
  }

  /** A String value of ASCII text (a column's name or type). */
  name(value: string): void {
    this.uvarint(value.length);
    this.room(value.length);
    this.pos += this.buf.write(value, this.pos, 'latin1');
  }

  /** What was written. */
  view(): Buffer {
    return this.buf.subarray(0, this.pos);
  }

  u32(v: number): void {
    this.room(4);
    this.buf.writeUInt32LE(v, this.pos);
    this.pos += 4;
  }

  /** `v * scale` as a 64-bit two's-complement integer (wrapping, as Int64 arithmetic in the engine does); v a safe integer, scale <= 1e6. */
  int64(v: number, scale = 1): void {
    const hiV = Math.floor(v / TWO_32);
    const lowProduct = (v - hiV * TWO_32) * scale; // < 2^52: exact
    const carry = Math.floor(lowProduct / TWO_32);
    const hi = (hiV * scale + carry) % TWO_32;
    this.room(8);
    this.buf.writeUInt32LE(lowProduct - carry * TWO_32, this.pos);
    this.buf.writeUInt32LE(hi < 0 ? hi + TWO_32 : hi, this.pos + 4);
    this.pos += 8;
  }

  /** 8 bytes as they are (an Avro double is a little-endian IEEE 754, as Float64 is). */
  raw8(src: Buffer, at: number): void {
    this.room(8);
    src.copy(this.buf, this.pos, at, at + 8);
    this.pos += 8;
  }
}

/** A Map(String, String) column: cumulative entry counts per row, then the keys and the values. */
class MapColumn {
  readonly offsets = new Bytes(64 * 1024);
  readonly keys = new Bytes(64 * 1024);
  readonly values = new Bytes(64 * 1024);
  entries = 0;

  entry(keySrc: Buffer, keyStart: number, keyEnd: number, valueSrc: Buffer, valueStart: number, valueEnd: number): void {
    this.keys.string(keySrc, keyStart, keyEnd);
    this.values.string(valueSrc, valueStart, valueEnd);
    this.entries++;
  }

  endRow(): void {
    this.offsets.int64(this.entries);
  }

  reset(): void {
    this.offsets.pos = this.keys.pos = this.values.pos = 0;
    this.entries = 0;
  }

  parts(): Bytes[] {
    return [this.offsets, this.keys, this.values];
  }
}

/** Reads the Avro binary encoding of a TraceEventsIngested body; every read is bounds-checked. */
class AvroReader {
  pos = 0;
  /** End of the string last read by `string()`. */
  end = 0;

  constructor(readonly buf: Buffer) {}

  private fail(what: string): never {
    throw new Error(`svc.traces record: not a value of the schema (${what} at byte ${this.pos} of ${this.buf.length})`);
  }

  /** A zigzag varint long, exact up to 2^53. */
  long(): number {
    const { buf } = this;
    let value = 0;
    let scale = 1;
    for (let i = 0; ; i++) {
      if (this.pos >= buf.length || i > 9) this.fail('long');
      const b = buf[this.pos++]!;
      value += (b & 0x7f) * scale;
      if (b < 0x80) break;
      scale *= 128;
    }
    return value % 2 === 0 ? value / 2 : -(value + 1) / 2;
  }

  /** Reads a string; returns where its bytes start (`end` is where they end). */
  string(): number {
    const n = this.long();
    const start = this.pos;
    if (n < 0 || start + n > this.buf.length) this.fail('string');
    this.pos = this.end = start + n;
    return start;
  }

  /** A ["null", X] union's branch: true when X follows. */
  present(): boolean {
    const branch = this.long();
    if (branch !== 0 && branch !== 1) this.fail('union branch');
    return branch === 1;
  }

  /** The item count of the next block of an array or map (0: the last). */
  blockCount(): number {
    const count = this.long();
    if (count >= 0) return count;
    this.long(); // a negative count is followed by the block's byte size
    return -count;
  }

  double(): number {
    const at = this.pos;
    if (at + 8 > this.buf.length) this.fail('double');
    this.pos += 8;
    return at;
  }

  done(): void {
    if (this.pos !== this.buf.length) this.fail('trailing bytes');
  }
}

const EMPTY = Buffer.alloc(0);
const ZERO_DOUBLE = Buffer.alloc(8);
const text = (value: string): Buffer => Buffer.from(value, 'latin1');
const [LLM_CALL, ERROR, CLIENT, INTERNAL, ERROR_CODE, OK] = ['llm_call', 'error', 'Client', 'Internal', 'Error', 'Ok'].map(text) as [
  Buffer,
  Buffer,
  Buffer,
  Buffer,
  Buffer,
  Buffer,
];
const TAG_KEYS = ['svc.agent_snapshot_id', 'svc.agent_version', 'svc.scenario_id', 'svc.run_id'].map(text);

/**
 * A block of rows in Native format as the views of its parts, in order (written out as they are,
 * never concatenated), and how to give its column buffers back once it is written: the buffers
 * are reused by later blocks, so a steady ingest allocates none. (Buffers this size are V8
 * external memory, and on the api's large heap every 64 MB of them started a full mark: measured,
 * the GC's threads took more CPU per ingested event than the engine's inserts.)
 */
export interface NativeBlock {
  parts: Buffer[];
  release(): void;
}

/** The column buffers of one block being made, by column. */
class Columns {
  readonly timestamp = new Bytes(64 * 1024);
  readonly traceId = new Bytes(64 * 1024);
  readonly spanId = new Bytes(64 * 1024);
  readonly parentSpanId = new Bytes(64 * 1024);
  readonly spanName = new Bytes(64 * 1024);
  readonly spanKind = new Bytes(64 * 1024);
  readonly serviceName = new Bytes(64 * 1024);
  readonly resource = new MapColumn();
  readonly attributes = new MapColumn();
  readonly duration = new Bytes(64 * 1024);
  readonly statusCode = new Bytes(64 * 1024);
  readonly statusMessage = new Bytes(64 * 1024);
  readonly tenantId = new Bytes(64 * 1024);
  readonly eventId = new Bytes(64 * 1024);
  readonly sandboxNulls = new Bytes(64 * 1024);
  readonly sandboxIds = new Bytes(64 * 1024);
  readonly experimentId = new Bytes(64 * 1024);
  readonly agentSnapshotId = new Bytes(64 * 1024);
  readonly eventType = new Bytes(64 * 1024);
  readonly phase = new Bytes(64 * 1024);
  readonly input = new Bytes(64 * 1024);
  readonly output = new Bytes(64 * 1024);
  readonly costModel = new Bytes(64 * 1024);
  readonly inputTokens = new Bytes(64 * 1024);
  readonly outputTokens = new Bytes(64 * 1024);
  readonly cacheReadTokens = new Bytes(64 * 1024);
  readonly reasoningTokens = new Bytes(64 * 1024);
  readonly estimatedUsd = new Bytes(64 * 1024);
  readonly hasCost = new Bytes(64 * 1024);
  readonly ingestedAt = new Bytes(64 * 1024);
  readonly logPartition = new Bytes(64 * 1024);
  readonly logOffset = new Bytes(64 * 1024);
  rows = 0;

  /** Each column's data in the block's order (a map is its offsets, keys and values; a Nullable its null map and values). */
  private byName(): Record<(typeof TRACE_EVENT_BLOCK_COLUMNS)[number][0], Bytes[]> {
    return {
      Timestamp: [this.timestamp],
      TraceId: [this.traceId],
      SpanId: [this.spanId],
      ParentSpanId: [this.parentSpanId],
      SpanName: [this.spanName],
      SpanKind: [this.spanKind],
      ServiceName: [this.serviceName],
      ResourceAttributes: this.resource.parts(),
      SpanAttributes: this.attributes.parts(),
      Duration: [this.duration],
      StatusCode: [this.statusCode],
      StatusMessage: [this.statusMessage],
      TenantId: [this.tenantId],
      EventId: [this.eventId],
      SandboxId: [this.sandboxNulls, this.sandboxIds],
      ExperimentId: [this.experimentId],
      AgentSnapshotId: [this.agentSnapshotId],
      EventType: [this.eventType],
      Phase: [this.phase],
      Input: [this.input],
      Output: [this.output],
      CostModel: [this.costModel],
      InputTokens: [this.inputTokens],
      OutputTokens: [this.outputTokens],
      CacheReadTokens: [this.cacheReadTokens],
      ReasoningTokens: [this.reasoningTokens],
      EstimatedUsd: [this.estimatedUsd],
      HasCost: [this.hasCost],
      IngestedAt: [this.ingestedAt],
      LogPartition: [this.logPartition],
      LogOffset: [this.logOffset],
    };
  }

  reset(): void {
    for (const data of Object.values(this.byName())) for (const bytes of data) bytes.pos = 0;
    this.resource.reset();
    this.attributes.reset();
    this.rows = 0;
  }

  /** The block: its row and column counts, then each column's name, type and data. */
  parts(): Buffer[] {
    const head = new Bytes(20);
    head.uvarint(TRACE_EVENT_BLOCK_COLUMNS.length);
    head.uvarint(this.rows);
    const data = this.byName();
    const parts = [head.view()];
    for (const [name] of TRACE_EVENT_BLOCK_COLUMNS) parts.push(COLUMN_HEADERS[name], ...data[name].map((b) => b.view()));
    return parts;
  }
}

/** Column buffer sets not in use: one per block being made or written, at most the sink's inserts in flight plus one. */
const free: Columns[] = [];

/** Whether src[start, end) holds exactly the bytes of `word`. */
function is(src: Buffer, start: number, end: number, word: Buffer): boolean {
  if (end - start !== word.length) return false;
  for (let i = 0; i < word.length; i++) if (src[start + i] !== word[i]) return false;
  return true;
}

/** A byte range of a source buffer. */
type Range = readonly [src: Buffer, start: number, end: number];
const NONE: Range = [EMPTY, 0, 0];

/** What a record's events share: the batch's own fields, as ranges of the record. */
interface Batch {
  tenant: Range;
  ts: number;
  sandbox: Range | null;
  experiment: Range;
  agent: Range;
  snapshot: Range;
  /** ResourceAttributes: the tags that are set, empty values left out (as traceEventRows does). */
  tags: Array<readonly [key: Buffer, value: Range]>;
  partition: number;
  offset: number;
}

/** The trace_events rows of `records` as one Native block (null when they hold no event). */
export function traceEventBlock(records: readonly TraceRecordBody[]): NativeBlock | null {
  const columns = free.pop() ?? new Columns();
  columns.reset();
  try {
    for (const record of records) writeRecord(columns, record);
  } catch (err) {
    free.push(columns);
    throw err;
  }
  if (columns.rows === 0) {
    free.push(columns);
    return null;
  }
  let released = false;
  return {
    parts: columns.parts(),
    release: () => {
      if (!released) free.push(columns);
      released = true;
    },
  };
}

/** One record's events as rows. */
function writeRecord(columns: Columns, record: TraceRecordBody): void {
  const r = new AvroReader(record.body);
  const src = record.body;
  const range = (): Range => {
    const start = r.string();
    return [src, start, r.end];
  };
  const optional = (): Range | null => (r.present() ? range() : null);
  const tenant = range();
  r.string(); // the batch's own event_id
  const ts = r.long();
  const sandbox = optional();
  const experiment = optional();
  const agent = optional();
  const snapshot = optional();
  const version = r.present() ? text(String(r.long())) : null;
  const scenario = optional();
  const run = optional();
  const set = (value: Range | null): value is Range => value !== null && value[2] > value[1];
  const tags: Batch['tags'] = [];
  if (set(snapshot)) tags.push([TAG_KEYS[0]!, snapshot]);
  if (version) tags.push([TAG_KEYS[1]!, [version, 0, version.length]]);
  if (set(scenario)) tags.push([TAG_KEYS[2]!, scenario]);
  if (set(run)) tags.push([TAG_KEYS[3]!, run]);
  const batch: Batch = {
    tenant,
    ts,
    sandbox,
    experiment: experiment ?? NONE,
    agent: agent ?? NONE,
    snapshot: snapshot ?? NONE,
    tags,
    partition: record.partition,
    offset: record.offset,
  };
  for (let block = r.blockCount(); block > 0; block = r.blockCount()) {
    for (let k = 0; k < block; k++) writeEvent(columns, r, batch);
  }
  r.done();
}

/** The string `r` reads next, copied to `column`. */
function copyString(column: Bytes, r: AvroReader): void {
  const start = r.string();
  column.string(r.buf, start, r.end);
}

/** The ["null", string] `r` reads next, copied to `column` ('' for null, as the row mapping's `?? ''`). */
function copyOptional(column: Bytes, r: AvroReader): void {
  if (r.present()) copyString(column, r);
  else column.u8(0);
}

function copyRange(column: Bytes, [src, start, end]: Range): void {
  column.string(src, start, end);
}

/** One event (read from `r`) as a row, with its batch's columns. (Plain calls, no closures: this runs per event.) */
function writeEvent(c: Columns, r: AvroReader, batch: Batch): void {
  const src = r.buf;
  c.rows++;
  copyString(c.eventId, r);
  c.timestamp.int64(r.long(), 1000);
  const typeStart = r.string();
  c.eventType.string(src, typeStart, r.end);
  const kind = is(src, typeStart, r.end, LLM_CALL) ? CLIENT : INTERNAL;
  c.spanKind.string(kind, 0, kind.length);
  copyString(c.spanName, r);
  copyString(c.phase, r);
  copyString(c.traceId, r);
  copyString(c.spanId, r);
  copyOptional(c.parentSpanId, r);
  c.duration.int64(r.long(), 1_000_000);
  const statusStart = r.string();
  const status = is(src, statusStart, r.end, ERROR) ? ERROR_CODE : OK;
  c.statusCode.string(status, 0, status.length);
  copyOptional(c.input, r);
  copyOptional(c.output, r);
  if (r.present()) {
    c.inputTokens.int64(r.long());
    c.outputTokens.int64(r.long());
    c.cacheReadTokens.int64(r.long());
    c.reasoningTokens.int64(r.long());
    copyString(c.costModel, r);
    c.estimatedUsd.raw8(src, r.double());
    c.hasCost.u8(1);
  } else {
    c.inputTokens.int64(0);
    c.outputTokens.int64(0);
    c.cacheReadTokens.int64(0);
    c.reasoningTokens.int64(0);
    c.costModel.u8(0);
    c.estimatedUsd.raw8(ZERO_DOUBLE, 0);
    c.hasCost.u8(0);
  }
  for (let entries = r.blockCount(); entries > 0; entries = r.blockCount()) {
    for (let e = 0; e < entries; e++) {
      const keyStart = r.string();
      const keyEnd = r.end;
      const valueStart = r.string();
      c.attributes.entry(src, keyStart, keyEnd, src, valueStart, r.end);
    }
  }
  c.attributes.endRow();
  // The batch's own columns, the same on each of its events.
  copyRange(c.serviceName, batch.agent);
  for (const [key, [value, start, end]] of batch.tags) c.resource.entry(key, 0, key.length, value, start, end);
  c.resource.endRow();
  c.statusMessage.u8(0);
  copyRange(c.tenantId, batch.tenant);
  c.sandboxNulls.u8(batch.sandbox ? 0 : 1);
  copyRange(c.sandboxIds, batch.sandbox ?? NONE);
  copyRange(c.experimentId, batch.experiment);
  copyRange(c.agentSnapshotId, batch.snapshot);
  c.ingestedAt.int64(batch.ts);
  c.logPartition.u32(batch.partition);
  c.logOffset.int64(batch.offset);
}

/** Each column's name and type as the block writes them before its data. */
const COLUMN_HEADERS = Object.fromEntries(
  TRACE_EVENT_BLOCK_COLUMNS.map(([name, type]) => {
    const header = new Bytes(64);
    header.name(name);
    header.name(type);
    return [name, header.view()];
  }),
) as Record<(typeof TRACE_EVENT_BLOCK_COLUMNS)[number][0], Buffer>;
