import assert from 'node:assert/strict';
import path from 'node:path';
import { test } from 'node:test';
import protobuf from 'protobufjs';
import { decodeOtlpProtobuf, encodeOtlpResponse, otlpJsonResponse, otlpToTraceEvents } from '../../services/api/traces/otlp-mapping.ts';

const LIMITS = { maxEvents: 1000, maxFieldBytes: 64 };
const TRACE = '5b8efff798038103d269b633813fc60c';
const str = (key: string, value: string) => ({ key, value: { stringValue: value } });
const int = (key: string, value: number | string) => ({ key, value: { intValue: value } });

function span(extra: Record<string, unknown>) {
  return {
    traceId: TRACE,
    spanId: 'eee19b7ec3c1b174',
    name: 'work',
    startTimeUnixNano: '1700000000123456789',
    endTimeUnixNano: '1700000000373456789',
    ...extra,
  };
}
function request(spans: unknown[], resourceAttributes: unknown[] = []) {
  return { resourceSpans: [{ resource: { attributes: resourceAttributes }, scopeSpans: [{ scope: { name: 't' }, spans }] }] };
}

test('a gen_ai chat span is an llm_call with tokens, model and gen_ai attributes in metadata', () => {
  const attrs = [
    str('gen_ai.operation.name', 'chat'),
    str('gen_ai.request.model', 'gpt-4o'),
    str('gen_ai.response.model', 'gpt-4o-2024'),
    int('gen_ai.usage.input_tokens', '120'),
    int('gen_ai.usage.output_tokens', 30),
    str('gen_ai.prompt', 'p'.repeat(100)),
    str('gen_ai.completion', 'ok'),
    { key: 'svc.cost_usd', value: { doubleValue: 0.5 } },
  ];
  const { events, rejected } = otlpToTraceEvents(request([span({ parentSpanId: 'aaaaaaaaaaaaaaaa', attributes: attrs, kind: 3 })]), LIMITS);
  assert.equal(rejected, 0);
  const [e] = events;
  assert.equal(e.event_type, 'llm_call');
  assert.equal(e.tool, 'work');
  assert.equal(e.trace_id, TRACE);
  assert.equal(e.span_id, 'eee19b7ec3c1b174');
  assert.equal(e.parent_span_id, 'aaaaaaaaaaaaaaaa');
  assert.equal(e.phase, 'complete');
  assert.equal(e.ts_us, 1700000000123456);
  assert.equal(e.duration_ms, 250);
  assert.equal(e.status, 'ok');
  assert.deepEqual(e.cost, { input_tokens: 120, output_tokens: 30, cache_read_tokens: 0, reasoning_tokens: 0, model: 'gpt-4o-2024', estimated_usd: 0.5 });
  assert.equal(e.input, 'p'.repeat(64), 'input is truncated to the field limit');
  assert.equal(e.output, 'ok');
  assert.equal(e.metadata['gen_ai.usage.input_tokens'], '120');
  assert.equal(e.metadata['gen_ai.request.model'], 'gpt-4o');
});

test('gen_ai.system alone marks an llm_call; tokens without a usd attribute cost 0', () => {
  const [e] = otlpToTraceEvents(request([span({ attributes: [str('gen_ai.system', 'openai'), int('gen_ai.usage.input_tokens', 5)] })]), LIMITS).events;
  assert.equal(e.event_type, 'llm_call');
  assert.deepEqual(e.cost, { input_tokens: 5, output_tokens: 0, cache_read_tokens: 0, reasoning_tokens: 0, model: '', estimated_usd: 0 });
});

test('execute_tool is a tool_use named by gen_ai.tool.name; a plain span is a tool_call without cost', () => {
  const { events } = otlpToTraceEvents(
    request([
      span({ attributes: [str('gen_ai.operation.name', 'execute_tool'), str('gen_ai.tool.name', 'search')] }),
      span({ spanId: '1111111111111111', name: 'db.query', attributes: [str('input.value', 'select 1')] }),
    ]),
    LIMITS,
  );
  assert.equal(events[0].event_type, 'tool_use');
  assert.equal(events[0].tool, 'search');
  assert.equal(events[1].event_type, 'tool_call');
  assert.equal(events[1].tool, 'db.query');
  assert.equal(events[1].cost, null);
  assert.equal(events[1].input, 'select 1');
  assert.equal(events[1].parent_span_id, null);
});

test('ERROR status (number or enum name) is an error with its message kept', () => {
  const { events } = otlpToTraceEvents(
    request([
      span({ status: { code: 2, message: 'boom' } }),
      span({ spanId: '2222222222222222', status: { code: 'STATUS_CODE_ERROR' } }),
      span({ spanId: '3333333333333333', status: { code: 1 } }),
    ]),
    LIMITS,
  );
  assert.deepEqual(
    events.map((e) => e.status),
    ['error', 'error', 'ok'],
  );
  assert.equal(events[0].metadata['otel.status_message'], 'boom');
});

test('resource attributes are prefixed resource.; arrays, bools and maps are flattened to strings', () => {
  const attrs = [
    { key: 'tags', value: { arrayValue: { values: [{ stringValue: 'a' }, { intValue: '2' }] } } },
    { key: 'flag', value: { boolValue: true } },
    { key: 'm', value: { kvlistValue: { values: [str('k', 'v')] } } },
  ];
  const [e] = otlpToTraceEvents(request([span({ attributes: attrs })], [str('service.name', 'my-agent')]), LIMITS).events;
  assert.deepEqual(e.metadata, { 'resource.service.name': 'my-agent', tags: '["a","2"]', flag: 'true', m: '{"k":"v"}' });
});

test('protobuf ids (bytes) are hex; bad ids are rejected per span while the rest are kept', () => {
  const bytes = Buffer.from(TRACE, 'hex');
  const { events, rejected, errors } = otlpToTraceEvents(
    request([
      span({ traceId: bytes, spanId: Buffer.from('0102030405060708', 'hex'), parentSpanId: new Uint8Array(0) }),
      span({ traceId: '00000000000000000000000000000000' }),
      span({ spanId: 'xyz' }),
      span({ traceId: new Uint8Array(3) }),
      span({ startTimeUnixNano: undefined }),
    ]),
    LIMITS,
  );
  assert.equal(events.length, 1);
  assert.equal(events[0].trace_id, TRACE);
  assert.equal(events[0].span_id, '0102030405060708');
  assert.equal(events[0].parent_span_id, null);
  assert.equal(rejected, 4);
  assert.match(errors[0], /resourceSpans\[0\]\.scopeSpans\[0\]\.spans\[1\]\.traceId/);
  assert.match(errors[1], /spans\[2\]\.spanId/);
  assert.match(errors[3], /startTimeUnixNano is missing/);
});

test('more spans than the limit is a 400 naming the count; a wrong shape is a 400 naming the field', () => {
  const spans = Array.from({ length: 3 }, (_, i) => span({ spanId: `${i}`.padStart(16, 'a') }));
  assert.throws(
    () => otlpToTraceEvents(request(spans), { ...LIMITS, maxEvents: 2 }),
    (e: any) => e.status === 400 && /at most 2 spans per request, got 3/.test(e.message),
  );
  assert.throws(
    () => otlpToTraceEvents({ resourceSpans: {} }, LIMITS),
    (e: any) => e.status === 400 && /^resourceSpans: must be an array/.test(e.message),
  );
  assert.deepEqual(otlpToTraceEvents({}, LIMITS), { events: [], rejected: 0, errors: [] });
});

test('protobuf 64-bit integers are exact: nanoseconds past 2^53, int64 attributes at both ends; a JSON object for a time is rejected', () => {
  const root = new protobuf.Root();
  const dir = path.join(import.meta.dirname, '../../services/api/traces/otlp-proto');
  root.resolvePath = (_origin, target) => (path.isAbsolute(target) ? target : path.join(dir, target));
  root.loadSync('opentelemetry/proto/collector/trace/v1/trace_service.proto');
  const Request = root.lookupType('opentelemetry.proto.collector.trace.v1.ExportTraceServiceRequest');
  const ids = { traceId: Buffer.from(TRACE, 'hex'), spanId: Buffer.from('eee19b7ec3c1b174', 'hex') };
  const body = Request.encode(
    Request.fromObject(
      request([
        {
          ...ids,
          name: 'a',
          startTimeUnixNano: '1700000000123456789',
          endTimeUnixNano: '1700000000373456789',
          attributes: [int('min', '-9223372036854775808'), int('max', '9223372036854775807'), int('n', 900)],
        },
        { ...ids, name: 'b', startTimeUnixNano: '18446744073709551615' },
        { ...ids, name: 'c', startTimeUnixNano: '0' },
      ]),
    ),
  ).finish();
  const { events, rejected, errors } = otlpToTraceEvents(decodeOtlpProtobuf(body, LIMITS.maxEvents), LIMITS);
  assert.equal(events[0].ts_us, 1700000000123456);
  assert.equal(events[0].duration_ms, 250);
  assert.deepEqual(events[0].metadata, { min: '-9223372036854775808', max: '9223372036854775807', n: '900' });
  assert.equal(events[1].ts_us, Number(18446744073709551615n / 1000n));
  assert.equal(events[1].duration_ms, 0);
  assert.equal(rejected, 1);
  assert.match(errors[0], /spans\[2\]\.startTimeUnixNano is missing/);

  const json = otlpToTraceEvents(request([span({ startTimeUnixNano: { low: 1, high: 1, unsigned: true } })]), LIMITS);
  assert.equal(json.rejected, 1);
  assert.match(json.errors[0], /startTimeUnixNano must be an unsigned integer of nanoseconds/);
});

test('garbage protobuf is a 400; responses encode partial success', () => {
  assert.throws(
    () => decodeOtlpProtobuf(Buffer.from([0x0a, 0xff, 0xff, 0xff, 0x0f, 0x01]), 1000),
    (e: any) => e.status === 400 && /^body: not an OTLP/.test(e.message),
  );
  assert.equal(encodeOtlpResponse(null).length, 0);
  assert.ok(encodeOtlpResponse({ rejectedSpans: 1, errorMessage: 'x' }).length > 0);
  assert.deepEqual(otlpJsonResponse({ rejectedSpans: 2, errorMessage: 'bad' }), { partialSuccess: { rejectedSpans: '2', errorMessage: 'bad' } });
});
