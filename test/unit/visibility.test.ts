/**
 * Read-your-writes when the sink runs in another process: a write waits for the sink group's
 * commits on the real embedded log (the sink commits only after its insert succeeded).
 */
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';
import { EmbeddedLog } from '../../services/kernel/log/embedded/embedded-log.ts';
import type { TopicSpec } from '../../services/kernel/log/event-log.ts';
import { sinkGroupId } from '../../services/kernel/topics.ts';
import { Visibility, Watermark } from '../../services/kernel/watermark.ts';

const topic: TopicSpec = { name: 'facts', partitions: 2, key: 'id', valueSchema: null, cleanupPolicy: 'delete', retentionMs: null, table: 'fact_rows' };

test('without a local projection, a write waits for the sink group to commit past it', async () => {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'svc-vis-'));
  const log = new EmbeddedLog({ dir, fsync: 'never' });
  try {
    await log.start([topic]);
    const visibility = new Visibility([topic], log);
    const positions = await log.append('facts', [
      { key: 'a', value: Buffer.from('1') },
      { key: 'b', value: Buffer.from('2') },
    ]);
    await assert.rejects(visibility.waitFor(positions, 150), (err: Error & { code?: string }) => err.code === 'timeout');
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const sink = await log.consume({ groupId: sinkGroupId('fact_rows'), topics: ['facts'], handleBatch: () => gate });
    const waiting = visibility.waitFor(positions, 10_000);
    let done = false;
    void waiting.then(() => (done = true));
    await new Promise((r) => setTimeout(r, 100));
    assert.equal(done, false, 'not visible before the sink commits');
    release();
    await waiting;
    await sink.stop();
  } finally {
    await log.close();
    await rm(dir, { recursive: true, force: true });
  }
});

test('a local watermark answers without polling, and a topic with no table is an error', async () => {
  const visibility = new Visibility([topic, { ...topic, name: 'plain', table: null }], {
    committedOffsets: async () => [-1, -1],
    endOffsets: async () => [0, 0],
  });
  const watermark = new Watermark('test');
  visibility.register('facts', watermark);
  const waiting = visibility.waitFor([{ topic: 'facts', partition: 1, offset: 4 }], 1000);
  watermark.advance('facts', 1, 4);
  await waiting;
  await assert.rejects(visibility.waitFor([{ topic: 'plain', partition: 0, offset: 0 }], 100), /no table/);
});
