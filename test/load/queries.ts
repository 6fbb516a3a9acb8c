/**
 * The `queries` section of `npm run bench`: read latency through the real HTTP API over a store
 * holding `events` trace events (SVC_BENCH_QUERY_EVENTS, default 10,000,000).
 *
 * Loading millions of events through the API would take minutes, so the store is filled directly:
 * chdb-direct.ts `fill` runs the migrations on a fresh data dir and generates the events in
 * ClickHouse (INSERT ... SELECT FROM numbers(n), shaped like real ingest; see FILL there); then the
 * service starts on that data dir and every request is timed end to end. Measured twice: on the
 * parts as the fill left them (background merges may still run), and after OPTIMIZE ... FINAL
 * (one part per daily partition), with the service stopped in between.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { startServer, type TestServer } from '../helpers/server.ts';

interface Filled {
  fill_seconds: number;
  parts: { parts: number; partitions: number; bytes: number };
  traces: string[];
  experiments: string[];
  sandboxes: string[];
  agents: string[];
}

type Kind = { name: string; paths: () => string[]; pages: number };

export const pct = (values: number[], q: number) => [...values].sort((a, b) => a - b)[Math.min(values.length - 1, Math.floor(values.length * q))];

/** Deterministic picks, so both measurements ask the same things. */
function picker(seed: number) {
  let s = seed;
  return <T>(list: T[]): T => {
    s = (s * 1103515245 + 12345) % 2 ** 31;
    return list[s % list.length];
  };
}

function kinds(f: Filled): Kind[] {
  const many = (n: number, make: (pick: ReturnType<typeof picker>) => string) => () => {
    const pick = picker(7);
    return Array.from({ length: n }, () => make(pick));
  };
  return [
    { name: 'GET /v1/traces?limit=100 (unfiltered), 5 pages', paths: many(6, () => '/v1/traces?limit=100'), pages: 5 },
    { name: 'GET /v1/traces?experiment_id=X&limit=100, 5 pages', paths: many(20, (p) => `/v1/traces?experiment_id=${p(f.experiments)}&limit=100`), pages: 5 },
    {
      name: 'GET /v1/traces?sandbox_id=X&limit=100, to the end (3 pages)',
      paths: many(20, (p) => `/v1/traces?sandbox_id=${p(f.sandboxes)}&limit=100`),
      pages: 5,
    },
    { name: 'GET /v1/traces?event_type=llm_call&limit=100, 5 pages', paths: many(4, () => '/v1/traces?event_type=llm_call&limit=100'), pages: 5 },
    {
      name: 'GET /v1/traces?tool=X&limit=100, 5 pages',
      paths: many(6, (p) => `/v1/traces?tool=${p(['bash', 'grep', 'pytest', 'sql_query'])}&limit=100`),
      pages: 5,
    },
    { name: 'GET /v1/traces?agent=X&limit=100, 5 pages', paths: many(6, (p) => `/v1/traces?agent=${p(f.agents)}&limit=100`), pages: 5 },
    {
      name: 'GET /v1/traces?experiment_id=X&event_type=tool_call&tool=bash&limit=100, to the end',
      paths: many(20, (p) => `/v1/traces?experiment_id=${p(f.experiments)}&event_type=tool_call&tool=bash&limit=100`),
      pages: 5,
    },
    { name: 'GET /v1/traces/:id (one trace of 30 spans)', paths: many(60, (p) => `/v1/traces/${p(f.traces)}`), pages: 1 },
  ];
}

/** Times every request of every kind (following next_cursor up to `pages` pages); per kind its times in ms. */
async function measure(server: TestServer, list: Kind[]): Promise<Map<string, number[]>> {
  const times = new Map<string, number[]>();
  // Warm up: the first requests load marks and indexes into the caches.
  for (const kind of list) for (const p of kind.paths().slice(0, 1)) await server.request('GET', p);
  for (const kind of list) {
    const ms: number[] = [];
    for (const first of kind.paths()) {
      let p: string | null = first;
      for (let page = 0; page < kind.pages && p !== null; page++) {
        const started = performance.now();
        const res = await server.request('GET', p);
        ms.push(performance.now() - started);
        if (res.status !== 200) throw new Error(`GET ${p}: ${res.status} ${res.text}`);
        const cursor: string | undefined = res.body.next_cursor;
        p = cursor ? `${first}${first.includes('?') ? '&' : '?'}cursor=${encodeURIComponent(cursor)}` : null;
      }
    }
    times.set(kind.name, ms);
  }
  return times;
}

export async function benchQueries(events: number, chdbDirect: <T>(...args: string[]) => Promise<T>): Promise<string[]> {
  const dataDir = await mkdtemp(path.join(os.tmpdir(), 'svc-bench-queries-'));
  const lines: string[] = [];
  const f = (n: number) => n.toFixed(1);
  try {
    const filled = await chdbDirect<Filled>('fill', dataDir, String(events));
    const env = { SVC_RATE_LIMIT_READS: '0', SVC_RATE_LIMIT_WRITES: '0' };
    const server = await startServer(env, { dataDir });
    let asFilled: Map<string, number[]>;
    let merged: Map<string, number[]>;
    let optimized: { before: Filled['parts']; after: Filled['parts']; seconds: number };
    const list = kinds(filled);
    try {
      asFilled = await measure(server, list);
      await server.stop();
      optimized = await chdbDirect('optimize', dataDir);
      await server.restart();
      merged = await measure(server, list);
    } finally {
      await server.cleanup();
    }
    const gb = (b: number) => `${(b / 1024 ** 3).toFixed(2)} GiB`;
    lines.push(
      `| ${events.toLocaleString('en-US')} events filled in ${f(filled.fill_seconds)} s (one tenant, ${filled.parts.partitions} daily partitions, ${gb(filled.parts.bytes)}) | as filled: ${optimized.before.parts} parts | merged (OPTIMIZE FINAL, ${f(optimized.seconds)} s): ${optimized.after.parts} parts | target |`,
    );
    const all = (m: Map<string, number[]>, pick: (name: string) => boolean) => [...m].filter(([k]) => pick(k)).flatMap(([, v]) => v);
    const cell = (ms: number[]) => `p50 ${f(pct(ms, 0.5))} / p95 ${f(pct(ms, 0.95))} ms (n ${ms.length})`;
    for (const kind of list) lines.push(`| ${kind.name} | ${cell(asFilled.get(kind.name)!)} | ${cell(merged.get(kind.name)!)} | p95 < 100 ms |`);
    const lists = (k: string) => k.startsWith('GET /v1/traces?');
    lines.push(`| every GET /v1/traces list request above | ${cell(all(asFilled, lists))} | ${cell(all(merged, lists))} | p95 < 100 ms |`);
  } finally {
    await rm(dataDir, { recursive: true, force: true });
  }
  return lines;
}
