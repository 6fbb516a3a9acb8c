/**
 * Red team: bodies built to crash the service. A trace with 50,000-deep `metadata` overflowed
 * the stack of validation (500). Every JSON body now nests at most 100 levels, checked on the
 * text before anything walks it: a 400 naming where, on every ingest path and every JSON endpoint.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { gzipSync } from 'node:zlib';
import { createTenantKey, startServer, traceEvent, type TestServer } from '../helpers/server.ts';
import { lengthField } from '../helpers/protobuf-wire.ts';

const DEPTH = 50_000;
const TOO_DEEP = /deeper than 100 levels/;

/** `{"a":{"a":...1...}}`, `depth` objects deep, as text (JSON.stringify itself would overflow on it). */
const deepObject = (depth: number) => `${'{"a":'.repeat(depth)}1${'}'.repeat(depth)}`;

/** A trace batch whose one event carries `metadata` nested `depth` levels. */
function deepTraceBatch(depth: number): string {
  const event = JSON.stringify(traceEvent({ metadata: '__DEEP__' }));
  return JSON.stringify({ events: ['__EVENT__'] })
    .replace('"__EVENT__"', event)
    .replace('"__DEEP__"', deepObject(depth));
}

/** An OTLP/JSON request whose one span has an attribute of kvlists nested `levels` deep (4 JSON levels each). */
function deepOtlpJson(levels: number): string {
  const value = `${'{"kvlistValue":{"values":[{"key":"a","value":'.repeat(levels)}{"stringValue":"x"}${'}]}}'.repeat(levels)}`;
  const span = {
    traceId: '0af7651916cd43dd8448eb211c80319c',
    spanId: 'b7ad6b7169203331',
    name: 'tool',
    startTimeUnixNano: '1700000000000000000',
    endTimeUnixNano: '1700000000500000000',
    attributes: ['__ATTR__'],
  };
  return JSON.stringify({ resourceSpans: [{ scopeSpans: [{ spans: [span] }] }] }).replace('"__ATTR__"', `{"key":"deep","value":${value}}`);
}

/** An OTLP protobuf request: a resource attribute whose AnyValue nests kvlists `levels` deep. */
function deepOtlpProtobuf(levels: number): Buffer {
  // AnyValue{kvlist_value(6): KeyValueList{values(1): KeyValue{key(1): "a", value(2): AnyValue}}}, from the inside out.
  let any = lengthField(1, Buffer.from('x')); // AnyValue{string_value}
  for (let i = 0; i < levels; i++) any = lengthField(6, lengthField(1, Buffer.concat([lengthField(1, Buffer.from('a')), lengthField(2, any)])));
  const keyValue = Buffer.concat([lengthField(1, Buffer.from('deep')), lengthField(2, any)]);
  return lengthField(1, lengthField(1, lengthField(1, keyValue))); // Request{resource_spans: ResourceSpans{resource: Resource{attributes}}}
}

describe('red team: deep JSON bodies are a 400 naming where, never a crash', () => {
  let server: TestServer;
  let key: string;
  const post = (p: string, body: string | Uint8Array<ArrayBuffer>, headers: Record<string, string> = {}, k = key) =>
    fetch(`${server.url}${p}`, { method: 'POST', headers: { authorization: `Bearer ${k}`, 'content-type': 'application/json', ...headers }, body }).then(
      async (res) => ({ status: res.status, body: (await res.json()) as { message: string; error: string } }),
    );

  before(async () => {
    server = await startServer({ SVC_SANDBOX_HOST_ROOTFS: 'true', SVC_RATE_LIMIT_WRITES: '0', SVC_RATE_LIMIT_READS: '0' });
    key = (await createTenantKey(server, 'acme')).key;
  });
  after(async () => server?.cleanup());

  test('POST /v1/traces with 50,000-deep metadata: 400 naming the field, plain and gzipped, and nothing stored', async () => {
    const body = deepTraceBatch(DEPTH);
    for (const [name, sent, headers] of [
      ['plain', body, {}],
      ['gzip', new Uint8Array(gzipSync(body)), { 'content-encoding': 'gzip' }],
    ] as const) {
      const res = await post('/v1/traces', sent, headers);
      assert.equal(res.status, 400, `${name}: ${JSON.stringify(res.body)}`);
      assert.match(res.body.message, /^events\[0\]\.metadata\.a\.a/);
      assert.match(res.body.message, TOO_DEEP);
    }
    // A bare array names it `body`.
    const bare = await post('/v1/traces', `[${deepObject(DEPTH)}]`);
    assert.equal(bare.status, 400);
    assert.match(bare.body.message, /^body\[0\]\.a\.a.*deeper than 100 levels/);
    const stored = await server.request('GET', '/v1/traces', { key });
    assert.equal(stored.status, 200);
    assert.equal(stored.body.items.length, 0, 'nothing of the request is stored');
    // Nesting within the limit is fine, and stored as the JSON text of the value.
    const ok = await post('/v1/traces', deepTraceBatch(90));
    assert.equal(ok.status, 200, JSON.stringify(ok.body));
  });

  test('OTLP/JSON with attributes nested 50,000 levels: 400 naming the field', async () => {
    const res = await post('/otel/v1/traces', deepOtlpJson(DEPTH / 4));
    assert.equal(res.status, 400, JSON.stringify(res.body));
    assert.match(res.body.message, /^resourceSpans\[0\]\.scopeSpans\[0\]\.spans\[0\]/);
    assert.match(res.body.message, TOO_DEEP);
  });

  test("OTLP protobuf nested past the decoder's limit: 400 (held before; keeps holding)", async () => {
    const res = await fetch(`${server.url}/otel/v1/traces`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/x-protobuf' },
      body: new Uint8Array(deepOtlpProtobuf(5_000)),
    });
    assert.equal(res.status, 400, await res.clone().text());
    assert.match(((await res.json()) as { message: string }).message, /^body: .*depth/);
  });

  test('deep JSON on other JSON endpoints, with and without Idempotency-Key: 400 naming where', async () => {
    const cases: Array<[string, string, Record<string, string>, RegExp]> = [
      ['/v1/sandboxes', `{"spec_id":"x","metadata":${deepObject(DEPTH)}}`, {}, /^metadata\.a\.a/],
      // The idempotency fingerprint serialised the parsed body: a stack overflow before.
      ['/v1/sandboxes', `{"spec_id":"x","metadata":${deepObject(DEPTH)}}`, { 'idempotency-key': 'deep-1' }, /^metadata\.a\.a/],
      ['/v1/experiments', `{"name":"e","spec_id":"x","matrix":[${deepObject(DEPTH)}]}`, {}, /^matrix\[0\]\.a\.a/],
      ['/v1/admin/keys', `[${'['.repeat(DEPTH)}${']'.repeat(DEPTH)}]`, {}, /^body\[0\]\[0\]/],
    ];
    for (const [p, body, headers, where] of cases) {
      const res = await post(p, body, headers, p.startsWith('/v1/admin') ? 'test-admin-key-0123456789' : key);
      assert.equal(res.status, 400, `${p} ${JSON.stringify(headers)}: ${JSON.stringify(res.body)}`);
      assert.match(res.body.message, where);
      assert.match(res.body.message, TOO_DEEP);
    }
    assert.equal((await server.request('GET', '/health', { key: null })).status, 200, 'the service is fine');
  });

  test("a sandbox's trace endpoint with 50,000-deep metadata: 400 naming the field", {
    skip: process.env.SVC_TEST_BWRAP ? false : 'SVC_TEST_BWRAP is unset (npm test sets it when bubblewrap runs here)',
  }, async () => {
    const spec = `version: 1\nid: basic\nbase: debian:bookworm\ntask:\n  prompt: p\ninvariants:\n  t:\n    check: {type: command_exit, command: "true"}\n`;
    assert.equal((await server.request('POST', '/v1/specs', { key, body: spec, headers: { 'content-type': 'application/x-yaml' } })).status, 201);
    const sb = await server.request('POST', '/v1/sandboxes', { key, body: { spec_id: 'basic' } });
    assert.equal(sb.status, 201, sb.text);
    const token = (await server.request('POST', `/v1/sandboxes/${sb.body.id}/commands`, { key, body: { command: 'printf %s "$SVC_API_KEY"' } })).body
      .stdout as string;
    for (const k of [key, token]) {
      const res = await post(`/v1/sandboxes/${sb.body.id}/trace`, deepTraceBatch(DEPTH), {}, k);
      assert.equal(res.status, 400, JSON.stringify(res.body));
      assert.match(res.body.message, /^events\[0\]\.metadata\.a\.a.*deeper than 100 levels/);
    }
    assert.equal((await server.request('DELETE', `/v1/sandboxes/${sb.body.id}`, { key })).status, 200);
  });
});
