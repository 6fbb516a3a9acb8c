/**
 * Where the CPU of trace ingest goes, per thread of the service, in µs per ingested event:
 *
 *   node --import tsx test/load/ingest-profile.ts [traces|otlp] [events]
 *
 * Starts the service as the bench does (embedded log, chDB, fsync always), posts `events`
 * (default 300,000) in 1,000-event bodies from 16 clients, each answered once its events are
 * queryable, and reads every thread's user + system time from /proc/<pid>/task/<tid>/stat before
 * and after. Threads are grouped by name (the event loop is the one whose tid is the pid). The
 * bench's own clients (this process) are reported too: on a 2-core machine they share the cores.
 * SVC_PROFILE_THREADS=1 lists threads one by one instead of by name.
 */
import { execFileSync, spawn } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { mkdtemp } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
// @ts-expect-error plain JS module without types
import { startKafka } from '../../infra/kafka/kafka.mjs';
import { createTenantKey, startServer } from '../helpers/server.ts';
import { otlpBodies, traceBodies } from './bodies.ts';
import { httpClient } from './http-client.ts';

const kind = (process.argv[2] ?? 'traces') as 'traces' | 'otlp';
const events = Number(process.argv[3] ?? 300_000);
const CLIENTS = 16;
const TICK_US = 1_000_000 / 100; // USER_HZ

function threadTimes(pid: number): Map<string, number> {
  const out = new Map<string, number>();
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    let stat: string;
    try {
      stat = readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8');
    } catch {
      continue; // the thread ended meanwhile
    }
    const name = tid === String(pid) ? 'event loop' : stat.slice(stat.indexOf('(') + 1, stat.lastIndexOf(')'));
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    const us = (Number(fields[11]) + Number(fields[12])) * TICK_US;
    // Pools of numbered threads (chDB's) are one group: strip trailing digits.
    const group = process.env.SVC_PROFILE_THREADS ? `${name} ${tid}` : name.replace(/[\d_-]+$/, '');
    out.set(group, (out.get(group) ?? 0) + us);
  }
  return out;
}

/** A whole process's user + system time, µs. */
function processTime(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[11]) + Number(fields[12])) * TICK_US;
}

const paths = { traces: ['/v1/traces', 'application/json'], otlp: ['/otel/v1/traces', 'application/x-protobuf'] } as const;
const [endpoint, contentType] = paths[kind];
// SVC_PROFILE_NODE_OPTIONS: node options of the service alone (e.g. `--perf-basic-prof` for perf's JS frames).
const nodeOptions: Record<string, string> = process.env.SVC_PROFILE_NODE_OPTIONS ? { NODE_OPTIONS: process.env.SVC_PROFILE_NODE_OPTIONS } : {};
// SVC_PROFILE_KAFKA=1: the service on a Kafka broker (infra/kafka) instead of the embedded log; the broker's CPU is reported too.
const kafka = process.env.SVC_PROFILE_KAFKA ? await startKafka({ workDir: await mkdtemp(path.join(os.tmpdir(), 'svc-profile-kafka-')) }) : null;
const backend: Record<string, string> = kafka ? { SVC_LOG_BACKEND: 'kafka', SVC_KAFKA_BROKERS: kafka.brokers } : {};
const server = await startServer({
  SVC_RATE_LIMIT_INGEST_EVENTS: '0',
  SVC_RATE_LIMIT_READS: '0',
  SVC_RATE_LIMIT_WRITES: '0',
  SVC_LOG_FSYNC: 'always',
  ...backend,
  ...nodeOptions,
});
const brokerPid = kafka
  ? Number(
      execFileSync('pgrep', ['-f', `kafka.Kafka.*${path.basename(kafka.workDir)}`])
        .toString()
        .trim()
        .split('\n')[0],
    )
  : null;
try {
  const { key } = await createTenantKey(server, 'bench');
  const requests = Math.ceil(events / 1000);
  const warmup = 208; // as the bench: the JITs warm, the first inserts and merges done
  const bodies: Uint8Array[] = kind === 'traces' ? traceBodies(8).map((b) => new TextEncoder().encode(b)) : otlpBodies(warmup + requests);
  const client = httpClient(server.url, CLIENTS);
  const post = async (i: number) => {
    const res = await client.post(endpoint, { authorization: `Bearer ${key}`, 'content-type': contentType }, bodies[i % bodies.length]!);
    if (res.status !== 200) throw new Error(`POST ${endpoint}: ${res.status} ${res.text}`);
  };
  for (let i = 0; i < warmup; i += CLIENTS) await Promise.all(Array.from({ length: CLIENTS }, (_, j) => post(i + j)));
  const pid = server.pid();
  // SVC_PROFILE_PERF=FILE: `perf record` of the service during the measured run, into FILE.
  const perf = process.env.SVC_PROFILE_PERF
    ? spawn('perf', ['record', '-F', '999', '-g', '-o', process.env.SVC_PROFILE_PERF, '-p', String(pid)], { stdio: 'ignore' })
    : null;
  const before = threadTimes(pid);
  const brokerBefore = brokerPid ? processTime(brokerPid) : 0;
  const clientBefore = process.cpuUsage();
  const started = performance.now();
  let next = warmup;
  await Promise.all(
    Array.from({ length: CLIENTS }, async () => {
      while (next < warmup + requests) await post(next++);
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  client.close();
  if (perf) {
    perf.kill('SIGINT');
    await new Promise((resolve) => perf.on('exit', resolve));
  }
  const after = threadTimes(pid);
  const clientCpu = process.cpuUsage(clientBefore);
  const n = requests * 1000;
  const rows = [...after]
    .map(([name, us]) => [name, (us - (before.get(name) ?? 0)) / n] as const)
    .filter(([, v]) => v > 0.05)
    .sort((a, b) => b[1] - a[1]);
  const total = rows.reduce((s, [, v]) => s + v, 0);
  console.log(`${kind}: ${n} events in ${seconds.toFixed(2)} s, ${Math.round(n / seconds)} events/s`);
  console.log('| thread | µs per event |\n|---|---:|');
  for (const [name, v] of rows) console.log(`| ${name} | ${v.toFixed(2)} |`);
  console.log(`| the service, in all | ${total.toFixed(2)} |`);
  console.log(`| the bench's clients (this process) | ${((clientCpu.user + clientCpu.system) / n).toFixed(2)} |`);
  if (brokerPid) console.log(`| the Kafka broker | ${((processTime(brokerPid) - brokerBefore) / n).toFixed(2)} |`);
  // The sink's inserts over the whole run (warm-up included): how large, how long.
  const metrics = (await server.request('GET', '/metrics')).text;
  const read = (name: string, label = 'table="trace_events"') => Number(new RegExp(`^${name}\\{${label}\\} (\\S+)`, 'm').exec(metrics)?.[1] ?? NaN);
  const inserts = read('svc_sink_batch_items_count');
  console.log(
    `sink: ${inserts} inserts of trace_events, ${(read('svc_sink_batch_items_sum') / inserts).toFixed(1)} log records (1,000 events each) and ${((read('svc_sink_insert_duration_seconds_sum') / inserts) * 1000).toFixed(1)} ms each on average`,
  );
  // Where a request's time went (svc_ingest_stage_duration_seconds, warm-up included).
  const stages = ['decode', 'append', 'visible'].map(
    (stage) =>
      `${stage} ${((read('svc_ingest_stage_duration_seconds_sum', `stage="${stage}"`) / read('svc_ingest_stage_duration_seconds_count', `stage="${stage}"`)) * 1000).toFixed(1)} ms`,
  );
  console.log(`a request's stages, mean: ${stages.join(', ')}`);
} finally {
  await server.cleanup();
  await kafka?.stop();
}
