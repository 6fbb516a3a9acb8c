/**
 * Schema evolution through the built-in registry on the embedded log, its rebuild after a
 * restart, and its HTTP API as seen by @kafkajs/confluent-schema-registry and by HttpRegistry.
 */
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { SchemaRegistry as ConfluentClient, SchemaType } from '@kafkajs/confluent-schema-registry';
import { Router } from '@koa/router';
import Koa from 'koa';
import { schemaRegistryRouter } from '../../services/api/routes/schema-registry.ts';
import type { TopicSpec } from '../../services/kernel/log/event-log.ts';
import { EmbeddedLog } from '../../services/kernel/log/embedded/embedded-log.ts';
import { BuiltInRegistry, HttpRegistry, type SchemaRegistry } from '../../services/kernel/schema/registry.ts';
import { EventSerde, valueSubject } from '../../services/kernel/schema/serde.ts';
import { loadCatalog, TOPICS } from '../../services/kernel/topics.ts';

const TOPIC = 'test.evolving';
const SUBJECT = valueSubject(TOPIC);

const v1 = {
  type: 'record',
  name: 'ThingHappened',
  namespace: 'svc.test',
  fields: [
    { name: 'tenant', type: 'string' },
    { name: 'count', type: 'long' },
  ],
};
/** v1 plus an optional field with a default: BACKWARD (and FORWARD) compatible. */
const v2 = { ...v1, fields: [...v1.fields, { name: 'note', type: ['null', 'string'], default: null }] };
/** v1 plus a required field without a default: new readers cannot read v1 data. */
const v3Incompatible = { ...v1, fields: [...v1.fields, { name: 'owner', type: 'string' }] };

const catalog: TopicSpec[] = [
  ...loadCatalog().filter((t) => t.name === TOPICS.schemas),
  { name: TOPIC, partitions: 1, key: 'tenant', valueSchema: 'thing-happened', cleanupPolicy: 'delete', retentionMs: null },
];

/** A schemas/ directory holding one version of the test schema, as one deployed process sees it. */
async function schemasDir(root: string, name: string, schema: object): Promise<string> {
  const dir = join(root, name);
  await mkdir(dir, { recursive: true });
  await writeFile(join(dir, 'thing-happened.avsc'), JSON.stringify(schema, null, 2));
  return dir;
}

function plain(v: unknown): unknown {
  return JSON.parse(JSON.stringify(v));
}

describe('schema evolution', () => {
  let root: string;
  let logDir: string;
  let log: EmbeddedLog;
  let registry: BuiltInRegistry;

  before(async () => {
    root = await mkdtemp(join(tmpdir(), 'schema-evolution-'));
    logDir = join(root, 'log');
    log = new EmbeddedLog({ dir: logDir, fsync: 'never' });
    await log.start(catalog);
    registry = new BuiltInRegistry(log);
    await registry.start();
  });

  after(async () => {
    await log.close();
    await rm(root, { recursive: true, force: true });
  });

  it('a schema evolved with a new optional field is read by old and new readers', async () => {
    const oldProcess = new EventSerde(registry, catalog, await schemasDir(root, 'v1', v1));
    await oldProcess.init();
    const newProcess = new EventSerde(registry, catalog, await schemasDir(root, 'v2', v2));
    await newProcess.init();

    assert.deepEqual(registry.versions(SUBJECT), [1, 2]);
    const id1 = oldProcess.schemaId(TOPIC);
    const id2 = newProcess.schemaId(TOPIC);
    assert.notEqual(id1, id2);
    assert.equal(registry.version(SUBJECT, 1).id, id1);
    assert.equal(registry.version(SUBJECT, 'latest').id, id2);

    // Written by v1, read by v2: the new field takes its default.
    const fromOld = oldProcess.encode(TOPIC, { tenant: 't1', count: 3 });
    assert.equal(fromOld.readUInt32BE(1), id1);
    assert.deepEqual(plain(await newProcess.decode(TOPIC, fromOld)), { tenant: 't1', count: 3, note: null });

    // Written by v2, read by v1: the new field is ignored.
    const fromNew = newProcess.encode(TOPIC, { tenant: 't2', count: 4, note: 'hello' });
    assert.equal(fromNew.readUInt32BE(1), id2);
    assert.deepEqual(plain(await oldProcess.decode(TOPIC, fromNew)), { tenant: 't2', count: 4 });

    // Mixed batches decode synchronously once the writer ids are known.
    assert.deepEqual(plain(await newProcess.decodeMany(TOPIC, [fromOld, fromNew])), [
      { tenant: 't1', count: 3, note: null },
      { tenant: 't2', count: 4, note: 'hello' },
    ]);
    assert.deepEqual(plain(oldProcess.decodeSync(TOPIC, fromNew)), { tenant: 't2', count: 4 });

    // Registering the same schema again (other whitespace, same meaning) keeps its id and version.
    assert.equal(await registry.register(SUBJECT, JSON.stringify(v1, null, 4)), id1);
    assert.deepEqual(registry.versions(SUBJECT), [1, 2]);
  });

  it('refuses an incompatible change under BACKWARD, accepts it under NONE', async () => {
    assert.equal(registry.compatibility(SUBJECT), 'BACKWARD');
    await assert.rejects(registry.register(SUBJECT, JSON.stringify(v3Incompatible)), (err: unknown) => {
      const e = err as { code: string; status: number; errorCode: number; message: string };
      assert.equal(e.code, 'conflict');
      assert.equal(e.status, 409);
      assert.equal(e.errorCode, 409);
      assert.match(e.message, /incompatible/);
      return true;
    });
    assert.deepEqual(registry.checkCompatibility(SUBJECT, JSON.stringify(v3Incompatible), 'latest').isCompatible, false);
    assert.deepEqual(registry.versions(SUBJECT), [1, 2]);

    // Another subject is checked by its own history only and shares ids of identical schemas.
    assert.equal(await registry.register('other-value', JSON.stringify(v1)), registry.version(SUBJECT, 1).id);

    await registry.setCompatibility(SUBJECT, 'NONE');
    const id3 = await registry.register(SUBJECT, JSON.stringify(v3Incompatible));
    assert.deepEqual(registry.versions(SUBJECT), [1, 2, 3]);
    assert.equal(id3, Math.max(registry.version(SUBJECT, 1).id, registry.version(SUBJECT, 2).id) + 1);
  });

  it('rebuilds subjects, versions, ids and levels from the log after a restart', async () => {
    const before = registry.subjects().map((s) => ({ s, versions: registry.versions(s).map((v) => registry.version(s, v)) }));
    await log.close();

    log = new EmbeddedLog({ dir: logDir, fsync: 'never' });
    await log.start(catalog);
    registry = new BuiltInRegistry(log);
    await registry.start();

    const rebuilt = registry.subjects().map((s) => ({ s, versions: registry.versions(s).map((v) => registry.version(s, v)) }));
    assert.deepEqual(rebuilt, before);
    assert.equal(registry.subjectCompatibility(SUBJECT), 'NONE');
    assert.equal(registry.subjectCompatibility('other-value'), undefined);
    // The same schema keeps its id; a new one continues after the highest id.
    const maxId = Math.max(...before.flatMap((b) => b.versions.map((v) => v.id)));
    assert.equal(await registry.register(SUBJECT, JSON.stringify(v2)), registry.version(SUBJECT, 2).id);
    const v4 = { ...v2, fields: [...v2.fields, { name: 'extra', type: 'int', default: 0 }] };
    assert.equal(await registry.register('fresh-value', JSON.stringify(v4)), maxId + 1);
  });
});

describe('schema registry over HTTP', () => {
  let root: string;
  let log: EmbeddedLog;
  let registry: BuiltInRegistry;
  let server: ReturnType<Koa['listen']>;
  let url: string;

  before(async () => {
    root = await mkdtemp(join(tmpdir(), 'schema-http-'));
    log = new EmbeddedLog({ dir: join(root, 'log'), fsync: 'never' });
    await log.start(catalog);
    registry = new BuiltInRegistry(log);
    await registry.start();
    const app = new Koa();
    const mount = new Router({ prefix: '/schema-registry' });
    mount.use(schemaRegistryRouter(registry).routes());
    app.use(mount.routes());
    app.use(mount.allowedMethods());
    server = app.listen(0, '127.0.0.1');
    await new Promise<void>((resolve) => server.once('listening', () => resolve()));
    url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/schema-registry`;
  });

  after(async () => {
    await new Promise<void>((resolve) => server.close(() => resolve()));
    await log.close();
    await rm(root, { recursive: true, force: true });
  });

  it('serves @kafkajs/confluent-schema-registry: register, fetch, encode and decode', async () => {
    const client = new ConfluentClient({ host: url, retry: { retries: 0 } });
    const { id } = await client.register({ type: SchemaType.AVRO, schema: JSON.stringify(v1) }, { subject: SUBJECT });
    assert.equal(registry.version(SUBJECT, 'latest').id, id);
    assert.equal(registry.subjectCompatibility(SUBJECT), 'BACKWARD'); // the client sets it on first registration
    assert.equal(await client.getLatestSchemaId(SUBJECT), id);
    assert.equal(await client.getRegistryId(SUBJECT, 1), id);
    assert.equal(await client.getRegistryIdBySchema(SUBJECT, { type: SchemaType.AVRO, schema: JSON.stringify(v1) }), id);

    // A fresh client knows nothing: getSchema goes to GET /schemas/ids/:id.
    const fresh = new ConfluentClient({ host: url, retry: { retries: 0 } });
    const type = (await fresh.getSchema(id)) as { name?: string };
    assert.equal(type.name, 'svc.test.ThingHappened');

    // Bytes of our serde are the client's wire format, both ways.
    const serde = new EventSerde(new HttpRegistry({ url }), catalog, await schemasDir(root, 'v1', v1));
    await serde.init();
    assert.equal(serde.schemaId(TOPIC), id);
    const ours = serde.encode(TOPIC, { tenant: 't', count: 7 });
    assert.deepEqual(plain(await fresh.decode(ours)), { tenant: 't', count: 7 });
    const theirs = await fresh.encode(id, { tenant: 'u', count: 8 });
    assert.deepEqual(plain(await serde.decode(TOPIC, theirs)), { tenant: 'u', count: 8 });

    // Evolution through the client, and a refused change with Confluent's error.
    const { id: id2 } = await client.register({ type: SchemaType.AVRO, schema: JSON.stringify(v2) }, { subject: SUBJECT });
    assert.equal(id2, id + 1);
    await assert.rejects(client.register({ type: SchemaType.AVRO, schema: JSON.stringify(v3Incompatible) }, { subject: SUBJECT }), /incompatible/);

    // HttpRegistry reads writer schemas it never registered.
    const reader = new EventSerde(new HttpRegistry({ url }), catalog, await schemasDir(root, 'v1', v1));
    await reader.init();
    const byV2 = await fresh.encode(id2, { tenant: 'w', count: 9, note: 'n' });
    assert.deepEqual(plain(await reader.decode(TOPIC, byV2)), { tenant: 'w', count: 9 });
  });

  it('speaks the Confluent REST API and its error bodies', async () => {
    const call = async (method: string, path: string, body?: unknown, type = 'application/vnd.schemaregistry.v1+json') => {
      const res = await fetch(`${url}${path}`, {
        method,
        headers: body === undefined ? {} : { 'content-type': type },
        body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
      });
      assert.match(res.headers.get('content-type') ?? '', /application\/vnd\.schemaregistry\.v1\+json/);
      return { status: res.status, body: (await res.json()) as Record<string, unknown> | unknown[] };
    };

    const reg = await call('POST', '/subjects/rest-value/versions', { schema: JSON.stringify(v1) }, 'application/json');
    assert.equal(reg.status, 200);
    const id = (reg.body as { id: number }).id;
    assert.deepEqual((await call('GET', '/subjects')).body, ['rest-value', SUBJECT]);
    assert.deepEqual((await call('GET', '/subjects/rest-value/versions')).body, [1]);
    assert.deepEqual((await call('GET', '/subjects/rest-value/versions/latest')).body, { subject: 'rest-value', version: 1, id, schema: JSON.stringify(v1) });
    assert.deepEqual((await call('GET', '/subjects/rest-value/versions/1/schema')).body, v1);
    assert.deepEqual((await call('GET', `/schemas/ids/${id}`)).body, { schema: JSON.stringify(v1) });
    assert.deepEqual((await call('GET', `/schemas/ids/${id}/versions`)).body, [
      { subject: 'rest-value', version: 1 },
      { subject: SUBJECT, version: 1 },
    ]);
    assert.deepEqual((await call('POST', '/subjects/rest-value', { schema: JSON.stringify(v1) })).body, {
      subject: 'rest-value',
      version: 1,
      id,
      schema: JSON.stringify(v1),
    });
    assert.deepEqual((await call('GET', '/config')).body, { compatibilityLevel: 'BACKWARD' });
    assert.deepEqual(await call('GET', '/config/rest-value'), {
      status: 404,
      body: { error_code: 40408, message: "Subject 'rest-value' does not have subject-level compatibility configured" },
    });
    assert.deepEqual((await call('GET', '/config/rest-value?defaultToGlobal=true')).body, { compatibilityLevel: 'BACKWARD' });
    assert.deepEqual((await call('PUT', '/config/rest-value', { compatibility: 'FULL' })).body, { compatibility: 'FULL' });
    assert.deepEqual((await call('GET', '/config/rest-value')).body, { compatibilityLevel: 'FULL' });
    assert.deepEqual((await call('POST', '/compatibility/subjects/rest-value/versions/latest', { schema: JSON.stringify(v2) })).body, { is_compatible: true });
    const no = await call('POST', '/compatibility/subjects/rest-value/versions/latest?verbose=true', { schema: JSON.stringify(v3Incompatible) });
    assert.equal((no.body as { is_compatible: boolean }).is_compatible, false);
    assert.ok((no.body as { messages: string[] }).messages.length > 0);

    const errorCode = async (method: string, path: string, body?: unknown) => {
      const res = await call(method, path, body);
      return [res.status, (res.body as { error_code: number }).error_code];
    };
    assert.deepEqual(await errorCode('GET', '/subjects/nope/versions'), [404, 40401]);
    assert.deepEqual(await errorCode('GET', '/subjects/rest-value/versions/9'), [404, 40402]);
    assert.deepEqual(await errorCode('GET', '/subjects/rest-value/versions/zero'), [422, 42202]);
    assert.deepEqual(await errorCode('GET', '/schemas/ids/999'), [404, 40403]);
    assert.deepEqual(await errorCode('POST', '/subjects/rest-value', { schema: JSON.stringify(v2) }), [404, 40403]);
    assert.deepEqual(await errorCode('POST', '/subjects/rest-value/versions', { schema: JSON.stringify(v3Incompatible) }), [409, 409]);
    assert.deepEqual(await errorCode('POST', '/subjects/rest-value/versions', { schema: '{"type":"record"}' }), [422, 42201]);
    assert.deepEqual(await errorCode('POST', '/subjects/rest-value/versions', { schema: 'syntax = "proto3";', schemaType: 'PROTOBUF' }), [422, 42201]);
    assert.deepEqual(await errorCode('PUT', '/config/rest-value', { compatibility: 'SOMETIMES' }), [422, 42203]);
    assert.deepEqual(await errorCode('POST', '/subjects/rest-value/versions', '{not json'), [400, 400]);
  });
});

// The registry seam both implementations satisfy.
const _seam: Array<new (...args: never[]) => SchemaRegistry> = [BuiltInRegistry, HttpRegistry];
void _seam;
