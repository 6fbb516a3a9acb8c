/**
 * An event that keeps failing its handler goes to the dead-letter topic after a bounded number
 * of tries, its partition moves on, and operators see it. Runs the real service in-process on
 * the embedded log and chDB.
 */
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { subscribe, type Delivered } from '../../services/kernel/actor.ts';
import { loadConfig } from '../../services/kernel/config.ts';
import { TOPICS } from '../../services/kernel/topics.ts';
import { startServices, type Running } from '../../services/main.ts';
import { ADMIN_KEY, traceEvent } from '../helpers/server.ts';

let running: Running;
let dir: string;
let url: string;

before(async () => {
  dir = await mkdtemp(path.join(os.tmpdir(), 'svc-dlq-'));
  const config = loadConfig({
    SVC_DATA_DIR: dir,
    SVC_PORT: '0',
    SVC_HOST: '127.0.0.1',
    SVC_API_KEY: ADMIN_KEY,
    SVC_LOG_LEVEL: 'silent',
    SVC_LOG_FSYNC: 'never',
    SVC_HANDLER_MAX_ATTEMPTS: '3',
  });
  running = await startServices(config);
  url = `http://127.0.0.1:${running.api!.port()}`;
});
after(async () => {
  await running?.stop();
  await rm(dir, { recursive: true, force: true });
});

const admin = (p: string, init: RequestInit = {}) =>
  fetch(`${url}${p}`, { ...init, headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json', ...(init.headers ?? {}) } });

async function deadLetters(): Promise<any[]> {
  const res = await admin('/v1/admin/dead-letters');
  assert.equal(res.status, 200);
  return (await res.json()).items;
}

async function eventually<T>(fn: () => Promise<T>, ok: (v: T) => boolean, ms = 20_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (ok(v) || Date.now() > deadline) return v;
    await new Promise((r) => setTimeout(r, 50));
  }
}

test('a record whose handler keeps failing is dead-lettered after the bounded tries; the partition moves on', async () => {
  const { kernel } = running;
  const handled: string[] = [];
  let poisonTries = 0;
  const consumer = await subscribe<{ events: Array<{ tool: string }> }>(kernel, {
    groupId: 'test.poison',
    topics: [TOPICS.traces],
    fromBeginning: false,
    handle: async (events: Array<Delivered<{ events: Array<{ tool: string }> }>>) => {
      for (const e of events) {
        const tool = e.value!.events[0].tool;
        if (tool === 'poison') {
          poisonTries++;
          throw new Error('this handler cannot take poison');
        }
        handled.push(tool);
      }
    },
  });
  await eventually(
    async () => consumer.assignment().length,
    (n) => n > 0,
  );
  // One partition key for all three, so they are in one partition, in order.
  const { publish } = await import('../../services/kernel/actor.ts');
  const batch = (tool: string) => ({
    tenant: 'acme',
    event_id: tool,
    ts: Date.now(),
    events: [
      {
        event_id: tool,
        ts_us: Date.now() * 1000,
        event_type: 'tool_call',
        tool,
        phase: 'complete',
        trace_id: tool,
        span_id: tool,
        duration_ms: 1,
        status: 'ok',
        metadata: {},
      },
    ],
  });
  await publish(
    kernel,
    TOPICS.traces,
    ['before', 'poison', 'after'].map((tool) => ({ key: 'same-key', tenant: 'acme', value: batch(tool) })),
  );
  await eventually(
    async () => handled,
    (h) => h.includes('after'),
  );
  await consumer.stop();
  // At least once: a batch retry hands 'before' again (handlers are idempotent).
  assert.deepEqual([...new Set(handled)], ['before', 'after'], 'the records after the poison one were handled');
  assert.equal(poisonTries, 3 + 1, 'three tries as a batch, then one on its own');
  const letters = await eventually(deadLetters, (l) => l.some((d) => d.group_id === 'test.poison'));
  const letter = letters.find((d) => d.group_id === 'test.poison');
  assert.ok(letter, 'visible to operators');
  assert.equal(letter.topic, TOPICS.traces);
  assert.equal(letter.tenant, 'acme');
  assert.match(letter.error, /cannot take poison/);
  assert.equal(Number(letter.attempts), 4);
});

test('an undecodable record on svc.traces is dead-lettered by the sink, and ingest goes on', async () => {
  const { kernel } = running;
  await kernel.log.append(TOPICS.traces, [{ key: 'garbage', value: Buffer.from('not avro at all'), headers: { tenant: 'acme' } }]);
  const letters = await eventually(deadLetters, (l) => l.some((d) => d.group_id === 'sink.trace_events'));
  const letter = letters.find((d) => d.group_id === 'sink.trace_events');
  assert.ok(letter);
  assert.match(letter.error, /magic|wire format|schema/i);
  const post = await admin('/v1/traces', { method: 'POST', body: JSON.stringify({ events: [traceEvent({ tool: 'after-garbage' })] }) });
  assert.equal(post.status, 200);
  const get = await (await admin('/v1/traces?tool=after-garbage')).json();
  assert.equal(get.count, 1);
  const metrics = await (await admin('/metrics')).text();
  assert.match(metrics, /svc_dead_lettered_total\{group="sink\.trace_events",topic="svc\.traces"\} 1/);
});

test("a record of the schema's id whose bytes are cut short is dead-lettered by the sink (the engine refuses it), and ingest goes on", async () => {
  const { kernel } = running;
  const whole = kernel.serde.encode(TOPICS.traces, {
    tenant: 'acme',
    event_id: 'cut',
    ts: Date.now(),
    sandbox_id: null,
    experiment_id: null,
    agent: null,
    agent_snapshot_id: null,
    agent_version: null,
    scenario_id: null,
    run_id: null,
    events: [
      {
        event_id: 'cut-1',
        ts_us: Date.now() * 1000,
        event_type: 'tool_call',
        tool: 'cut-short',
        phase: 'complete',
        trace_id: 't-cut',
        span_id: 's-cut',
        parent_span_id: null,
        duration_ms: 1,
        status: 'ok',
        input: null,
        output: null,
        cost: null,
        metadata: {},
      },
    ],
  });
  const before = (await deadLetters()).filter((d) => d.group_id === 'sink.trace_events').length;
  await kernel.log.append(TOPICS.traces, [{ key: 'cut', value: whole.subarray(0, whole.length - 7), headers: { tenant: 'acme' } }]);
  await eventually(deadLetters, (l) => l.filter((d) => d.group_id === 'sink.trace_events').length > before);
  const post = await admin('/v1/traces', { method: 'POST', body: JSON.stringify({ events: [traceEvent({ tool: 'after-cut' })] }) });
  assert.equal(post.status, 200);
  assert.equal((await (await admin('/v1/traces?tool=after-cut')).json()).count, 1);
  assert.equal((await (await admin('/v1/traces?tool=cut-short')).json()).count, 0);
});
