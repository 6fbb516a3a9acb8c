/**
 * The event serde (Confluent wire format over the built-in registry on the embedded log) and the
 * topic catalog loader.
 */
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, it } from 'node:test';
import { EmbeddedLog } from '../../services/kernel/log/embedded/embedded-log.ts';
import { BuiltInRegistry } from '../../services/kernel/schema/registry.ts';
import { EventSerde, SerdeError, valueSubject } from '../../services/kernel/schema/serde.ts';
import { checkTopicConstants, loadCatalog, parseRetention, TOPICS } from '../../services/kernel/topics.ts';

export function traceValue(n: number): Record<string, unknown> {
  return {
    tenant: 'tenant-a',
    event_id: `batch-${n}`,
    ts: 1_700_000_000_000 + n,
    sandbox_id: 'sb-0123abcd',
    experiment_id: null,
    agent: 'coder',
    agent_snapshot_id: 'snap_abc',
    agent_version: 3,
    scenario_id: null,
    run_id: null,
    events: [
      {
        event_id: `ev-${n}`,
        ts_us: 1_700_000_000_000_000 + n,
        event_type: 'tool_call',
        tool: 'bash',
        phase: 'end',
        trace_id: '4bf92f3577b34da6a3ce929d0e0e4736',
        span_id: '00f067aa0ba902b7',
        parent_span_id: null,
        duration_ms: 42,
        status: 'ok',
        input: '{"cmd":"ls -la"}',
        output: 'total 0',
        cost: { input_tokens: 120, output_tokens: 30, cache_read_tokens: 0, reasoning_tokens: 0, model: 'gpt-x', estimated_usd: 0.0012 },
        metadata: { attempt: '1' },
      },
    ],
  };
}

/** Decoded records are instances of avsc's record classes; compare their data. */
function plain(v: unknown): unknown {
  return JSON.parse(JSON.stringify(v));
}

describe('EventSerde', () => {
  let dir: string;
  let log: EmbeddedLog;
  let registry: BuiltInRegistry;
  let serde: EventSerde;
  const catalog = loadCatalog();

  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'serde-'));
    log = new EmbeddedLog({ dir, fsync: 'never' });
    await log.start(catalog);
    registry = new BuiltInRegistry(log);
    await registry.start();
    serde = new EventSerde(registry, catalog);
    await serde.init();
  });

  after(async () => {
    await log.close();
    await rm(dir, { recursive: true, force: true });
  });

  it('registers every topic value schema under <topic>-value', () => {
    const withSchemas = catalog
      .filter((t) => t.valueSchema !== null)
      .map((t) => valueSubject(t.name))
      .sort();
    assert.deepEqual(registry.subjects(), withSchemas);
    assert.equal(registry.version(valueSubject(TOPICS.traces), 'latest').id, serde.schemaId(TOPICS.traces));
  });

  it('under a log namespace, registers under the namespaced topic names, with the same ids', async () => {
    const namespaced = new EventSerde(registry, catalog, undefined, 'staging.');
    await namespaced.init();
    assert.equal(namespaced.subject(TOPICS.traces), 'staging.svc.traces-value');
    assert.equal(registry.version('staging.svc.traces-value', 'latest').id, serde.schemaId(TOPICS.traces), 'one schema, one id');
    const staged = catalog.filter((t) => t.valueSchema !== null).map((t) => `staging.${t.name}-value`);
    assert.deepEqual(
      registry.subjects().filter((s) => s.startsWith('staging.')),
      staged.sort(),
    );
  });

  it('round-trips a value', async () => {
    const value = traceValue(1);
    const buf = serde.encode(TOPICS.traces, value);
    assert.deepEqual(plain(await serde.decode(TOPICS.traces, buf)), value);
    assert.deepEqual(plain(serde.decodeSync(TOPICS.traces, buf)), value);
    assert.deepEqual(plain(await serde.decodeMany(TOPICS.traces, [buf, serde.encode(TOPICS.traces, traceValue(2))])), [value, traceValue(2)]);
    // Every topic's schema, with values avsc generates from it.
    for (const spec of catalog.filter((t) => t.valueSchema !== null)) {
      const random = serde.type(spec.name).random();
      assert.ok(serde.type(spec.name).equals(serde.type(spec.name)));
      assert.deepEqual(await serde.decode(spec.name, serde.encode(spec.name, random)), random, spec.name);
    }
  });

  it('fills defaults of omitted optional fields', async () => {
    const value = { tenant: 't', event_id: 'e', ts: 1, events: [] };
    const decoded = await serde.decode<Record<string, unknown>>(TOPICS.traces, serde.encode(TOPICS.traces, value));
    assert.deepEqual(plain(decoded), {
      ...value,
      sandbox_id: null,
      experiment_id: null,
      agent: null,
      agent_snapshot_id: null,
      agent_version: null,
      scenario_id: null,
      run_id: null,
    });
  });

  it('writes the Confluent wire format: magic byte 0, then the schema id big-endian', () => {
    const buf = serde.encode(TOPICS.tenants, { tenant: 't1', event_id: 'e1', ts: 5, plan: 'pro', max_concurrent_sandboxes: null, created_at: 1 });
    const id = serde.schemaId(TOPICS.tenants);
    assert.equal(buf[0], 0);
    assert.deepEqual([...buf.subarray(1, 5)], [(id >>> 24) & 0xff, (id >>> 16) & 0xff, (id >>> 8) & 0xff, id & 0xff]);
    assert.equal(buf.readUInt32BE(1), id);
    // The rest is plain Avro binary of the topic's schema.
    assert.deepEqual(plain(serde.type(TOPICS.tenants).fromBuffer(buf.subarray(5))), {
      tenant: 't1',
      event_id: 'e1',
      ts: 5,
      plan: 'pro',
      max_concurrent_sandboxes: null,
      created_at: 1,
    });
  });

  it('names the first invalid field of a value', () => {
    const value = traceValue(3);
    (value.events as Array<Record<string, unknown>>)[0]!.duration_ms = 'slow';
    assert.throws(
      () => serde.encode(TOPICS.traces, value),
      (err: unknown) => {
        assert.ok(err instanceof SerdeError);
        assert.equal(err.path, 'events[0].duration_ms');
        assert.match(err.message, /svc\.traces: invalid value at events\[0\]\.duration_ms: expected long, got "slow"/);
        return true;
      },
    );
    const missing = traceValue(4);
    delete missing.tenant;
    assert.throws(() => serde.encode(TOPICS.traces, missing), /invalid value at tenant: expected string, got nothing \(field missing\)/);
  });

  it('encodes values larger than its scratch buffer', async () => {
    const value = traceValue(5);
    (value.events as Array<Record<string, unknown>>)[0]!.output = 'x'.repeat(200_000);
    assert.deepEqual(plain(await serde.decode(TOPICS.traces, serde.encode(TOPICS.traces, value))), value);
  });

  it('refuses bytes that are not the wire format, unknown ids and truncated values clearly', async () => {
    const good = serde.encode(TOPICS.traces, traceValue(6));
    const badMagic = Buffer.from(good);
    badMagic[0] = 1;
    await assert.rejects(serde.decode(TOPICS.traces, badMagic), /unknown magic byte 1/);
    await assert.rejects(serde.decode(TOPICS.traces, Buffer.from([0, 0])), /not a Confluent wire-format value/);
    const unknownId = Buffer.from(good);
    unknownId.writeUInt32BE(999_999, 1);
    await assert.rejects(serde.decode(TOPICS.traces, unknownId), /writer schema 999999 is not available from the schema registry/);
    assert.throws(() => serde.decodeSync(TOPICS.traces, unknownId), /writer schema 999999 is not loaded yet/);
    await assert.rejects(serde.decode(TOPICS.traces, good.subarray(0, good.length - 3)), /truncated/);
  });

  it('refuses topics without a schema or outside the catalog', () => {
    assert.throws(() => serde.encode(TOPICS.schemas, {}), /has no value schema/);
    assert.throws(() => serde.encode('nope', {}), /not in the topic catalog/);
  });
});

describe('topic catalog', () => {
  let dir: string;
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'catalog-'));
  });
  after(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  const entry = { name: 'a.b', partitions: 2, key: 'k', value_schema: 'x', cleanup_policy: 'delete', retention: '7d' };
  async function load(entries: unknown[]) {
    await writeFile(join(dir, 'catalog.yaml'), JSON.stringify({ topics: entries }));
    return loadCatalog(dir, { requireCodeTopics: false });
  }

  it('loads the project catalog with every topic the code names', () => {
    const catalog = loadCatalog();
    checkTopicConstants(catalog);
    const traces = catalog.find((t) => t.name === TOPICS.traces)!;
    assert.deepEqual(traces, {
      name: 'svc.traces',
      partitions: 6,
      key: traces.key,
      valueSchema: 'trace-events-ingested',
      cleanupPolicy: 'delete',
      retentionMs: 7 * 86_400_000,
      table: 'trace_events',
    });
    assert.equal(catalog.find((t) => t.name === TOPICS.schemas)!.retentionMs, null);
    assert.equal(catalog.find((t) => t.name === TOPICS.schemas)!.valueSchema, null);
  });

  it('converts retention to milliseconds', () => {
    assert.equal(parseRetention('45s'), 45_000);
    assert.equal(parseRetention('30m'), 1_800_000);
    assert.equal(parseRetention('24h'), 86_400_000);
    assert.equal(parseRetention('7d'), 604_800_000);
    assert.equal(parseRetention('forever'), null);
    assert.throws(() => parseRetention('7 days'), /not a duration/);
  });

  it('names the entry and field of an invalid catalog', async () => {
    assert.deepEqual((await load([entry]))[0], {
      name: 'a.b',
      partitions: 2,
      key: 'k',
      valueSchema: 'x',
      cleanupPolicy: 'delete',
      retentionMs: 604_800_000,
      table: null,
    });
    assert.equal((await load([{ ...entry, table: 'facts' }]))[0].table, 'facts');
    assert.equal((await load([{ ...entry, table: 'facts', flush_interval: '250ms' }]))[0].flushIntervalMs, 250);
    await assert.rejects(
      async () => load([{ ...entry, table: 'facts', flush_interval: 'forever' }]),
      /\(a\.b\)\.flush_interval: must be a duration such as 250ms/,
    );
    await assert.rejects(async () => load([{ ...entry, flush_interval: '1s' }]), /\(a\.b\)\.flush_interval: only a topic with a table has one/);
    await assert.rejects(async () => load([{ ...entry, table: 'Drop Table' }]), /\(a\.b\)\.table: must be a ClickHouse table name/);
    await assert.rejects(async () => load([{ ...entry, partitions: 0 }]), /topics\[0\] \(a\.b\)\.partitions: must be a whole number >= 1/);
    await assert.rejects(async () => load([entry, { ...entry, name: 'c', retention: 'soon' }]), /topics\[1\] \(c\)\.retention: "soon" is not a duration/);
    await assert.rejects(async () => load([{ ...entry, cleanup_policy: 'keep' }]), /\(a\.b\)\.cleanup_policy: must be "delete" or "compact"/);
    await assert.rejects(async () => load([{ ...entry, value_schema: 3 }]), /\(a\.b\)\.value_schema/);
    await assert.rejects(async () => load([{ ...entry, name: 'bad name' }]), /topics\[0\] \(bad name\)\.name/);
    await assert.rejects(async () => load([entry, entry]), /listed twice/);
    await assert.rejects(async () => load([{ ...entry, key: undefined }]), /\(a\.b\)\.key/);
    await writeFile(join(dir, 'catalog.yaml'), 'topics: [');
    assert.throws(() => loadCatalog(dir), /not valid YAML/);
  });

  it('fails when a topic the code uses is missing', async () => {
    await writeFile(join(dir, 'catalog.yaml'), JSON.stringify({ topics: [entry] }));
    assert.throws(() => loadCatalog(dir), /lacks topics the code uses: svc\.traces \(TOPICS\.traces\)/);
  });
});
