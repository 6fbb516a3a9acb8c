/**
 * The `datasets` section of `npm run bench` (docs/datasets.md), through the real HTTP API on the
 * embedded deployment:
 *   - an add of 10,000 records in 10 batches of 1,000 (each answered once its version is
 *     readable), in records/s, with each batch's time;
 *   - a read of one version with a tag filter: a page of 100 (p50/p95 over 200 reads), and the
 *     whole filtered version (about 1,000 records) as NDJSON (p50/p95 over 50 reads);
 *   - the creation of an experiment over 1,000 of those records (the dataset resolved, its
 *     scenarios written and readable), p50 over 5.
 * Records are about 300 bytes of JSON, each with one of 10 tags.
 */
import { startServer } from '../helpers/server.ts';
import { pct } from './queries.ts';

const RECORDS = 10_000;
const BATCHES = 10;
const TAGS = 10;

function record(i: number) {
  return {
    input: {
      question: `What is the status of order ${i}?`,
      customer: { id: `c-${i % 997}`, tier: i % 3 === 0 ? 'gold' : 'standard' },
      history: [i, i + 1, i + 2],
    },
    expected: { answer: `order ${i} shipped`, route: i % 2 === 0 ? 'billing' : 'logistics' },
    metadata: { source: 'bench', batch: Math.floor(i / (RECORDS / BATCHES)) },
    tags: [`tag-${i % TAGS}`],
  };
}

async function timed<T>(work: () => Promise<T>): Promise<{ ms: number; value: T }> {
  const started = performance.now();
  const value = await work();
  return { ms: performance.now() - started, value };
}

export async function benchDatasets(): Promise<string[]> {
  const server = await startServer({ SVC_RATE_LIMIT_READS: '0', SVC_RATE_LIMIT_WRITES: '0' }, { split: false });
  const f = (n: number) => n.toFixed(1);
  const lines: string[] = [];
  try {
    const created = await server.request('POST', '/v1/datasets', { body: { name: 'bench' } });
    if (created.status !== 201) throw new Error(`create: ${created.status} ${created.text}`);
    const id = created.body.id as string;
    const per = RECORDS / BATCHES;
    const batchMs: number[] = [];
    let bytes = 0;
    const all = await timed(async () => {
      for (let b = 0; b < BATCHES; b++) {
        const body = JSON.stringify(Array.from({ length: per }, (_, i) => record(b * per + i)));
        bytes += body.length;
        const { ms, value } = await timed(() => server.request('POST', `/v1/datasets/${id}/records`, { body }));
        if (value.status !== 201) throw new Error(`add: ${value.status} ${value.text}`);
        batchMs.push(ms);
      }
    });
    lines.push(
      `| add ${RECORDS.toLocaleString('en-US')} records in ${BATCHES} batches of ${per.toLocaleString('en-US')} (POST /v1/datasets/:id/records, each answered once its version is readable; ${f(bytes / RECORDS)} B per record) | ${Math.round(RECORDS / (all.ms / 1000)).toLocaleString('en-US')} records/s (${f(all.ms / 1000)} s) | one batch: p50 ${f(pct(batchMs, 0.5))} ms, max ${f(Math.max(...batchMs))} ms | |`,
    );

    // Version 6: the first 5,000 records; one tag of 10: about 500 of them.
    const path = `/v1/datasets/${id}/records?version=6&tags=tag-3`;
    const pageMs: number[] = [];
    for (let i = 0; i < 220; i++) {
      const { ms, value } = await timed(() => server.request('GET', `${path}&limit=100`));
      if (value.status !== 200 || value.body.count !== 100) throw new Error(`read: ${value.status} ${value.text.slice(0, 200)}`);
      if (i >= 20) pageMs.push(ms);
    }
    lines.push(
      `| read one version with a tag filter: a page of 100 (GET .../records?version=6&tags=tag-3&limit=100, of 5,000 records) | p50 ${f(pct(pageMs, 0.5))} ms | p95 ${f(pct(pageMs, 0.95))} ms | |`,
    );
    const streamMs: number[] = [];
    let streamed = 0;
    for (let i = 0; i < 55; i++) {
      const { ms, value } = await timed(() => server.request('GET', `/v1/datasets/${id}/records?tags=tag-3&format=ndjson`));
      streamed = value.text.trim().split('\n').length;
      if (value.status !== 200 || streamed !== RECORDS / TAGS) throw new Error(`stream: ${value.status} ${streamed} lines`);
      if (i >= 5) streamMs.push(ms);
    }
    lines.push(
      `| read one version with a tag filter, whole, as NDJSON (${streamed.toLocaleString('en-US')} of ${RECORDS.toLocaleString('en-US')} records) | p50 ${f(pct(streamMs, 0.5))} ms | p95 ${f(pct(streamMs, 0.95))} ms | |`,
    );

    const spec =
      'version: 1\nid: bench-ds\nbase: debian:bookworm\ntask: {prompt: "{{ input.question }}"}\ninvariants:\n  ok: {check: {type: command_exit, command: \'test {{ expected.route | shell }} != x\'}}\n';
    const stored = await server.request('POST', '/v1/specs', { body: spec, headers: { 'content-type': 'application/x-yaml' } });
    if (stored.status !== 201) throw new Error(`spec: ${stored.text}`);
    const createMs: number[] = [];
    for (let i = 0; i < 5; i++) {
      const { ms, value } = await timed(() =>
        server.request('POST', '/v1/experiments', { body: { name: `bench ${i}`, spec_id: 'bench-ds', dataset: { id, version: 2 } } }),
      );
      if (value.status !== 201) throw new Error(`experiment: ${value.status} ${value.text}`);
      createMs.push(ms);
    }
    lines.push(
      `| create an experiment over 1,000 records (POST /v1/experiments with \`dataset\`: resolved, its 1,000 scenarios written and readable) | p50 ${f(pct(createMs, 0.5))} ms | max ${f(Math.max(...createMs))} ms | |`,
    );
  } finally {
    await server.cleanup();
  }
  return lines;
}
