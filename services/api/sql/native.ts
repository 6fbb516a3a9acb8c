/**
 * Native output for clients that announce a protocol revision (`client_protocol_version`, which
 * clickhouse-go's HTTP transport, hence Grafana's ClickHouse plugin, always sends).
 *
 * A ClickHouse server writes Native for the client's revision: each block starts with the block
 * info (revision > 0) and each column's type is followed by a "has custom serialization" byte
 * (revision >= 54454). clickhouse-go decodes with the revision the server reports (`SELECT
 * revision()`: 54513 on chDB 26.7), so it expects both. chDB writes Native as for revision 0
 * (neither). This module re-frames chDB's blocks for the asked revision: it walks each column's
 * data to find where it ends (it never changes a value byte) and inserts the block info and the
 * flag byte. Without `client_protocol_version` (or 0) the bytes go out untouched.
 *
 * Types whose data it cannot walk (Dynamic, Variant, JSON, Object, AggregateFunction) are an
 * error naming the column: ask for RowBinary, or leave out client_protocol_version.
 */
import { SqlError } from './sql-errors.ts';

const MIN_REVISION_WITH_CUSTOM_SERIALIZATION = 54454;

class Reader {
  pos = 0;
  constructor(readonly buf: Uint8Array) {}
  get done(): boolean {
    return this.pos >= this.buf.length;
  }
  need(n: number): void {
    if (this.pos + n > this.buf.length) throw new Error('truncated Native data');
  }
  uvarint(): number {
    let result = 0;
    let shift = 0;
    for (;;) {
      this.need(1);
      const b = this.buf[this.pos++];
      result += (b & 0x7f) * 2 ** shift;
      if ((b & 0x80) === 0) return result;
      shift += 7;
      if (shift > 63) throw new Error('bad varint in Native data');
    }
  }
  skip(n: number): void {
    this.need(n);
    this.pos += n;
  }
  string(): string {
    const len = this.uvarint();
    this.need(len);
    const s = Buffer.from(this.buf.buffer, this.buf.byteOffset + this.pos, len).toString('utf8');
    this.pos += len;
    return s;
  }
  uint64(): number {
    this.need(8);
    const view = new DataView(this.buf.buffer, this.buf.byteOffset + this.pos, 8);
    this.pos += 8;
    return Number(view.getBigUint64(0, true));
  }
}

interface TypeNode {
  name: string;
  args: string[];
}

/** `Name(arg, arg)` split at its top-level commas (quotes and nested parentheses respected). */
export function parseType(type: string): TypeNode {
  const t = type.trim();
  const open = t.indexOf('(');
  if (open < 0 || !t.endsWith(')')) return { name: t, args: [] };
  const name = t.slice(0, open);
  const inner = t.slice(open + 1, -1);
  const args: string[] = [];
  let depth = 0;
  let quote: string | null = null;
  let start = 0;
  for (let i = 0; i < inner.length; i++) {
    const c = inner[i];
    if (quote) {
      if (c === '\\') i++;
      else if (c === quote) quote = null;
    } else if (c === "'" || c === '`' || c === '"') quote = c;
    else if (c === '(') depth++;
    else if (c === ')') depth--;
    else if (c === ',' && depth === 0) {
      args.push(inner.slice(start, i).trim());
      start = i + 1;
    }
  }
  args.push(inner.slice(start).trim());
  return { name, args };
}

/** A Tuple or Nested element `name Type` (or just `Type`) -> its type. */
function elementType(element: string): string {
  const named = /^(`(?:[^`\\]|\\.)*`|[A-Za-z_][A-Za-z0-9_.]*)\s+(.+)$/s.exec(element);
  if (named && /^[A-Z]/.test(named[2]) && !/^(Nullable|LowCardinality|Array|Map|Tuple)$/.test(named[1])) return named[2];
  return element;
}

const FIXED: Record<string, number> = {
  UInt8: 1,
  Int8: 1,
  Bool: 1,
  Enum8: 1,
  Nothing: 1,
  UInt16: 2,
  Int16: 2,
  Date: 2,
  Enum16: 2,
  BFloat16: 2,
  UInt32: 4,
  Int32: 4,
  Float32: 4,
  DateTime: 4,
  Date32: 4,
  IPv4: 4,
  Decimal32: 4,
  Time: 4,
  UInt64: 8,
  Int64: 8,
  Float64: 8,
  DateTime64: 8,
  Decimal64: 8,
  Time64: 8,
  UInt128: 16,
  Int128: 16,
  UUID: 16,
  IPv6: 16,
  Decimal128: 16,
  UInt256: 32,
  Int256: 32,
  Decimal256: 32,
};

const ALIASES: Record<string, string> = {
  Point: 'Tuple(Float64, Float64)',
  Ring: 'Array(Tuple(Float64, Float64))',
  LineString: 'Array(Tuple(Float64, Float64))',
  Polygon: 'Array(Array(Tuple(Float64, Float64)))',
  MultiLineString: 'Array(Array(Tuple(Float64, Float64)))',
  MultiPolygon: 'Array(Array(Array(Tuple(Float64, Float64))))',
};

/** Skips the serialization state prefix of a column of `type` (only LowCardinality has one). */
function skipPrefix(type: string, r: Reader): void {
  const { name, args } = parseType(ALIASES[type] ?? type);
  if (name === 'LowCardinality') r.skip(8);
  else if (name === 'Array' || name === 'Nullable' || name === 'SimpleAggregateFunction') skipPrefix(args[args.length - 1], r);
  else if (name === 'Map') {
    skipPrefix(args[0], r);
    skipPrefix(args[1], r);
  } else if (name === 'Tuple' || name === 'Nested') for (const a of args) skipPrefix(elementType(a), r);
}

/** Skips `rows` values of `type` (their data, after the prefix). */
function skipData(type: string, rows: number, r: Reader): void {
  if (rows === 0) return;
  const { name, args } = parseType(ALIASES[type] ?? type);
  const fixed = FIXED[name];
  if (fixed !== undefined) return r.skip(fixed * rows);
  switch (name) {
    case 'String':
      for (let i = 0; i < rows; i++) r.skip(r.uvarint());
      return;
    case 'FixedString':
      return r.skip(Number(args[0]) * rows);
    case 'Decimal': {
      const precision = Number(args[0]);
      return r.skip((precision <= 9 ? 4 : precision <= 18 ? 8 : precision <= 38 ? 16 : 32) * rows);
    }
    case 'Nullable':
      r.skip(rows);
      return skipData(args[0], rows, r);
    case 'SimpleAggregateFunction':
      return skipData(args[args.length - 1], rows, r);
    case 'Array':
    case 'Map':
    case 'Nested': {
      r.skip(8 * (rows - 1));
      const total = r.uint64();
      if (name === 'Array') return skipData(args[0], total, r);
      if (name === 'Map') {
        skipData(args[0], total, r);
        return skipData(args[1], total, r);
      }
      for (const a of args) skipData(elementType(a), total, r);
      return;
    }
    case 'Tuple':
      for (const a of args) skipData(elementType(a), rows, r);
      return;
    case 'LowCardinality': {
      const flags = r.uint64();
      const width = [1, 2, 4, 8][flags & 0xff];
      if (width === undefined) throw new Error('bad LowCardinality index type');
      if (flags & 0x200) {
        const keys = r.uint64();
        const inner = parseType(args[0]);
        skipData(inner.name === 'Nullable' ? inner.args[0] : args[0], keys, r);
      }
      const indexes = r.uint64();
      return r.skip(indexes * width);
    }
    default:
      throw new Unsupported(type);
  }
}

class Unsupported extends Error {}

/** Block info as a server writes it: field 1 is_overflows = false, field 2 bucket_num = -1, end. */
const BLOCK_INFO = Buffer.from([1, 0, 2, 0xff, 0xff, 0xff, 0xff, 0]);

/** chDB's revision-0 Native bytes, re-framed for a client of `revision` (see the module comment). */
export function nativeForRevision(bytes: Uint8Array, revision: number): Uint8Array {
  if (revision <= 0) return bytes;
  const r = new Reader(bytes);
  const parts: Uint8Array[] = [];
  try {
    while (!r.done) {
      parts.push(BLOCK_INFO);
      let from = r.pos;
      const columns = r.uvarint();
      const rows = r.uvarint();
      for (let c = 0; c < columns; c++) {
        r.string();
        const type = r.string();
        // Up to and including the type: copied; then the flag byte; then the column's data, copied.
        parts.push(bytes.subarray(from, r.pos));
        if (revision >= MIN_REVISION_WITH_CUSTOM_SERIALIZATION) parts.push(Buffer.from([0]));
        from = r.pos;
        if (rows > 0) {
          skipPrefix(type, r);
          skipData(type, rows, r);
        }
        parts.push(bytes.subarray(from, r.pos));
        from = r.pos;
      }
      if (columns === 0) parts.push(bytes.subarray(from, r.pos));
    }
  } catch (err) {
    if (err instanceof Unsupported) {
      throw new SqlError(
        48,
        'NOT_IMPLEMENTED',
        `Native output of type ${err.message} for client_protocol_version ${revision} is not supported here; use RowBinary or another format, or client_protocol_version=0`,
        400,
      );
    }
    throw err;
  }
  return Buffer.concat(parts);
}
