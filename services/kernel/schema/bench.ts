/**
 * Speed of the event serde beside raw avsc, on `svc.traces` values (trace-like events), in
 * events per second on one core. `npm run bench` can call benchSerde(); run alone with
 * `node --import tsx services/kernel/schema/bench.ts`.
 */
import { fileURLToPath } from 'node:url';
import { loadCatalog, TOPICS } from '../topics.ts';
import { EventSerde } from './serde.ts';
import type { SchemaRegistry } from './registry.ts';

export interface SerdeBenchFigure {
  case: string;
  eventsPerSecond: number;
  /** Serde rate over raw avsc's (toBuffer + fromBuffer) on the same values. */
  ratioToRawAvsc: number;
}

function traceEvent(i: number): Record<string, unknown> {
  return {
    event_id: `ev-${i.toString(16).padStart(8, '0')}`,
    ts_us: 1_700_000_000_000_000 + i * 1000,
    event_type: i % 3 === 0 ? 'llm_call' : 'tool_call',
    tool: i % 3 === 0 ? 'chat' : 'bash',
    phase: 'end',
    trace_id: '4bf92f3577b34da6a3ce929d0e0e4736',
    span_id: (0x00f067aa0ba902b7 + i).toString(16).padStart(16, '0'),
    parent_span_id: i % 10 === 0 ? null : '00f067aa0ba902b7',
    duration_ms: 10 + (i % 500),
    status: 'ok',
    input: `{"cmd":"ls -la /work/${i}"}`,
    output: 'total 12\ndrwxr-xr-x 2 root root 4096 .\n',
    cost: i % 3 === 0 ? { input_tokens: 1200, output_tokens: 300, cache_read_tokens: 0, reasoning_tokens: 0, model: 'gpt-x', estimated_usd: 0.0123 } : null,
    metadata: { attempt: '1', cwd: '/work' },
  };
}

function traceBatch(events: number, seed = 0): Record<string, unknown> {
  return {
    tenant: 'tenant-a',
    event_id: `batch-${seed}`,
    ts: 1_700_000_000_000 + seed,
    sandbox_id: 'sb-0123abcd',
    experiment_id: null,
    agent: 'coder',
    agent_snapshot_id: 'snap_abc',
    events: Array.from({ length: events }, (_, i) => traceEvent(seed * events + i)),
  };
}

/** A registry of one process, enough to measure the serde without a log. */
class MemoryRegistry implements SchemaRegistry {
  private readonly byId = new Map<number, string>();
  async register(_subject: string, schema: string): Promise<number> {
    for (const [id, s] of this.byId) if (s === schema) return id;
    this.byId.set(this.byId.size + 1, schema);
    return this.byId.size;
  }
  async getSchema(id: number): Promise<string> {
    const s = this.byId.get(id);
    if (s === undefined) throw new Error(`schema ${id} not found`);
    return s;
  }
}

function rate(events: number, run: () => void, minMs = 400): number {
  run(); // warm up
  let n = 0;
  const start = process.hrtime.bigint();
  let elapsed = 0;
  while (elapsed < minMs) {
    run();
    n++;
    elapsed = Number(process.hrtime.bigint() - start) / 1e6;
  }
  return Math.round((events * n) / (elapsed / 1000));
}

export async function benchSerde(): Promise<SerdeBenchFigure[]> {
  const serde = new EventSerde(new MemoryRegistry(), loadCatalog());
  await serde.init();
  const topic = TOPICS.traces;
  const type = serde.type(topic);
  const figures: SerdeBenchFigure[] = [];

  // One value of 1,000 events, and 1,000 values of one event each.
  const batch = traceBatch(1000);
  const singles = Array.from({ length: 1000 }, (_, i) => traceBatch(1, i));
  const singleBufs = singles.map((v) => serde.encode(topic, v));

  const cases: Array<{ name: string; raw: () => void; ours: () => void }> = [
    {
      name: 'encode+decode, one value of 1,000 events',
      raw: () => void type.fromBuffer(type.toBuffer(batch)),
      ours: () => void serde.decodeSync(topic, serde.encode(topic, batch)),
    },
    {
      name: 'encode+decode, 1,000 values of 1 event',
      raw: () => {
        for (const v of singles) type.fromBuffer(type.toBuffer(v));
      },
      ours: () => {
        for (const v of singles) serde.decodeSync(topic, serde.encode(topic, v));
      },
    },
    {
      name: 'decode only, 1,000 values of 1 event',
      raw: () => {
        for (const b of singleBufs) type.fromBuffer(b.subarray(5));
      },
      ours: () => {
        for (const b of singleBufs) serde.decodeSync(topic, b);
      },
    },
  ];
  for (const c of cases) {
    const raw = rate(1000, c.raw);
    const ours = rate(1000, c.ours);
    figures.push({ case: `avsc raw: ${c.name}`, eventsPerSecond: raw, ratioToRawAvsc: 1 });
    figures.push({ case: `EventSerde: ${c.name}`, eventsPerSecond: ours, ratioToRawAvsc: Math.round((ours / raw) * 100) / 100 });
  }
  return figures;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  for (const f of await benchSerde()) {
    console.log(`${f.case.padEnd(58)} ${String(f.eventsPerSecond.toLocaleString('en-US')).padStart(12)} events/s  x${f.ratioToRawAvsc}`);
  }
}
