/**
 * svc.traces records as trace_events rows in ClickHouse's Native format (one block, column after
 * column), made by walking the records' Avro bytes: strings are copied from the record to their
 * column as they are, numbers re-laid as fixed-width little-endian; no JS object per event, no
 * query-time mapping. This is traceEventRows (rows.ts) at the byte level; keep the two in step:
 * test/contract/sink-native.test.ts stores one varied batch both ways and compares every column.
 *
 * Why Native: the engine reads it column by column without parsing, and the INSERT has no
 * expressions to analyse. Measured on chDB (docs/operations.md, "Ingest"): an INSERT that made
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
  ['Timestamp', "DateTime64(9, 'UTC')"], ['TraceId', 'String'], ['SpanId', 'String'], ['ParentSpanId', 'String'], ['SpanName', 'String'],
  ['SpanKind', 'String'], ['ServiceName', 'String'], ['ResourceAttributes', 'Map(String, String)'], ['SpanAttributes', 'Map(String, String)'],
  ['Duration', 'UInt64'], ['StatusCode', 'String'], ['StatusMessage', 'String'], ['TenantId', 'String'], ['EventId', 'String'],
  ['SandboxId', 'Nullable(String)'], ['ExperimentId', 'String'], ['AgentSnapshotId', 'String'], ['EventType', 'String'], ['Phase', 'String'],
  ['Input', 'String'], ['Output', 'String'], ['CostModel', 'String'], ['InputTokens', 'UInt64'], ['OutputTokens', 'UInt64'],
  ['CacheReadTokens', 'UInt64'], ['ReasoningTokens', 'UInt64'], ['EstimatedUsd', 'Float64'], ['HasCost', 'UInt8'],
  ['IngestedAt', "DateTime64(3, 'UTC')"], ['LogPartition', 'UInt32'], ['LogOffset', 'UInt64'],
] as const;

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
  entries = 0;

  constructor(
    readonly offsets: Bytes,
    readonly keys: Bytes,
    readonly values: Bytes,
  ) {}

  endRow(): void {
    this.offsets.int64(this.entries);
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

/** A ["null", string] value: [start, end] of its bytes, or null. */
function optionalString(r: AvroReader): [number, number] | null {
  if (!r.present()) return null;
  const start = r.string();
  return [start, r.end];
}

const EMPTY = Buffer.alloc(0);
const ZERO_DOUBLE = Buffer.alloc(8);
const text = (value: string): Buffer => Buffer.from(value, 'latin1');
const [LLM_CALL, ERROR, CLIENT, INTERNAL, ERROR_CODE, OK] = ['llm_call', 'error', 'Client', 'Internal', 'Error', 'Ok'].map(text) as [Buffer, Buffer, Buffer, Buffer, Buffer, Buffer];
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

const COLUMN_BUFFERS = 36;
/** Column buffer sets not in use: one per block being made or written, at most the sink's inserts in flight plus one. */
const free: Bytes[][] = [];

/** Whether src[start, end) holds exactly the bytes of `word`. */
function is(src: Buffer, start: number, end: number, word: Buffer): boolean {
  if (end - start !== word.length) return false;
  for (let i = 0; i < word.length; i++) if (src[start + i] !== word[i]) return false;
  return true;
}

/** The trace_events rows of `records` as one Native block (null when they hold no event). */
export function traceEventBlock(records: readonly TraceRecordBody[]): NativeBlock | null {
  const buffers = free.pop() ?? Array.from({ length: COLUMN_BUFFERS }, () => new Bytes(64 * 1024));
  for (const column of buffers) column.pos = 0;
  try {
    const parts = writeBlock(records, buffers);
    if (parts === null) {
      free.push(buffers);
      return null;
    }
    let released = false;
    return {
      parts,
      release: () => {
        if (!released) free.push(buffers);
        released = true;
      },
    };
  } catch (err) {
    free.push(buffers);
    throw err;
  }
}

function writeBlock(records: readonly TraceRecordBody[], buffers: Bytes[]): Buffer[] | null {
  const [timestamp, traceId, spanId, parentSpanId, spanName, spanKind, serviceName, duration, statusCode, statusMessage, tenantId, eventId,
    sandboxNulls, sandboxIds, experimentId, agentSnapshotId, eventType, phase, input, output, costModel, inputTokens, outputTokens,
    cacheReadTokens, reasoningTokens, estimatedUsd, hasCost, ingestedAt, logPartition, logOffset,
    resourceOffsets, resourceKeys, resourceValues, attributeOffsets, attributeKeys, attributeValues] = buffers;
  const resource = new MapColumn(resourceOffsets!, resourceKeys!, resourceValues!);
  const attributes = new MapColumn(attributeOffsets!, attributeKeys!, attributeValues!);
  let count = 0;

  for (const record of records) {
    const r = new AvroReader(record.body);
    const src = record.body;
    const tenant = r.string();
    const tenantEnd = r.end;
    r.string(); // the batch's own event_id
    const ts = r.long();
    const sandbox = optionalString(r);
    const experiment = optionalString(r);
    const agent = optionalString(r);
    const snapshot = optionalString(r);
    const version = r.present() ? text(String(r.long())) : null;
    const scenario = optionalString(r);
    const run = optionalString(r);
    // ResourceAttributes: the tags that are set, empty values left out (as traceEventRows does).
    const tags: Array<[Buffer, Buffer, number, number]> = [];
    if (snapshot && snapshot[1] > snapshot[0]) tags.push([TAG_KEYS[0]!, src, snapshot[0], snapshot[1]]);
    if (version) tags.push([TAG_KEYS[1]!, version, 0, version.length]);
    if (scenario && scenario[1] > scenario[0]) tags.push([TAG_KEYS[2]!, src, scenario[0], scenario[1]]);
    if (run && run[1] > run[0]) tags.push([TAG_KEYS[3]!, src, run[0], run[1]]);
    const [agentSrc, agentStart, agentEnd] = agent ? [src, ...agent] : [EMPTY, 0, 0];
    const [sandboxSrc, sandboxStart, sandboxEnd] = sandbox ? [src, ...sandbox] : [EMPTY, 0, 0];
    const [experimentSrc, experimentStart, experimentEnd] = experiment ? [src, ...experiment] : [EMPTY, 0, 0];
    const [snapshotSrc, snapshotStart, snapshotEnd] = snapshot ? [src, ...snapshot] : [EMPTY, 0, 0];

    for (let block = r.blockCount(); block > 0; block = r.blockCount()) {
      for (let k = 0; k < block; k++) {
        count++;
        eventId.string(src, r.string(), r.end);
        timestamp.int64(r.long(), 1000);
        const typeStart = r.string();
        eventType.string(src, typeStart, r.end);
        const kind = is(src, typeStart, r.end, LLM_CALL) ? CLIENT : INTERNAL;
        spanKind.string(kind, 0, kind.length);
        spanName.string(src, r.string(), r.end);
        phase.string(src, r.string(), r.end);
        traceId.string(src, r.string(), r.end);
        spanId.string(src, r.string(), r.end);
        if (r.present()) parentSpanId.string(src, r.string(), r.end);
        else parentSpanId.u8(0);
        duration.int64(r.long(), 1_000_000);
        const statusStart = r.string();
        const status = is(src, statusStart, r.end, ERROR) ? ERROR_CODE : OK;
        statusCode.string(status, 0, status.length);
        if (r.present()) input.string(src, r.string(), r.end);
        else input.u8(0);
        if (r.present()) output.string(src, r.string(), r.end);
        else output.u8(0);
        if (r.present()) {
          inputTokens.int64(r.long());
          outputTokens.int64(r.long());
          cacheReadTokens.int64(r.long());
          reasoningTokens.int64(r.long());
          costModel.string(src, r.string(), r.end);
          estimatedUsd.raw8(src, r.double());
          hasCost.u8(1);
        } else {
          inputTokens.int64(0);
          outputTokens.int64(0);
          cacheReadTokens.int64(0);
          reasoningTokens.int64(0);
          costModel.u8(0);
          estimatedUsd.raw8(ZERO_DOUBLE, 0);
          hasCost.u8(0);
        }
        for (let entries = r.blockCount(); entries > 0; entries = r.blockCount()) {
          for (let e = 0; e < entries; e++) {
            attributes.keys.string(src, r.string(), r.end);
            attributes.values.string(src, r.string(), r.end);
          }
          attributes.entries += entries;
        }
        attributes.endRow();
        // The batch's own columns, the same on each of its events.
        serviceName.string(agentSrc, agentStart, agentEnd);
        for (const [key, value, start, end] of tags) {
          resource.keys.string(key, 0, key.length);
          resource.values.string(value, start, end);
        }
        resource.entries += tags.length;
        resource.endRow();
        statusMessage.u8(0);
        tenantId.string(src, tenant, tenantEnd);
        sandboxNulls.u8(sandbox ? 0 : 1);
        sandboxIds.string(sandboxSrc, sandboxStart, sandboxEnd);
        experimentId.string(experimentSrc, experimentStart, experimentEnd);
        agentSnapshotId.string(snapshotSrc, snapshotStart, snapshotEnd);
        ingestedAt.int64(ts);
        logPartition.u32(record.partition);
        logOffset.int64(record.offset);
      }
    }
    r.done();
  }
  if (count === 0) return null;

  const data: Record<(typeof TRACE_EVENT_BLOCK_COLUMNS)[number][0], Bytes[]> = {
    Timestamp: [timestamp], TraceId: [traceId], SpanId: [spanId], ParentSpanId: [parentSpanId], SpanName: [spanName], SpanKind: [spanKind],
    ServiceName: [serviceName], ResourceAttributes: resource.parts(), SpanAttributes: attributes.parts(), Duration: [duration],
    StatusCode: [statusCode], StatusMessage: [statusMessage], TenantId: [tenantId], EventId: [eventId], SandboxId: [sandboxNulls, sandboxIds],
    ExperimentId: [experimentId], AgentSnapshotId: [agentSnapshotId], EventType: [eventType], Phase: [phase], Input: [input], Output: [output],
    CostModel: [costModel], InputTokens: [inputTokens], OutputTokens: [outputTokens], CacheReadTokens: [cacheReadTokens],
    ReasoningTokens: [reasoningTokens], EstimatedUsd: [estimatedUsd], HasCost: [hasCost], IngestedAt: [ingestedAt],
    LogPartition: [logPartition], LogOffset: [logOffset],
  };
  const head = new Bytes(20);
  head.uvarint(TRACE_EVENT_BLOCK_COLUMNS.length);
  head.uvarint(count);
  const parts = [head.view()];
  for (const [name] of TRACE_EVENT_BLOCK_COLUMNS) parts.push(COLUMN_HEADERS[name], ...data[name].map((b) => b.view()));
  return parts;
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
