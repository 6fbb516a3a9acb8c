/**
 * Replays never duplicate rows: a sink that reads svc.traces again from the beginning (a reset
 * consumer group, a lost commit after a crash) skips every record already in ClickHouse,
 * because each row carries the log position it came from.
 */
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { loadConfig } from '../../services/kernel/config.ts';
import { TOPICS } from '../../services/kernel/topics.ts';
import { startServices, type Running } from '../../services/main.ts';
import { SinkService } from '../../services/sink/service.ts';
import { Watermark } from '../../services/kernel/watermark.ts';
import { ADMIN_KEY, traceEvent } from '../helpers/server.ts';

let running: Running;
let dir: string;
let url: string;

before(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'svc-replay-'));
  running = await startServices(
    loadConfig({ SVC_DATA_DIR: dir, SVC_PORT: '0', SVC_HOST: '127.0.0.1', SVC_API_KEY: ADMIN_KEY, SVC_LOG_LEVEL: 'silent', SVC_LOG_FSYNC: 'never' }),
  );
  url = `http://127.0.0.1:${running.api!.port()}`;
});
after(async () => {
  await running?.stop();
  await rm(dir, { recursive: true, force: true });
});

const count = async () => Number((await running.kernel.store.query<{ n: string }>('SELECT count() AS n FROM trace_events'))[0].n);

test('a sink replaying svc.traces from the beginning adds no rows', async () => {
  for (let i = 0; i < 3; i++) {
    const events = Array.from({ length: 100 }, (_, j) => traceEvent({ tool: 'replayed', span_id: `r${i}-${j}` }));
    const res = await fetch(`${url}/v1/traces`, {
      method: 'POST',
      headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json' },
      body: JSON.stringify({ events }),
    });
    assert.equal(res.status, 200);
  }
  assert.equal(await count(), 300);

  // The sink's own path (on chDB, the log's Avro records straight to the engine) under a fresh
  // consumer group, which reads svc.traces from the beginning.
  const { kernel } = running;
  const ends = await kernel.log.endOffsets(TOPICS.traces);
  const watermark = new Watermark('the replaying sink');
  const replaying = new SinkService();
  await replaying.sink(kernel, TOPICS.traces, { groupId: 'test.replaying-sink', watermark });
  const deadline = Date.now() + 20_000;
  while (!ends.every((end, p) => end === 0 || watermark.offset(TOPICS.traces, p) >= end - 1) && Date.now() < deadline)
    await new Promise((r) => setTimeout(r, 20));
  await replaying.stop();
  assert.ok(
    ends.every((end, p) => end === 0 || watermark.offset(TOPICS.traces, p) >= end - 1),
    'the replay read every record',
  );
  assert.equal(await count(), 300, 'the replay skipped every stored record');
});
