import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import path from 'node:path';
import { test } from 'node:test';
import protobuf from 'protobufjs';
import { decodeOtlpProtobuf } from '../../services/api/traces/otlp-mapping.ts';
import { readTraceRequest } from '../../services/api/traces/otlp-wire.ts';
import { lengthField } from '../helpers/protobuf-wire.ts';

const root = new protobuf.Root();
const dir = path.join(import.meta.dirname, '../../services/api/traces/otlp-proto');
root.resolvePath = (_origin, target) => (path.isAbsolute(target) ? target : path.join(dir, target));
root.loadSync('opentelemetry/proto/collector/trace/v1/trace_service.proto');
const Request = root.lookupType('opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest');
type Obj = Record<string, any>;

/** The fields readTraceRequest takes, by message, with the numbers it reads them by. */
const FIELDS: Record<string, Record<string, number>> = {
  'collector.trace.v1.ExportTraceServiceRequest': { resourceSpans: 1 },
  'trace.v1.ResourceSpans': { resource: 1, scopeSpans: 2 },
  'resource.v1.Resource': { attributes: 1 },
  'trace.v1.ScopeSpans': { spans: 2 },
  'trace.v1.Span': { traceId: 1, spanId: 2, parentSpanId: 4, name: 5, startTimeUnixNano: 7, endTimeUnixNano: 8, attributes: 9, status: 15 },
  'trace.v1.Status': { message: 2, code: 3 },
  'common.v1.KeyValue': { key: 1, value: 2 },
  'common.v1.KeyValueList': { values: 1 },
  'common.v1.ArrayValue': { values: 1 },
  'common.v1.AnyValue': { stringValue: 1, boolValue: 2, intValue: 3, doubleValue: 4, arrayValue: 5, kvlistValue: 6, bytesValue: 7, stringValueStrindex: 8 },
};

test('the wire decoder reads the field numbers of the vendored opentelemetry-proto schema', () => {
  for (const [type, fields] of Object.entries(FIELDS)) {
    const t = root.lookupType(`opentelemetry.proto.${type}`);
    for (const [name, id] of Object.entries(fields)) assert.equal(t.fields[name]?.id, id, `${type}.${name}`);
  }
  assert.deepEqual(root.lookupType('opentelemetry.proto.common.v1.AnyValue').oneofs.value.oneof.sort(), Object.keys(FIELDS['common.v1.AnyValue']).sort());
});

/** toObject's answer cut to the fields readTraceRequest takes. */
function taken(value: any, type: protobuf.Type): any {
  const keys = FIELDS[type.fullName.replace('.opentelemetry.proto.', '')];
  const out: Obj = {};
  for (const [name, v] of Object.entries(value as Obj)) {
    if (!keys || !(name in keys)) continue;
    const field = type.fields[name]!.resolve();
    const sub = field.resolvedType instanceof protobuf.Type ? field.resolvedType : null;
    out[name] = sub === null ? v : Array.isArray(v) ? v.map((x) => taken(x, sub)) : taken(v, sub);
  }
  return out;
}

const reference = (body: Uint8Array) => taken(Request.toObject(Request.decode(body), { enums: Number, arrays: true }), Request);

const any = (v: Obj) => v;
const attrs = [
  { key: 's', value: any({ stringValue: 'héllo ✓' }) },
  { key: 'b', value: any({ boolValue: true }) },
  { key: 'i', value: any({ intValue: '-9223372036854775808' }) },
  { key: 'd', value: any({ doubleValue: 1.5 }) },
  { key: 'y', value: any({ bytesValue: Buffer.from([0, 1, 255]) }) },
  { key: 'a', value: any({ arrayValue: { values: [{ stringValue: 'x' }, { arrayValue: { values: [{ intValue: 7 }] } }, {}] } }) },
  { key: 'm', value: any({ kvlistValue: { values: [{ key: 'k', value: { boolValue: false } }, { key: 'n' }] } }) },
  { key: 'e', value: any({}) },
  { key: 'x', value: any({ stringValueStrindex: 3 }) },
];

test('the wire decoder gives what the reflection decode and toObject give, unknown fields skipped', () => {
  const body = Request.encode(
    Request.fromObject({
      resourceSpans: [
        {
          resource: { attributes: attrs, droppedAttributesCount: 2 },
          schemaUrl: 'https://example.com/schema',
          scopeSpans: [
            {
              scope: { name: 'lib', version: '1', attributes: attrs },
              schemaUrl: 'u',
              spans: [
                {
                  traceId: randomBytes(16),
                  spanId: randomBytes(8),
                  parentSpanId: randomBytes(8),
                  traceState: 'a=b',
                  flags: 1,
                  kind: 3,
                  name: 'chat',
                  startTimeUnixNano: '18446744073709551615',
                  endTimeUnixNano: '1700000000373456789',
                  attributes: attrs,
                  droppedAttributesCount: 1,
                  events: [{ timeUnixNano: '1', name: 'ev', attributes: attrs }],
                  links: [{ traceId: randomBytes(16), spanId: randomBytes(8), attributes: attrs }],
                  status: { code: 2, message: 'boom' },
                },
                { name: 'bare' },
              ],
            },
            {},
          ],
        },
        { resource: {} },
        {},
      ],
    }),
  ).finish();
  const ours = readTraceRequest(body, 1000).request;
  assert.deepEqual(ours, reference(body));
  assert.equal((ours as any).resourceSpans[0].scopeSpans[0].spans[0].attributes.length, attrs.length);
  assert.deepEqual(readTraceRequest(new Uint8Array(0), 1000).request, reference(new Uint8Array(0)));
});

test("an AnyValue's oneof keeps the last member read, as protobuf says", () => {
  // KeyValue{key: 'k', value: AnyValue{string_value: 'a', int_value: 5}}, and the two members the other way round.
  const value = (members: number[]) => Buffer.concat([lengthField(1, Buffer.from('k')), lengthField(2, members)]);
  // Request{resource_spans: ResourceSpans{scope_spans: ScopeSpans{spans: Span{attributes: kv}}}}
  const request = (kv: Buffer) => lengthField(1, lengthField(2, lengthField(2, lengthField(9, kv))));
  for (const members of [
    [0x0a, 0x01, 0x61, 0x18, 0x05],
    [0x18, 0x05, 0x0a, 0x01, 0x61],
  ]) {
    const body = request(value(members));
    const ours = readTraceRequest(body, 1000).request as any;
    assert.deepEqual(ours, reference(body));
    assert.equal(Object.keys(ours.resourceSpans[0].scopeSpans[0].spans[0].attributes[0].value).length, 1);
  }
});

test('bytes that are not a request are a 400, whatever they hold: cut, mangled, runaway lengths, deep nesting', () => {
  const good = Request.encode(
    Request.fromObject({
      resourceSpans: [{ resource: { attributes: attrs }, scopeSpans: [{ spans: [{ name: 'n', traceId: randomBytes(16), attributes: attrs }] }] }],
    }),
  ).finish();
  const isBadRequest = (e: any) => e.status === 400 && /^body: not an OTLP ExportTraceServiceRequest protobuf/.test(e.message);
  for (let cut = 1; cut < good.length; cut += 7) {
    try {
      decodeOtlpProtobuf(good.subarray(0, cut), 1000);
    } catch (e) {
      assert.ok(isBadRequest(e), String(e));
    }
  }
  for (let i = 0; i < 2000; i++) {
    const mangled = Buffer.from(good);
    for (let k = 0; k < 3; k++) mangled[(i * 7919 + k * 104729) % mangled.length] = (i * 31 + k * 17) & 0xff;
    try {
      decodeOtlpProtobuf(mangled, 1000);
    } catch (e) {
      assert.ok(isBadRequest(e), String(e));
    }
  }
  // A length past the end, field number 0, and an end-group tag with no group.
  for (const bytes of [[0x0a, 0xff, 0xff, 0xff, 0x0f, 0x01], [0x02, 0x00], [0x0c]])
    assert.throws(() => decodeOtlpProtobuf(Buffer.from(bytes), 1000), isBadRequest);
  // 10,000 arrays in arrays: refused at protoc's depth, not a stack overflow.
  let inner = Buffer.alloc(0);
  for (let d = 0; d < 10_000; d++) inner = lengthField(5, lengthField(1, inner)); // AnyValue{array_value: ArrayValue{values}}
  // Request{resource_spans: ResourceSpans{scope_spans: ScopeSpans{spans: Span{attributes: KeyValue{value}}}}}
  const deep = lengthField(1, lengthField(2, lengthField(2, lengthField(9, lengthField(2, inner)))));
  assert.throws(
    () => decodeOtlpProtobuf(deep, 1000),
    (e: any) => isBadRequest(e) && /max depth exceeded/.test(e.message),
  );
});

test('spans past the request limit are counted, not built: a 15 MiB body of empty spans is a 400 naming the count', () => {
  const empty = Buffer.alloc(15 * 1024 * 1024);
  for (let i = 0; i < empty.length; i += 2) empty[i] = 0x12; // ScopeSpans.spans, length 0
  // Request{resource_spans: ResourceSpans{scope_spans: ScopeSpans{spans...}}}, twice over: the count runs across both.
  const body = Buffer.concat([lengthField(1, lengthField(2, empty)), lengthField(1, lengthField(2, lengthField(2, [])))]);
  const total = empty.length / 2 + 1;
  const read = readTraceRequest(body, 5);
  assert.equal(read.spans, total);
  assert.deepEqual(
    (read.request as any).resourceSpans.map((rs: any) => rs.scopeSpans[0].spans.length),
    [5, 0],
  );
  assert.throws(
    () => decodeOtlpProtobuf(body, 1000),
    (e: any) => e.status === 400 && e.message === `resourceSpans: at most 1000 spans per request, got ${total}`,
  );
  assert.equal(readTraceRequest(body.subarray(0, 0), 5).spans, 0);
});
