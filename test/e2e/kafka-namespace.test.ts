/**
 * A deployment under SVC_LOG_NAMESPACE on the real broker: every schema subject is the
 * TopicNameStrategy subject of the namespaced topic (so a tool that looks a topic's schema up by
 * its name finds it), and restarts leave no consumer groups behind: the per-process groups
 * (views, replies, sandbox streams) commit nothing and are deleted at a graceful stop; after a
 * kill -9 they hold no offsets, which is what lets Kafka delete them at its next cleanup.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, describe, test } from 'node:test';
import { type Admin, Kafka, logLevel } from 'kafkajs';
import { backend } from '../helpers/backend.ts';
import { startServer, type TestServer } from '../helpers/server.ts';

const NAME = 'a namespaced deployment on Kafka';
const brokers = backend('SVC_TEST_KAFKA_BROKERS', NAME);

/** The per-process groups of the service: views, reply followers, sandbox streams, a runner's requests. */
const PER_PROCESS = /^(view|replies|streams|sandbox-runner)\./;

if (brokers) {
  describe(NAME, () => {
    const ns = `ns-${randomBytes(4).toString('hex')}.`;
    let server: TestServer;
    let admin: Admin;
    /** This namespace's consumer groups, without the prefix, sorted. */
    const groups = async () =>
      (await admin.listGroups()).groups
        .map((g) => g.groupId)
        .filter((g) => g.startsWith(ns))
        .map((g) => g.slice(ns.length))
        .sort();

    before(async () => {
      admin = new Kafka({ brokers: brokers.split(','), logLevel: logLevel.NOTHING }).admin();
      await admin.connect();
      server = await startServer({ SVC_LOG_BACKEND: 'kafka', SVC_KAFKA_BROKERS: brokers, SVC_LOG_NAMESPACE: ns });
    });
    after(async () => {
      await server?.cleanup();
      await admin?.disconnect();
    });

    test('each topic with a schema has its subject under the namespaced topic name, and no other subject exists', async () => {
      const topics = (await admin.listTopics()).filter((t) => t.startsWith(ns) && !t.endsWith('_schemas'));
      assert.ok(topics.includes(`${ns}svc.traces`), topics.join(' '));
      const subjects = (await server.request('GET', '/schema-registry/subjects')).body as string[];
      assert.ok(subjects.length > 0);
      for (const subject of subjects) assert.ok(topics.includes(subject.replace(/-value$/, '')), `${subject} names a topic of the namespace`);
      const traces = await server.request('GET', `/schema-registry/subjects/${encodeURIComponent(`${ns}svc.traces-value`)}/versions/latest`);
      assert.equal(traces.status, 200, traces.text);
      assert.equal(JSON.parse(traces.body.schema).name, 'TraceEventsIngested');
      assert.equal((await server.request('GET', '/schema-registry/subjects/svc.traces-value/versions')).status, 404);
    });

    test('graceful restarts leave no consumer groups behind', async () => {
      const running = await groups();
      assert.ok(
        running.some((g) => PER_PROCESS.test(g)),
        `per-process groups while it runs: ${running}`,
      );
      const stable = running.filter((g) => !PER_PROCESS.test(g));
      for (let restart = 1; restart <= 3; restart++) {
        assert.equal(await server.stop(), 0);
        assert.deepEqual(await groups(), stable, `after stop ${restart}: only the actors' own groups are left`);
        await server.restart();
      }
    });

    test('after kill -9 the per-process groups hold no offsets, so Kafka deletes them once empty', async () => {
      const mine = (await groups()).filter((g) => PER_PROCESS.test(g));
      assert.ok(mine.length > 0);
      await server.kill9();
      for (const group of mine) {
        const offsets = await admin.fetchOffsets({ groupId: `${ns}${group}` });
        const committed = offsets.flatMap((t) => t.partitions).filter((p) => Number(p.offset) >= 0);
        assert.deepEqual(committed, [], `${group} committed nothing`);
      }
      await server.restart();
    });
  });
}
