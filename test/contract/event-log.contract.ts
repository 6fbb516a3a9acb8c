/**
 * The EventLog contract, run against every backend (embedded: event-log.embedded.test.ts,
 * kafka: event-log.kafka.test.ts). Backend-agnostic: unique topic and group names per test (so a
 * shared broker works), no fixed sleeps, generous polling waits (group joins take seconds on
 * Kafka).
 *
 * The factory returns a harness whose `log` is NOT started yet (each test starts it with its own
 * topics). `reopen()` returns a new, not started log over the same storage; the test closes the
 * previous log before calling it (a process restart). `cleanup()` closes any log the harness
 * made that is still open (close must be idempotent) and removes the storage.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import type { Batch, Consumer, EventLog, LogRecord, RecordPosition, TopicSpec } from '../../services/kernel/log/event-log.ts';
import { partitionForKey } from '../../services/kernel/log/murmur2.ts';
import { NamespacedLog } from '../../services/kernel/log/namespaced-log.ts';
import { BuiltInRegistry } from '../../services/kernel/schema/registry.ts';
import { EventSerde } from '../../services/kernel/schema/serde.ts';
import { loadCatalog, TOPICS } from '../../services/kernel/topics.ts';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';

export interface EventLogHarness {
  log: EventLog;
  reopen: () => Promise<EventLog>;
  cleanup: () => Promise<void>;
}

export interface EventLogContractOptions {
  /**
   * Forces compaction of a 'compact' topic now (embedded). When given, the compaction test also
   * asserts that superseded values and tombstoned keys are gone; without it (Kafka, where the
   * cleaner runs on its own schedule) it only asserts that the last value per key is there.
   */
  compact?: (log: EventLog, topic: string) => Promise<void>;
  /** Longest wait for an expected condition. @default 30 000 */
  waitMs?: number;
  /** Skip the whole suite with this reason (backend not available). */
  skip?: string | false;
}

const uid = (): string => randomUUID().slice(0, 8);

function topicSpec(prefix: string, partitions: number, extra: Partial<TopicSpec> = {}): TopicSpec {
  return {
    name: `contract-${prefix}-${uid()}`,
    partitions,
    key: 'test key',
    valueSchema: null,
    cleanupPolicy: 'delete',
    retentionMs: null,
    ...extra,
  };
}

async function waitFor(what: string, cond: () => boolean | Promise<boolean>, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await cond()) return;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** Waits a little and checks that a condition still holds (no extra deliveries). */
async function settle(ms = 300): Promise<void> {
  await new Promise((r) => setTimeout(r, ms));
}

const posKey = (r: { partition: number; offset: number }): string => `${r.partition}:${r.offset}`;

function collector(): { records: LogRecord[]; batches: Batch[]; handleBatch: (b: Batch) => Promise<void> } {
  const c = {
    records: [] as LogRecord[],
    batches: [] as Batch[],
    handleBatch: async (b: Batch) => {
      c.batches.push(b);
      c.records.push(...b.records);
    },
  };
  return c;
}

export function eventLogContract(name: string, factory: () => Promise<EventLogHarness>, options: EventLogContractOptions = {}): void {
  const waitMs = options.waitMs ?? 30_000;
  const testTimeout = waitMs * 4;

  /** Runs a test body with a fresh harness, always cleaned up. */
  const withHarness = (body: (h: EventLogHarness) => Promise<void>) => async () => {
    const h = await factory();
    try {
      await body(h);
    } finally {
      await h.cleanup();
    }
  };

  describe(name, { skip: options.skip || false }, () => {
    test(
      'records of one key keep append order, on the partition murmur2 picks',
      { timeout: testTimeout },
      withHarness(async (h) => {
        const spec = topicSpec('order', 3);
        await h.log.start([spec]);
        const keys = Array.from({ length: 10 }, (_, i) => `key-${i}-${uid()}`);
        const positions: Array<{ key: string; seq: number; pos: RecordPosition }> = [];
        let seq = 0;
        for (let round = 0; round < 6; round++) {
          const batch: Array<{ key: string; value: Buffer; headers: Record<string, string> }> = [];
          for (let i = 0; i < 50; i++) {
            const key = keys[(i * 7 + round) % keys.length];
            batch.push({ key, value: Buffer.from(JSON.stringify({ key, seq: seq++ })), headers: { seq: String(seq - 1) } });
          }
          const pos = await h.log.append(spec.name, batch);
          assert.equal(pos.length, batch.length);
          for (const [i, p] of pos.entries()) positions.push({ key: batch[i].key, seq: JSON.parse(batch[i].value.toString()).seq, pos: p });
        }
        for (const { key, pos } of positions) {
          assert.equal(pos.topic, spec.name);
          assert.equal(pos.partition, partitionForKey(key, spec.partitions), `partition of ${key}`);
        }
        // Offsets increase with append order within each partition.
        const lastOffset = new Map<number, number>();
        for (const { pos } of positions) {
          assert.ok(pos.offset > (lastOffset.get(pos.partition) ?? -1), 'offsets increase within a partition');
          lastOffset.set(pos.partition, pos.offset);
        }

        const c = collector();
        const consumer = await h.log.consume({
          groupId: `g-order-${uid()}`,
          topics: [spec.name],
          fromBeginning: true,
          maxBatchSize: 17,
          handleBatch: c.handleBatch,
        });
        await waitFor('all records consumed', () => c.records.length >= positions.length, waitMs);
        await consumer.stop();
        const lastSeq = new Map<string, number>();
        for (const r of c.records) {
          const { key, seq: s } = JSON.parse(r.value!.toString()) as { key: string; seq: number };
          assert.equal(r.key, key);
          assert.equal(r.headers.seq, String(s));
          assert.ok(s > (lastSeq.get(key) ?? -1), `key ${key}: seq ${s} after ${lastSeq.get(key)}`);
          lastSeq.set(key, s);
        }
        for (const b of c.batches) {
          assert.ok(b.records.length >= 1 && b.records.length <= 17, 'maxBatchSize respected');
          for (const r of b.records) assert.equal(r.partition, b.partition);
        }
      }),
    );

    test(
      'two members of one group split the partitions and together see everything once',
      { timeout: testTimeout },
      withHarness(async (h) => {
        const spec = topicSpec('split', 4);
        await h.log.start([spec]);
        const groupId = `g-split-${uid()}`;
        const a = collector();
        const b = collector();
        const ca = await h.log.consume({ groupId, topics: [spec.name], fromBeginning: true, handleBatch: a.handleBatch });
        const cb = await h.log.consume({ groupId, topics: [spec.name], fromBeginning: true, handleBatch: b.handleBatch });
        const split = (): boolean => {
          const pa = ca.assignment().map(posKey2);
          const pb = cb.assignment().map(posKey2);
          return pa.length > 0 && pb.length > 0 && pa.length + pb.length === spec.partitions && new Set([...pa, ...pb]).size === spec.partitions;
        };
        await waitFor('both members assigned disjoint partitions', split, waitMs);
        assert.equal(ca.groupId, groupId);

        const n = 400;
        const records = Array.from({ length: n }, (_, i) => ({ key: `k-${i}`, value: Buffer.from(`v-${i}`) }));
        await h.log.append(spec.name, records.slice(0, 200));
        await h.log.append(spec.name, records.slice(200));
        await waitFor('all records seen by the group', () => a.records.length + b.records.length >= n, waitMs);
        await settle();
        const all = [...a.records, ...b.records];
        assert.equal(all.length, n, 'each record delivered exactly once');
        assert.equal(new Set(all.map(posKey)).size, n);
        assert.deepEqual(new Set(all.map((r) => r.value!.toString())), new Set(records.map((r) => r.value.toString())));
        const owned = (c: Consumer) => new Set(c.assignment().map(posKey2));
        for (const r of a.records) assert.ok(owned(ca).has(`${r.topic}:${r.partition}`), 'member a only gets its partitions');
        for (const r of b.records) assert.ok(owned(cb).has(`${r.topic}:${r.partition}`), 'member b only gets its partitions');

        // When one member leaves, the other takes over every partition.
        await cb.stop();
        await waitFor('remaining member owns every partition', () => ca.assignment().length === spec.partitions, waitMs);
        await h.log.append(spec.name, [{ key: 'after-leave', value: Buffer.from('x') }]);
        await waitFor('record after rebalance delivered', () => a.records.some((r) => r.key === 'after-leave'), waitMs);
        await ca.stop();
      }),
    );

    test(
      'independent groups each see every record',
      { timeout: testTimeout },
      withHarness(async (h) => {
        const spec = topicSpec('groups', 2);
        await h.log.start([spec]);
        const n = 200;
        await h.log.append(
          spec.name,
          Array.from({ length: n }, (_, i) => ({ key: i % 3 === 0 ? null : `k${i}`, value: Buffer.from(String(i)) })),
        );
        const g1 = collector();
        const g2 = collector();
        const c1 = await h.log.consume({ groupId: `g1-${uid()}`, topics: [spec.name], fromBeginning: true, handleBatch: g1.handleBatch });
        const c2 = await h.log.consume({ groupId: `g2-${uid()}`, topics: [spec.name], fromBeginning: true, handleBatch: g2.handleBatch });
        await waitFor('both groups saw everything', () => g1.records.length >= n && g2.records.length >= n, waitMs);
        await settle();
        for (const g of [g1, g2]) {
          assert.equal(g.records.length, n);
          assert.equal(new Set(g.records.map((r) => r.value!.toString())).size, n);
        }
        await Promise.all([c1.stop(), c2.stop()]);
      }),
    );

    test(
      'a batch whose handler fails is not committed and is delivered again (at least once)',
      { timeout: testTimeout },
      withHarness(async (h) => {
        const spec = topicSpec('redeliver', 2);
        await h.log.start([spec]);
        const groupId = `g-redeliver-${uid()}`;
        const n = 50;
        await h.log.append(
          spec.name,
          Array.from({ length: n }, (_, i) => ({ key: `k${i}`, value: Buffer.from(`v${i}`) })),
        );

        // Member A "dies" on every batch before committing.
        const seenByA: LogRecord[] = [];
        let failures = 0;
        const ca = await h.log.consume({
          groupId,
          topics: [spec.name],
          fromBeginning: true,
          handleBatch: async (b) => {
            seenByA.push(...b.records);
            failures++;
            throw new Error('simulated crash before commit');
          },
        });
        await waitFor('member A received a batch', () => failures > 0, waitMs);
        await ca.stop();
        assert.deepEqual(await h.log.committedOffsets(groupId, spec.name), [-1, -1], 'nothing committed for failed batches');

        // A new member of the same group gets those records again.
        const b = collector();
        const cb = await h.log.consume({ groupId, topics: [spec.name], fromBeginning: true, handleBatch: b.handleBatch });
        await waitFor('member B received every record', () => new Set(b.records.map(posKey)).size >= n, waitMs);
        const seenByB = new Set(b.records.map(posKey));
        for (const r of seenByA) assert.ok(seenByB.has(posKey(r)), `record ${posKey(r)} redelivered`);
        await waitFor(
          'B committed to the end',
          async () => {
            const [end, committed] = await Promise.all([h.log.endOffsets(spec.name), h.log.committedOffsets(groupId, spec.name)]);
            return end.every((e, i) => committed[i] === e);
          },
          waitMs,
        );
        await cb.stop();
      }),
    );

    test(
      'a retried batch is redelivered to the same live consumer until it succeeds',
      { timeout: testTimeout },
      withHarness(async (h) => {
        const spec = topicSpec('retry', 1);
        await h.log.start([spec]);
        const groupId = `g-retry-${uid()}`;
        await h.log.append(spec.name, [
          { key: 'a', value: Buffer.from('1') },
          { key: 'a', value: Buffer.from('2') },
        ]);
        const deliveries: string[][] = [];
        const c = await h.log.consume({
          groupId,
          topics: [spec.name],
          fromBeginning: true,
          handleBatch: async (b) => {
            deliveries.push(b.records.map((r) => r.value!.toString()));
            if (deliveries.length === 1) throw new Error('transient failure');
          },
        });
        await waitFor(
          'a successful delivery after the failure',
          () => deliveries.length >= 2 && deliveries.flat().filter((v) => v === '2').length >= 2,
          waitMs,
        );
        assert.equal(deliveries[1][0], deliveries[0][0], 'the failed batch starts again where it started');
        await waitFor('committed after success', async () => (await h.log.committedOffsets(groupId, spec.name))[0] >= 2, waitMs);
        await c.stop();
      }),
    );

    test(
      'records survive a restart; read replays from an offset; a group resumes from its commit',
      { timeout: testTimeout },
      withHarness(async (h) => {
        const spec = topicSpec('replay', 2);
        await h.log.start([spec]);
        const groupId = `g-replay-${uid()}`;
        const first = Array.from({ length: 30 }, (_, i) => ({
          key: `k${i % 5}`,
          value: i % 7 === 0 ? null : Buffer.from(`first-${i}`),
          headers: { i: String(i), 'x-tenant': 'tenant-é' },
          timestamp: 1_700_000_000_000 + i,
        }));
        const pos1 = await h.log.append(spec.name, first);

        // A consumer that dies before committing anything, then the process restarts.
        let dying = 0;
        await h.log.consume({
          groupId,
          topics: [spec.name],
          fromBeginning: true,
          handleBatch: async () => {
            dying++;
            throw new Error('dies before commit');
          },
        });
        await waitFor('dying consumer got a batch', () => dying > 0, waitMs);
        await h.log.close();

        let log = await h.reopen();
        await log.start([spec]);
        assert.deepEqual(await log.committedOffsets(groupId, spec.name), [-1, -1]);
        const ends = await log.endOffsets(spec.name);
        for (let p = 0; p < spec.partitions; p++) {
          const expected = pos1.map((pos, i) => ({ pos, rec: first[i] })).filter((x) => x.pos.partition === p);
          assert.equal(ends[p], expected.length ? expected[expected.length - 1].pos.offset + 1 : ends[p]);
          if (expected.length < 2) continue;
          const from = expected[1].pos.offset;
          const got = await log.read(spec.name, p, from, 100);
          assert.deepEqual(
            got.map((r) => r.offset),
            expected.slice(1).map((x) => x.pos.offset),
          );
          got.forEach((r, j) => {
            const want = expected[j + 1].rec;
            assert.equal(r.topic, spec.name);
            assert.equal(r.partition, p);
            assert.equal(r.key, want.key);
            assert.equal(r.value === null ? null : r.value.toString(), want.value === null ? null : want.value.toString());
            assert.deepEqual(r.headers, want.headers);
            assert.equal(r.timestamp, want.timestamp);
          });
          assert.equal((await log.read(spec.name, p, from, 1)).length, 1, 'read honours max');
          assert.equal((await log.read(spec.name, p, ends[p], 10)).length, 0, 'nothing past the end');
        }

        // After the restart the group gets every uncommitted record again, and commits.
        const c1 = collector();
        let consumer = await log.consume({ groupId, topics: [spec.name], fromBeginning: true, handleBatch: c1.handleBatch });
        await waitFor('uncommitted records redelivered after restart', () => c1.records.length >= first.length, waitMs);
        await waitFor(
          'group committed to the end',
          async () => {
            const [end, committed] = await Promise.all([log.endOffsets(spec.name), log.committedOffsets(groupId, spec.name)]);
            return end.every((e, i) => committed[i] === e);
          },
          waitMs,
        );
        await consumer.stop();
        await log.close();

        // Second restart: the group resumes after its committed offsets.
        log = await h.reopen();
        await log.start([spec]);
        const second = Array.from({ length: 10 }, (_, i) => ({ key: `k${i}`, value: Buffer.from(`second-${i}`) }));
        await log.append(spec.name, second);
        const c2 = collector();
        consumer = await log.consume({ groupId, topics: [spec.name], fromBeginning: true, handleBatch: c2.handleBatch });
        await waitFor('new records consumed', () => c2.records.length >= second.length, waitMs);
        await settle();
        assert.deepEqual(c2.records.map((r) => r.value!.toString()).sort(), second.map((r) => r.value.toString()).sort(), 'only records after the commit');
        await consumer.stop();
      }),
    );

    test(
      'a compacted topic keeps the last value for each key',
      { timeout: testTimeout },
      withHarness(async (h) => {
        const spec = topicSpec('compact', 2, { cleanupPolicy: 'compact' });
        await h.log.start([spec]);
        const keys = Array.from({ length: 12 }, (_, i) => `entity-${i}`);
        const deleted = new Set([keys[3], keys[7]]);
        const lastValue = new Map<string, string>();
        for (let version = 1; version <= 5; version++) {
          await h.log.append(
            spec.name,
            keys.map((key) => {
              lastValue.set(key, `${key}@v${version}`);
              return { key, value: Buffer.from(`${key}@v${version}`) };
            }),
          );
          if (version === 3) {
            // Tombstones in the middle, then later values for every key but the deleted ones.
            await h.log.append(
              spec.name,
              [...deleted].map((key) => ({ key, value: null })),
            );
            for (const key of deleted) keys.splice(keys.indexOf(key), 1);
            for (const key of deleted) lastValue.delete(key);
          }
        }
        // The newest record of each partition, which compaction never removes.
        const ends = await h.log.endOffsets(spec.name);
        if (options.compact) await options.compact(h.log, spec.name);
        assert.deepEqual(await h.log.endOffsets(spec.name), ends, 'compaction keeps offsets');

        const c = collector();
        const consumer = await h.log.consume({ groupId: `g-compact-${uid()}`, topics: [spec.name], fromBeginning: true, handleBatch: c.handleBatch });
        await waitFor(
          'consumer reached the end of every partition',
          () => ends.every((end, p) => end === 0 || c.records.some((r) => r.partition === p && r.offset === end - 1)),
          waitMs,
        );
        await consumer.stop();
        const seen = new Map<string, string | null>();
        for (const r of c.records) seen.set(r.key!, r.value === null ? null : r.value.toString());
        for (const [key, value] of lastValue) assert.equal(seen.get(key), value, `last value of ${key}`);
        for (const key of deleted) assert.ok(!seen.has(key) || seen.get(key) === null, `${key} stays deleted`);
        if (options.compact) {
          const perKey = new Map<string, number>();
          for (const r of c.records) perKey.set(r.key!, (perKey.get(r.key!) ?? 0) + 1);
          for (const key of lastValue.keys()) assert.equal(perKey.get(key), 1, `only the last value of ${key} is left`);
          for (const key of deleted) assert.ok(!perKey.has(key), `tombstoned ${key} removed`);
          // read agrees, and offsets are the original ones (sparse now).
          for (let p = 0; p < spec.partitions; p++) {
            const got = await h.log.read(spec.name, p, 0, 1000);
            assert.deepEqual(
              got.map((r) => r.offset),
              c.records.filter((r) => r.partition === p).map((r) => r.offset),
            );
          }
        }
      }),
    );

    test(
      'endOffsets and committedOffsets; fromBeginning false starts at the end',
      { timeout: testTimeout },
      withHarness(async (h) => {
        const spec = topicSpec('offsets', 3);
        await h.log.start([spec]);
        const groupId = `g-offsets-${uid()}`;
        assert.deepEqual(await h.log.endOffsets(spec.name), [0, 0, 0]);
        assert.deepEqual(await h.log.committedOffsets(groupId, spec.name), [-1, -1, -1]);
        const pos = await h.log.append(
          spec.name,
          Array.from({ length: 40 }, (_, i) => ({ key: `k${i}`, value: Buffer.from(`old-${i}`) })),
        );
        const expectedEnds = [0, 0, 0];
        for (const p of pos) expectedEnds[p.partition] = Math.max(expectedEnds[p.partition], p.offset + 1);
        assert.deepEqual(await h.log.endOffsets(spec.name), expectedEnds);

        const c = collector();
        const consumer = await h.log.consume({ groupId, topics: [spec.name], fromBeginning: false, handleBatch: c.handleBatch });
        await waitFor('member assigned every partition', () => consumer.assignment().length === spec.partitions, waitMs);
        assert.deepEqual(
          consumer
            .assignment()
            .map((a) => a.partition)
            .sort(),
          [0, 1, 2],
        );
        const fresh = Array.from({ length: 9 }, (_, i) => ({ key: `k${i}`, value: Buffer.from(`new-${i}`) }));
        await h.log.append(spec.name, fresh);
        await waitFor('new records consumed', () => c.records.length >= fresh.length, waitMs);
        await waitFor(
          'committed offsets reach the end offsets',
          async () => {
            const [end, committed] = await Promise.all([h.log.endOffsets(spec.name), h.log.committedOffsets(groupId, spec.name)]);
            return end.every((e, i) => committed[i] === e || (committed[i] === -1 && !c.records.some((r) => r.partition === i)));
          },
          waitMs,
        );
        await settle();
        assert.deepEqual(c.records.map((r) => r.value!.toString()).sort(), fresh.map((r) => r.value.toString()).sort(), 'only records appended after joining');
        await consumer.stop();
        assert.deepEqual(await h.log.committedOffsets(`other-${uid()}`, spec.name), [-1, -1, -1]);
      }),
    );

    test(
      'a consumer with commit: false commits nothing; after a restart it reads from its start position again',
      { timeout: testTimeout },
      withHarness(async (h) => {
        const spec = topicSpec('nocommit', 2);
        let log = h.log;
        await log.start([spec]);
        const groupId = `g-nocommit-${uid()}`;
        await log.append(
          spec.name,
          Array.from({ length: 12 }, (_, i) => ({ key: `k${i}`, value: Buffer.from(`v${i}`) })),
        );
        for (let round = 1; round <= 2; round++) {
          const c = collector();
          const consumer = await log.consume({ groupId, topics: [spec.name], fromBeginning: true, commit: false, handleBatch: c.handleBatch });
          await waitFor(`round ${round}: every record`, () => c.records.length >= 12, waitMs);
          await settle();
          assert.equal(c.records.length, 12, `round ${round}: each record once`);
          await consumer.stop();
          assert.deepEqual(await log.committedOffsets(groupId, spec.name), [-1, -1], `round ${round}: nothing committed`);
          await log.close();
          log = await h.reopen();
          await log.start([spec]);
        }
      }),
    );

    test(
      'a schema evolved with a new optional field is read by old and new readers',
      { timeout: testTimeout },
      withHarness(async (h) => {
        // The registry keeps its state on the log too: a namespace keeps this test's `_schemas`
        // apart from any other on a shared broker.
        const log = new NamespacedLog(h.log, `evolution-${uid()}.`);
        const topic = topicSpec('evolving', 1, { valueSchema: 'evolving' });
        await log.start([...loadCatalog().filter((t) => t.name === TOPICS.schemas), topic]);
        const registry = new BuiltInRegistry(log);
        await registry.start();
        const v1 = {
          type: 'record',
          name: 'Evolving',
          namespace: 'svc.test',
          fields: [
            { name: 'tenant', type: 'string' },
            { name: 'n', type: 'long' },
          ],
        };
        const v2 = { ...v1, fields: [...v1.fields, { name: 'note', type: ['null', 'string'], default: null }] };
        const root = await mkdtemp(path.join(os.tmpdir(), 'svc-evolution-'));
        const serdeFor = async (version: string, schema: object) => {
          const dir = path.join(root, version);
          await mkdir(dir);
          await writeFile(path.join(dir, 'evolving.avsc'), JSON.stringify(schema));
          const serde = new EventSerde(registry, [topic], dir);
          await serde.init();
          return serde;
        };
        try {
          const old = await serdeFor('v1', v1);
          const upgraded = await serdeFor('v2', v2);
          assert.notEqual(old.schemaId(topic.name), upgraded.schemaId(topic.name), 'two registered versions');
          await log.append(topic.name, [
            { key: 'a', value: old.encode(topic.name, { tenant: 't', n: 1 }) },
            { key: 'a', value: upgraded.encode(topic.name, { tenant: 't', n: 2, note: 'new field' }) },
          ]);
          const c = collector();
          const consumer = await log.consume({ groupId: `g-evolution-${uid()}`, topics: [topic.name], handleBatch: c.handleBatch });
          await waitFor('both records', () => c.records.length >= 2, waitMs);
          await consumer.stop();
          const values = c.records.map((r) => r.value!);
          const asNew = await Promise.all(values.map((v) => upgraded.decode(topic.name, v)));
          const asOld = await Promise.all(values.map((v) => old.decode(topic.name, v)));
          assert.deepEqual(
            JSON.parse(JSON.stringify(asNew)),
            [
              { tenant: 't', n: 1, note: null },
              { tenant: 't', n: 2, note: 'new field' },
            ],
            'the new reader fills the default',
          );
          assert.deepEqual(
            JSON.parse(JSON.stringify(asOld)),
            [
              { tenant: 't', n: 1 },
              { tenant: 't', n: 2 },
            ],
            'the old reader skips the new field',
          );
        } finally {
          await rm(root, { recursive: true, force: true });
        }
      }),
    );

    test(
      'an unknown topic is an error',
      { timeout: testTimeout },
      withHarness(async (h) => {
        const spec = topicSpec('known', 1);
        await h.log.start([spec]);
        const unknown = `contract-unknown-${uid()}`;
        await assert.rejects(async () => h.log.append(unknown, [{ key: 'k', value: Buffer.from('v') }]), /unknown topic|not.*exist|unknown/i);
        await assert.rejects(
          async () => h.log.consume({ groupId: `g-${uid()}`, topics: [unknown], handleBatch: async () => {} }),
          /unknown topic|not.*exist|unknown/i,
        );
      }),
    );
  });
}

function posKey2(a: { topic: string; partition: number }): string {
  return `${a.topic}:${a.partition}`;
}
