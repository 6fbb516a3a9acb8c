/**
 * The EventLog contract on the Kafka backend, against a real broker: `npm test` starts one
 * (infra/kafka) and passes it in SVC_TEST_KAFKA_BROKERS. Without a broker the suite is skipped
 * with a reason, or fails under CI=true.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, describe, test } from 'node:test';
import type { Batch, LogRecord, TopicSpec } from '../../services/kernel/log/event-log.ts';
import { Kafka, logLevel } from 'kafkajs';
import { KafkaLog } from '../../services/kernel/log/kafka/kafka-log.ts';
import { eventLogContract } from './event-log.contract.ts';
import { backend } from '../helpers/backend.ts';

const NAME = 'EventLog contract on Kafka';
const brokers = backend('SVC_TEST_KAFKA_BROKERS', NAME);

if (brokers) {
  const brokerList = brokers.split(',').map((b) => b.trim());
  const quiet = {
    info() {},
    warn() {},
    error(o: object, m?: string) {
      console.error(m, o);
    },
  };
  const newLog = () => new KafkaLog({ brokers: brokerList, clientId: 'contract-test', logger: quiet });
  const run = randomBytes(4).toString('hex');
  let n = 0;
  const unique = (what: string) => `test.${run}.${what}.${n++}`;
  const spec = (name: string, partitions = 3): TopicSpec => ({
    name,
    partitions,
    key: 'test key',
    valueSchema: null,
    cleanupPolicy: 'delete',
    retentionMs: null,
  });

  /** Resolves when `predicate` holds, polling; fails after `ms`. */
  async function until(predicate: () => boolean | Promise<boolean>, ms = 20_000, what = 'condition'): Promise<void> {
    const deadline = Date.now() + ms;
    while (!(await predicate())) {
      if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 20));
    }
  }

  eventLogContract(NAME, async () => {
    const made: KafkaLog[] = [];
    const make = (): KafkaLog => {
      const log = newLog();
      made.push(log);
      return log;
    };
    return {
      log: make(),
      // A "restart" is a new client: the broker keeps the records and the group's commits.
      reopen: async () => make(),
      cleanup: async () => {
        await Promise.all(made.map((log) => log.close()));
      },
    };
  });

  describe(`${NAME} (Kafka-specific checks)`, () => {
    let log: KafkaLog;
    before(async () => {
      log = newLog();
      await log.start([]);
    });
    after(async () => {
      await log.close();
    });

    test('start creates topics idempotently, append positions follow input order per partition', async () => {
      const topic = unique('append');
      await log.start([spec(topic)]);
      await log.start([spec(topic)]); // again: no error
      const records = Array.from({ length: 30 }, (_, i) => ({ key: `k${i % 7}`, value: Buffer.from(`v${i}`), headers: { i: String(i) } }));
      const positions = await log.append(topic, records);
      assert.equal(positions.length, 30);
      // Same key, same partition; offsets dense per partition, in input order.
      const partitionOfKey = new Map<string, number>();
      const next = new Map<number, number>();
      positions.forEach((p, i) => {
        const key = records[i]!.key;
        assert.equal(partitionOfKey.get(key) ?? p.partition, p.partition);
        partitionOfKey.set(key, p.partition);
        assert.equal(p.offset, next.get(p.partition) ?? 0);
        next.set(p.partition, p.offset + 1);
      });
      const ends = await log.endOffsets(topic);
      assert.deepEqual(
        ends,
        [0, 1, 2].map((p) => next.get(p) ?? 0),
      );
      // Replay returns what was appended.
      const p0 = positions[0]!;
      const [first] = await log.read(topic, p0.partition, p0.offset, 1);
      assert.equal(first?.value?.toString(), 'v0');
      assert.equal(first?.key, 'k0');
      assert.deepEqual(first?.headers, { i: '0' });
    });

    test('appends made at once each learn their own positions', async () => {
      const topic = unique('merged');
      const other = unique('merged-other');
      await log.start([spec(topic), spec(other, 2)]);
      // 40 appends at once to two topics, queued behind each other in the producer.
      const appends = Array.from({ length: 40 }, (_, a) => {
        const records = Array.from({ length: 1 + (a % 4) }, (_, i) => ({ key: a % 3 === 0 ? null : `k${(a + i) % 5}`, value: Buffer.from(`a${a}-r${i}`) }));
        return { topic: a % 2 ? other : topic, records };
      });
      const positions = await Promise.all(appends.map((a) => log.append(a.topic, a.records)));
      const seen = new Set<string>();
      for (const [a, append] of appends.entries()) {
        for (const [i, position] of positions[a]!.entries()) {
          const [stored] = await log.read(append.topic, position.partition, position.offset, 1);
          assert.equal(stored?.value?.toString(), `a${a}-r${i}`, `append ${a}, record ${i} at ${append.topic}/${position.partition}@${position.offset}`);
          const where = `${append.topic}/${position.partition}@${position.offset}`;
          assert.ok(!seen.has(where), `${where} given twice`);
          seen.add(where);
        }
      }
      const ends = [...(await log.endOffsets(topic)), ...(await log.endOffsets(other))];
      assert.equal(
        ends.reduce((x, y) => x + y, 0),
        seen.size,
        'nothing stored but the appended records',
      );
    });

    test('read replays a range, stops at max and at the end', async () => {
      const topic = unique('read');
      await log.start([spec(topic, 1)]);
      await log.append(
        topic,
        Array.from({ length: 2500 }, (_, i) => ({ key: null, value: Buffer.from(String(i)) })),
      );
      const some = await log.read(topic, 0, 100, 50);
      assert.deepEqual(
        some.map((r) => r.offset),
        Array.from({ length: 50 }, (_, i) => 100 + i),
      );
      const rest = await log.read(topic, 0, 2000, 10_000);
      assert.equal(rest.length, 500);
      assert.equal(rest.at(-1)?.value?.toString(), '2499');
      assert.deepEqual(await log.read(topic, 0, 2500, 10), []);
      assert.deepEqual(await log.read(topic, 0, 99_999, 10), []);
    });

    test('a group consumes everything, commits, and redelivers a rejected batch', async () => {
      const topic = unique('consume');
      await log.start([spec(topic)]);
      await log.append(
        topic,
        Array.from({ length: 100 }, (_, i) => ({ key: `k${i}`, value: Buffer.from(String(i)) })),
      );
      const seen: LogRecord[] = [];
      let failOnce = true;
      const sizes: number[] = [];
      const consumer = await log.consume({
        groupId: unique('group'),
        topics: [topic],
        maxBatchSize: 7,
        async handleBatch(batch: Batch) {
          sizes.push(batch.records.length);
          if (failOnce) {
            failOnce = false;
            throw new Error('first delivery fails');
          }
          seen.push(...batch.records);
        },
      });
      assert.equal(consumer.assignment().length, 3);
      await until(() => new Set(seen.map((r) => `${r.partition}/${r.offset}`)).size === 100, 20_000, 'all 100 records');
      assert.ok(
        sizes.every((s) => s <= 7),
        `batches of at most 7: ${sizes}`,
      );
      await until(
        async () => {
          const committed = await log.committedOffsets(consumer.groupId, topic);
          const ends = await log.endOffsets(topic);
          return committed.every((c, i) => c === ends[i]);
        },
        10_000,
        'commits at the end offsets',
      );
      await consumer.stop();
      assert.deepEqual(consumer.assignment(), []);
    });

    test('a member that does not commit keeps its positions through a rebalance; its group is gone once it stops', async () => {
      const topic = unique('nocommit');
      await log.start([spec(topic, 2)]);
      await log.append(
        topic,
        Array.from({ length: 20 }, (_, i) => ({ key: `k${i}`, value: Buffer.from(`old${i}`) })),
      );
      const groupId = unique('view');
      const got = { a: [] as string[], b: [] as string[] };
      const member = (name: 'a' | 'b') =>
        log.consume({
          groupId,
          topics: [topic],
          fromBeginning: true,
          commit: false,
          handleBatch: async (b: Batch) => void got[name].push(...b.records.map((r) => r.value!.toString())),
        });
      const a = await member('a');
      await until(() => got.a.length === 20, 20_000, 'a reads everything');
      // A second member joins: the group rebalances and a keeps one partition. Nothing is
      // committed, yet a must go on from where it was rather than from the beginning again.
      const b = await member('b');
      await until(() => a.assignment().length === 1 && b.assignment().length === 1, 20_000, 'a split assignment');
      await log.append(
        topic,
        Array.from({ length: 6 }, (_, i) => ({ key: `n${i}`, value: Buffer.from(`new${i}`) })),
      );
      await until(() => [...got.a, ...got.b].filter((v) => v.startsWith('new')).length === 6, 20_000, 'the new records');
      await new Promise((r) => setTimeout(r, 500));
      assert.equal(got.a.filter((v) => v.startsWith('old')).length, 20, `a got no old record twice: ${got.a}`);
      assert.equal(new Set(got.a).size, got.a.length, 'a got nothing twice');

      await a.stop();
      await b.stop();
      assert.deepEqual(await log.committedOffsets(groupId, topic), [-1, -1]);
      const probe = new Kafka({ brokers: brokerList, logLevel: logLevel.NOTHING }).admin();
      await probe.connect();
      try {
        const { groups } = await probe.listGroups();
        assert.ok(!groups.some((g) => g.groupId === groupId), `group ${groupId} is deleted`);
      } finally {
        await probe.disconnect();
      }
    });

    test('two members split the partitions; fromBeginning: false sees only new records', async () => {
      const topic = unique('split');
      await log.start([spec(topic, 4)]);
      await log.append(topic, [{ key: 'old', value: Buffer.from('old') }]);
      const groupId = unique('group');
      const got: string[] = [];
      const handleBatch = async (b: Batch) => {
        got.push(...b.records.map((r) => r.value!.toString()));
      };
      const a = await log.consume({ groupId, topics: [topic], fromBeginning: false, handleBatch });
      const b = await log.consume({ groupId, topics: [topic], fromBeginning: false, handleBatch });
      await until(
        () => a.assignment().length + b.assignment().length === 4 && a.assignment().length > 0 && b.assignment().length > 0,
        20_000,
        'a split assignment',
      );
      await log.append(
        topic,
        Array.from({ length: 20 }, (_, i) => ({ key: `n${i}`, value: Buffer.from(`new${i}`) })),
      );
      await until(() => got.length >= 20, 20_000, '20 new records');
      assert.ok(!got.includes('old'), 'the record appended before joining is not delivered');
      await Promise.all([a.stop(), b.stop()]);
    });
  });
}
