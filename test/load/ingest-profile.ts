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
 */
import { readdirSync, readFileSync } from 'node:fs';
import { createTenantKey, startServer } from '../helpers/server.ts';
import { otlpBodies, traceBodies } from './bodies.ts';

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

const paths = { traces: ['/v1/traces', 'application/json'], otlp: ['/otel/v1/traces', 'application/x-protobuf'] } as const;
const [endpoint, contentType] = paths[kind];
const server = await startServer({ SVC_RATE_LIMIT_INGEST_EVENTS: '0', SVC_RATE_LIMIT_READS: '0', SVC_RATE_LIMIT_WRITES: '0', SVC_LOG_FSYNC: 'always' });
try {
  const { key } = await createTenantKey(server, 'bench');
  const requests = Math.ceil(events / 1000);
  const warmup = 40;
  const bodies: Array<string | Uint8Array> = kind === 'traces' ? traceBodies(8) : otlpBodies(warmup + requests);
  const post = async (i: number) => {
    const res = await fetch(`${server.url}${endpoint}`, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': contentType }, body: bodies[i % bodies.length] as BodyInit });
    if (res.status !== 200) throw new Error(`POST ${endpoint}: ${res.status} ${await res.text()}`);
    await res.arrayBuffer();
  };
  for (let i = 0; i < warmup; i += CLIENTS) await Promise.all(Array.from({ length: CLIENTS }, (_, j) => post(i + j)));
  const pid = server.pid();
  const before = threadTimes(pid);
  const clientBefore = process.cpuUsage();
  const started = performance.now();
  let next = warmup;
  await Promise.all(Array.from({ length: CLIENTS }, async () => {
    while (next < warmup + requests) await post(next++);
  }));
  const seconds = (performance.now() - started) / 1000;
  const after = threadTimes(pid);
  const client = process.cpuUsage(clientBefore);
  const n = requests * 1000;
  const rows = [...after].map(([name, us]) => [name, (us - (before.get(name) ?? 0)) / n] as const).filter(([, v]) => v > 0.05).sort((a, b) => b[1] - a[1]);
  const total = rows.reduce((s, [, v]) => s + v, 0);
  console.log(`${kind}: ${n} events in ${seconds.toFixed(2)} s, ${Math.round(n / seconds)} events/s`);
  console.log('| thread | µs per event |\n|---|---:|');
  for (const [name, v] of rows) console.log(`| ${name} | ${v.toFixed(2)} |`);
  console.log(`| the service, in all | ${total.toFixed(2)} |`);
  console.log(`| the bench's clients (this process) | ${((client.user + client.system) / n).toFixed(2)} |`);
} finally {
  await server.cleanup();
}
