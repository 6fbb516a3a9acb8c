import assert from 'node:assert/strict';
import { gzipSync } from 'node:zlib';
import { after, before, describe, test } from 'node:test';
import { context, trace, SpanStatusCode } from '@opentelemetry/api';
import { OTLPTraceExporter as ProtoExporter } from '@opentelemetry/exporter-trace-otlp-proto';
import { OTLPTraceExporter as JsonExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { ProtobufTraceSerializer } from '@opentelemetry/otlp-transformer';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { BasicTracerProvider, SimpleSpanProcessor, type ReadableSpan, type SpanExporter } from '@opentelemetry/sdk-trace-base';
import { createTenantKey, startServer, type TestServer } from '../helpers/server.ts';

describe('POST /otel/v1/traces, end to end', () => {
  let server: TestServer;
  let acme: string;
  let globex: string;

  before(async () => {
    server = await startServer();
    acme = (await createTenantKey(server, 'acme')).key;
    globex = (await createTenantKey(server, 'globex')).key;
  });
  after(async () => server?.cleanup());

  /** A real SDK pipeline: a parent span and a gen_ai chat child, flushed through `exporter`. */
  async function emit(exporter: SpanExporter, prefix: string) {
    const provider = new BasicTracerProvider({
      resource: resourceFromAttributes({ 'service.name': 'otlp-agent' }),
      spanProcessors: [new SimpleSpanProcessor(exporter)],
    });
    const tracer = provider.getTracer('e2e');
    const parent = tracer.startSpan(`${prefix}.run`);
    const child = tracer.startSpan(
      `${prefix}.chat`,
      {
        attributes: {
          'gen_ai.operation.name': 'chat',
          'gen_ai.request.model': 'gpt-4o',
          'gen_ai.usage.input_tokens': 120,
          'gen_ai.usage.output_tokens': 30,
          'gen_ai.completion': 'hi there',
        },
      },
      trace.setSpan(context.active(), parent),
    );
    child.setStatus({ code: SpanStatusCode.ERROR, message: 'rate limited upstream' });
    child.end();
    parent.end();
    await provider.forceFlush();
    await provider.shutdown();
    return { traceId: parent.spanContext().traceId, parentId: parent.spanContext().spanId, childId: child.spanContext().spanId };
  }

  async function eventsOf(tool: string, key = acme) {
    const res = await server.request('GET', `/v1/traces?tool=${encodeURIComponent(tool)}`, { key });
    assert.equal(res.status, 200, res.text);
    return res.body.items;
  }

  for (const [name, make] of [
    ['protobuf', () => new ProtoExporter({ url: `${server.url}/otel/v1/traces`, headers: { authorization: `Bearer ${acme}` } })],
    ['JSON', () => new JsonExporter({ url: `${server.url}/otel/v1/traces`, headers: { authorization: `Bearer ${acme}` } })],
  ] as const) {
    test(`spans from the OpenTelemetry SDK's ${name} exporter become trace events of the tenant`, async () => {
      const prefix = `sdk-${name}`;
      const ids = await emit(make(), prefix);
      const [run] = await eventsOf(`${prefix}.run`);
      const [chat] = await eventsOf(`${prefix}.chat`);
      assert.ok(run && chat, 'both spans are stored');
      assert.equal(run.trace_id, ids.traceId);
      assert.equal(chat.trace_id, ids.traceId);
      assert.equal(run.span_id, ids.parentId);
      assert.equal(run.parent_span_id, null);
      assert.equal(chat.span_id, ids.childId);
      assert.equal(chat.parent_span_id, ids.parentId);
      assert.equal(run.event_type, 'tool_call');
      assert.equal(chat.event_type, 'llm_call');
      assert.equal(chat.phase, 'complete');
      assert.equal(chat.status, 'error');
      assert.equal(run.status, 'ok');
      assert.deepEqual(chat.cost, { input_tokens: 120, output_tokens: 30, cache_read_tokens: 0, reasoning_tokens: 0, model: 'gpt-4o', estimated_usd: 0 });
      assert.equal(chat.output, 'hi there');
      assert.equal(chat.metadata['gen_ai.request.model'], 'gpt-4o');
      assert.equal(chat.metadata['gen_ai.usage.input_tokens'], '120');
      assert.equal(chat.metadata['resource.service.name'], 'otlp-agent');
      assert.equal(chat.metadata['otel.status_message'], 'rate limited upstream');
      assert.equal(chat.tenant, 'acme');
      assert.equal(chat.sandbox_id, null);
      assert.deepEqual(await eventsOf(`${prefix}.chat`, globex), [], 'another tenant does not see them');
    });
  }

  test('gzip-compressed protobuf is accepted and answered with a protobuf ExportTraceServiceResponse', async () => {
    // InMemorySpanExporter forgets its spans at shutdown; this one keeps them.
    const spans: ReadableSpan[] = [];
    await emit(
      {
        export: (batch, done) => {
          spans.push(...batch);
          done({ code: 0 });
        },
        shutdown: async () => {},
      },
      'gzip',
    );
    const body = gzipSync(ProtobufTraceSerializer.serializeRequest(spans)!);
    const res = await fetch(`${server.url}/otel/v1/traces`, {
      method: 'POST',
      headers: { authorization: `Bearer ${acme}`, 'content-type': 'application/x-protobuf', 'content-encoding': 'gzip' },
      body,
    });
    assert.equal(res.status, 200, await res.clone().text());
    assert.equal(res.headers.get('content-type'), 'application/x-protobuf');
    assert.deepEqual(ProtobufTraceSerializer.deserializeResponse(new Uint8Array(await res.arrayBuffer())), {});
    assert.equal((await eventsOf('gzip.chat')).length, 1);
  });

  test('text/plain is 415 and garbage protobuf is 400, both as {message, error}', async () => {
    const plain = await server.request('POST', '/otel/v1/traces', { key: acme, body: 'hello', headers: { 'content-type': 'text/plain' } });
    assert.equal(plain.status, 415, plain.text);
    assert.equal(plain.body.error, 'unsupported_media_type');
    const garbage = await fetch(`${server.url}/otel/v1/traces`, {
      method: 'POST',
      headers: { authorization: `Bearer ${acme}`, 'content-type': 'application/x-protobuf' },
      body: Buffer.from([0x0a, 0xff, 0xff, 0xff, 0x0f, 0x01]),
    });
    assert.equal(garbage.status, 400);
    const body = await garbage.json();
    assert.equal(body.error, 'bad_request');
    assert.match(body.message, /^body: not an OTLP ExportTraceServiceRequest protobuf/);
    const badGzip = await fetch(`${server.url}/otel/v1/traces`, {
      method: 'POST',
      headers: { authorization: `Bearer ${acme}`, 'content-type': 'application/x-protobuf', 'content-encoding': 'gzip' },
      body: 'nope',
    });
    assert.equal(badGzip.status, 400);
    const noKey = await server.request('POST', '/otel/v1/traces', { key: null, body: {} });
    assert.equal(noKey.status, 401);
  });

  test('a batch with one bad span stores the rest and reports partialSuccess', async () => {
    const span = (spanId: string, name: string) => ({
      traceId: '0af7651916cd43dd8448eb211c80319c',
      spanId,
      name,
      startTimeUnixNano: '1767225600000000000',
      endTimeUnixNano: '1767225600500000000',
    });
    const res = await server.request('POST', '/otel/v1/traces', {
      key: acme,
      body: { resourceSpans: [{ scopeSpans: [{ spans: [span('b7ad6b7169203331', 'partial.good'), span('not-hex', 'partial.bad')] }] }] },
    });
    assert.equal(res.status, 200, res.text);
    assert.equal(res.body.partialSuccess.rejectedSpans, '1');
    assert.match(res.body.partialSuccess.errorMessage, /spans\[1\]\.spanId/);
    const [good] = await eventsOf('partial.good');
    assert.equal(good.duration_ms, 500);
    assert.equal(good.ts, '2026-01-01T00:00:00.000Z');
    assert.deepEqual(await eventsOf('partial.bad'), []);
  });
});

describe('POST /otel/v1/traces under the ingest rate limit', () => {
  let server: TestServer;
  before(async () => {
    server = await startServer({ SVC_RATE_LIMIT_INGEST_EVENTS: '3' });
  });
  after(async () => server?.cleanup());

  test('spans count as events against the per-key events/s limit: 429 with Retry-After past it', async () => {
    const { key } = await createTenantKey(server, 'acme');
    const spans = ['1', '2', '3'].map((n) => ({
      traceId: '0af7651916cd43dd8448eb211c80319c',
      spanId: n.repeat(16),
      name: 'limited',
      startTimeUnixNano: '1767225600000000000',
    }));
    const body = { resourceSpans: [{ scopeSpans: [{ spans }] }] };
    assert.equal((await server.request('POST', '/otel/v1/traces', { key, body })).status, 200);
    const limited = await server.request('POST', '/otel/v1/traces', { key, body });
    assert.equal(limited.status, 429, limited.text);
    assert.equal(limited.body.error, 'rate_limited');
    assert.ok(Number(limited.headers.get('retry-after')) >= 1);
  });
});
