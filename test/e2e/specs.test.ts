/**
 * Specs over HTTP against the real service: the round trip of a document using every block,
 * versions, reads pinned to a version, deletion, validation errors listed by path, media types,
 * tenant isolation, the published JSON Schema, and a restart.
 */
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Ajv } from 'ajv';
import { parse as parseYaml } from 'yaml';
import { createTenantKey, REPO, startServer, type TestServer } from '../helpers/server.ts';

const MINIMAL = (id: string, extra = '') =>
  `version: 1\nid: ${id}\nbase: debian:bookworm\ntask: {prompt: go}\ninvariants:\n  ok: {check: {type: file_exists, path: out.txt}}\n${extra}`;

describe('specs', () => {
  let server: TestServer;
  let key: string;
  let other: string;
  let full: string;
  const put = (yaml: string, k = key, type = 'application/x-yaml') =>
    server.request('POST', '/v1/specs', { key: k, body: yaml, headers: { 'content-type': type } });
  const get = (p: string, k = key) => server.request('GET', p, { key: k });

  before(async () => {
    server = await startServer({ SVC_RATE_LIMIT_WRITES: '0', SVC_RATE_LIMIT_READS: '0' });
    key = (await createTenantKey(server, 'acme')).key;
    other = (await createTenantKey(server, 'globex')).key;
    full = /```yaml\n([\s\S]*?)```/.exec(await readFile(path.join(REPO, 'docs', 'spec-format.md'), 'utf8'))![1];
  });
  after(() => server.cleanup());

  test('a document using every block round-trips: record, parsed document and original YAML', async () => {
    const parsed = parseYaml(full) as Record<string, unknown>;
    for (const block of [
      'version',
      'id',
      'base',
      'task',
      'agent',
      'services',
      'fixtures',
      'setup',
      'secrets',
      'network',
      'audit',
      'invariants',
      'forbidden',
      'scoring',
      'parallelism',
      'determinism',
      'resources',
      'snapshots',
      'teardown',
      'alerts',
    ]) {
      assert.ok(block in parsed, `the documented example uses ${block}`);
    }
    const res = await put(full);
    assert.equal(res.status, 201, res.text);
    assert.deepEqual(Object.keys(res.body).sort(), ['created_at', 'id', 'spec', 'version', 'yaml']);
    assert.equal(res.body.id, parsed.id);
    assert.equal(res.body.version, 1);
    assert.equal(res.body.yaml, full);
    assert.deepEqual(res.body.spec, JSON.parse(JSON.stringify(parsed)));
    const read = await get(`/v1/specs/${parsed.id}`);
    assert.deepEqual(read.body, res.body, 'readable as soon as the upload returns');
  });

  test('re-uploading an id increments the version; a read may pin an older one', async () => {
    assert.equal((await put(MINIMAL('flow'), key, 'text/yaml')).body.version, 1);
    const second = await put(MINIMAL('flow', 'resources: {timeout: 20m}\n'));
    assert.equal(second.body.version, 2);
    assert.equal((await get('/v1/specs/flow')).body.version, 2);
    const first = await get('/v1/specs/flow?version=1');
    assert.equal(first.body.version, 1);
    assert.equal(first.body.spec.resources, undefined);
    assert.equal((await get('/v1/specs/flow?version=3')).status, 404);
    assert.equal((await get('/v1/specs/flow?version=0')).status, 400);
    assert.equal((await get('/v1/specs/flow?version=abc')).status, 400);
    assert.equal((await get('/v1/specs/flow?bogus=1')).status, 400);
    const list = await get('/v1/specs');
    const flow = list.body.items.find((s: { id: string }) => s.id === 'flow');
    assert.equal(flow.version, 2, 'the list shows the latest version of each spec');
    assert.equal(list.body.count, list.body.items.length);
  });

  test('delete removes every version', async () => {
    await put(MINIMAL('doomed'));
    await put(MINIMAL('doomed'));
    assert.equal((await server.request('DELETE', '/v1/specs/doomed', { key })).status, 200);
    assert.equal((await get('/v1/specs/doomed')).status, 404);
    assert.equal((await get('/v1/specs/doomed?version=1')).status, 404);
    const list = await get('/v1/specs');
    assert.equal(list.status, 200, list.text);
    assert.ok(!list.body.items.some((s: { id: string }) => s.id === 'doomed'));
    assert.equal((await server.request('DELETE', '/v1/specs/doomed', { key })).status, 404);
  });

  test('invalid documents are one 400 listing every problem by its path', async () => {
    const cases: Array<[string, RegExp]> = [
      ['version: 1\nid: x\n  bad: [indent', /^spec: malformed YAML at line \d+, column \d+/],
      ['- just\n- a list\n', /must be a YAML mapping|must be a mapping/],
      ['version: 1\nid: x\n', /base: is required.*task: is required.*invariants: is required/],
      [MINIMAL('x').replace('type: file_exists, path: out.txt', 'type: foo'), /invariants\.ok\.check\.type: unknown type "foo"; one of command_exit/],
      [MINIMAL('x', 'forbidden: {no_such_rule: []}\n'), /forbidden\.no_such_rule: /],
      [MINIMAL('x', 'forbidden: {db_writes_outside: [orders]}\n'), /forbidden\.db_writes_outside: needs audit\.db_writes: true/],
      [MINIMAL('x', 'forbidden: {secrets_in_logs: deny}\n'), /forbidden\.secrets_in_logs: needs audit\.stdout_capture: true/],
      [MINIMAL('x', 'resources: {timeout: soon}\n'), /resources\.timeout: /],
      [MINIMAL('x', 'network: {egress: {allow: ["bad host!"]}}\n'), /network\.egress\.allow\[0\]: /],
      [MINIMAL('x', 'parallelism: {matrix: [1, 2]}\n'), /parallelism\.matrix\[0\]: /],
      [MINIMAL('x', 'parallelism: {matrix: {a: 1}}\n'), /parallelism\.matrix: /],
      [
        MINIMAL('x').replace('{check: {type: file_exists, path: out.txt}}', '{check: {type: file_exists, path: out.txt}, weight: 500}'),
        /invariants\.ok\.weight: /,
      ],
      [MINIMAL('x', 'agent: {type: snapshot, snapshot: coder, tag: v1}\n'), /agent\.tag: /],
      [MINIMAL('x', 'surprise: true\n'), /surprise: unknown field/],
    ];
    for (const [yaml, message] of cases) {
      const res = await put(yaml);
      assert.equal(res.status, 400, `${yaml}\n${res.text}`);
      assert.equal(res.body.error, 'bad_request');
      assert.match(res.body.message, message, yaml);
    }
    const many = await put(MINIMAL('x', 'resources: {timeout: soon, memory: lots}\nscoring: {pass_threshold: 2}\n'));
    for (const field of ['resources.timeout', 'resources.memory', 'scoring.pass_threshold'])
      assert.ok(many.body.message.includes(`${field}: `), many.body.message);
  });

  test('the body must be YAML: other media types are 415, an empty body 400', async () => {
    const json = await server.request('POST', '/v1/specs', { key, body: { version: 1 } });
    assert.equal(json.status, 415);
    assert.equal(json.body.error, 'unsupported_media_type');
    const empty = await put('   \n');
    assert.equal(empty.status, 400);
    assert.match(empty.body.message, /^body: /);
  });

  test('spec ids are per tenant: another tenant sees 404 and may use the same id', async () => {
    await put(MINIMAL('mine'));
    assert.equal((await get('/v1/specs/mine', other)).status, 404);
    assert.equal((await server.request('DELETE', '/v1/specs/mine', { key: other })).status, 404);
    assert.deepEqual((await get('/v1/specs', other)).body.items, []);
    assert.equal((await put(MINIMAL('mine'), other)).body.version, 1);
    assert.equal((await get('/v1/specs/mine')).body.version, 1);
  });

  test('the JSON Schema is published without a key, and it is the one the server validates with', async () => {
    const res = await fetch(`${server.url}/schemas/spec/v1.json`);
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type')!, /application\/schema\+json/);
    const schema = await res.json();
    assert.deepEqual(schema, JSON.parse(await readFile(path.join(REPO, 'schemas', 'spec.schema.json'), 'utf8')));
    // What an editor does with it: a plain validator, without the server's custom formats.
    const validate = new Ajv({ allErrors: true, strict: false, validateFormats: false }).compile(schema);
    assert.ok(validate(parseYaml(full)), JSON.stringify(validate.errors));
    assert.equal(validate(parseYaml(MINIMAL('x').replace('type: file_exists, path: out.txt', 'type: foo'))), false);
  });

  test('specs survive a restart', async () => {
    const before = (await get('/v1/specs/flow?version=1')).body;
    await server.stop();
    await server.restart();
    assert.deepEqual((await get('/v1/specs/flow?version=1')).body, before);
    assert.equal((await put(MINIMAL('flow'))).body.version, 3);
  });
});
