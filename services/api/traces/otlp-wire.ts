/**
 * The ExportTraceServiceRequest fields the OTLP mapping reads, decoded straight from protobuf
 * with protobufjs's wire Reader into the shape `Type.toObject` gives (camelCase, bytes as
 * Buffers, 64-bit integers as Longs, enums as numbers). The reflection's `decode` then `toObject`
 * made two object trees per span, and every AnyValue's oneof setter deleted the other members.
 * Fields the mapping does not read are skipped. Field numbers are those of ./otlp-proto
 * (test/unit/otlp-wire.test.ts checks them against the loaded schema, and the result against toObject).
 */
import protobuf from 'protobufjs';

type Obj = Record<string, unknown>;

/** How deep AnyValues may nest (arrays and maps of values), as protoc's default recursion limit. */
const MAX_DEPTH = 100;

const VARINT = 0;
const FIXED64 = 1;
const LENGTH = 2;

/** The end of the length-delimited field the reader is at; throws when it passes the buffer's end. */
function endOf(r: protobuf.Reader): number {
  const end = r.uint32() + r.pos;
  if (end > r.len) throw new RangeError(`index out of range: ${end} > ${r.len}`);
  return end;
}

/** The next field's tag (its number above three bits of wire type). */
function tag(r: protobuf.Reader): number {
  const t = r.uint32();
  if (t >>> 3 === 0) throw new Error('illegal tag: field number 0');
  return t;
}

function endReached(r: protobuf.Reader, end: number): void {
  if (r.pos > end) throw new RangeError('a field runs past its message');
}

/**
 * Reads the fields of one message up to `end`, handing each to `field` (which returns false for
 * a field it does not take, or a field of another wire type: skipped as unknown).
 */
function fields(r: protobuf.Reader, end: number, field: (id: number, wire: number) => boolean): void {
  while (r.pos < end) {
    const t = tag(r);
    if (!field(t >>> 3, t & 7)) r.skipType(t & 7);
  }
  endReached(r, end);
}

/** Reads the messages of repeated field `id` up to `end` with `read`; other fields are skipped. */
function repeated(r: protobuf.Reader, end: number, id: number, read: (end: number) => void): void {
  while (r.pos < end) {
    const t = tag(r);
    if (t === ((id << 3) | LENGTH)) read(endOf(r));
    else r.skipType(t & 7);
  }
  endReached(r, end);
}

function keyValue(r: protobuf.Reader, end: number, depth: number): Obj {
  const kv: Obj = {};
  fields(r, end, (id, wire) => {
    if (wire !== LENGTH) return false;
    if (id === 1) kv.key = r.string();
    else if (id === 2) kv.value = anyValue(r, endOf(r), depth + 1);
    else return false;
    return true;
  });
  return kv;
}

/** The KeyValues of field 1 (Resource.attributes, KeyValueList.values). */
function keyValues(r: protobuf.Reader, end: number, depth: number): Obj[] {
  const out: Obj[] = [];
  repeated(r, end, 1, (kvEnd) => out.push(keyValue(r, kvEnd, depth)));
  return out;
}

/** An AnyValue: its oneof holds one member, the last one read. */
function anyValue(r: protobuf.Reader, end: number, depth: number): Obj {
  if (depth > MAX_DEPTH) throw new Error('max depth exceeded');
  let value: Obj = {};
  fields(r, end, (id, wire) => {
    if (id === 1 && wire === LENGTH) value = { stringValue: r.string() };
    else if (id === 2 && wire === VARINT) value = { boolValue: r.bool() };
    else if (id === 3 && wire === VARINT) value = { intValue: r.int64() };
    else if (id === 4 && wire === FIXED64) value = { doubleValue: r.double() };
    else if (id === 5 && wire === LENGTH) {
      const values: Obj[] = [];
      repeated(r, endOf(r), 1, (vEnd) => values.push(anyValue(r, vEnd, depth + 1)));
      value = { arrayValue: { values } };
    } else if (id === 6 && wire === LENGTH) value = { kvlistValue: { values: keyValues(r, endOf(r), depth + 1) } };
    else if (id === 7 && wire === LENGTH) value = { bytesValue: r.bytes() };
    else if (id === 8 && wire === VARINT) value = { stringValueStrindex: r.int32() };
    else return false;
    return true;
  });
  return value;
}

function status(r: protobuf.Reader, end: number): Obj {
  const out: Obj = {};
  fields(r, end, (id, wire) => {
    if (id === 2 && wire === LENGTH) out.message = r.string();
    else if (id === 3 && wire === VARINT) out.code = r.int32();
    else return false;
    return true;
  });
  return out;
}

function span(r: protobuf.Reader, end: number): Obj {
  const out: Obj = { attributes: [] };
  fields(r, end, (id, wire) => {
    if (wire === LENGTH) {
      if (id === 1) out.traceId = r.bytes();
      else if (id === 2) out.spanId = r.bytes();
      else if (id === 4) out.parentSpanId = r.bytes();
      else if (id === 5) out.name = r.string();
      else if (id === 9) (out.attributes as Obj[]).push(keyValue(r, endOf(r), 0));
      else if (id === 15) out.status = status(r, endOf(r));
      else return false;
    } else if (wire === FIXED64) {
      if (id === 7) out.startTimeUnixNano = r.fixed64();
      else if (id === 8) out.endTimeUnixNano = r.fixed64();
      else return false;
    } else return false;
    return true;
  });
  return out;
}

/**
 * An ExportTraceServiceRequest's bytes as `{resourceSpans: [...]}` and how many spans it holds;
 * throws on bytes that are not one. Spans past `maxSpans` are counted, not built: a 16 MiB body
 * of empty spans made 7.9 million objects (620 MB) before the request's limit could refuse it.
 */
export function readTraceRequest(body: Uint8Array, maxSpans: number): { request: Obj; spans: number } {
  const r = protobuf.Reader.create(body);
  let count = 0;
  const resourceSpans: Obj[] = [];
  repeated(r, r.len, 1, (rsEnd) => {
    const rs: Obj = { scopeSpans: [] };
    fields(r, rsEnd, (id, wire) => {
      if (wire !== LENGTH) return false;
      if (id === 1) rs.resource = { attributes: keyValues(r, endOf(r), 0) };
      else if (id === 2) {
        const spans: Obj[] = [];
        repeated(r, endOf(r), 2, (spanEnd) => {
          if (++count <= maxSpans) spans.push(span(r, spanEnd));
          else r.pos = spanEnd;
        });
        (rs.scopeSpans as Obj[]).push({ spans });
      } else return false;
      return true;
    });
    resourceSpans.push(rs);
  });
  return { request: { resourceSpans }, spans: count };
}
