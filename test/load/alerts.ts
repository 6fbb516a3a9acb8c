/**
 * The `alerts` section of `npm run bench`: how long from an experiment's completion (its
 * `completed_at`, stamped by the aggregator) until a webhook receiver on the loopback has the
 * notification, with 50 rules that all fire on every completion (thresholds without a window,
 * over the last 3 experiments and over the last hour, each kind with its own metric), side by
 * side with one rule alone. SVC_BENCH_ALERT_EXPERIMENTS (default 20) failing experiments of one
 * run each, one after the other, for each.
 */
import { httpReceiver, type HttpReceiver } from '../helpers/alert-receivers.ts';
import { createTenantKey, startServer, type TestServer } from '../helpers/server.ts';
import { pct } from './queries.ts';

const EXPERIMENTS = Number(process.env.SVC_BENCH_ALERT_EXPERIMENTS ?? 20);
const RULES = 50;

const SPEC = (id: string) => `version: 1
id: ${id}
base: debian:bookworm
task: {prompt: fail}
agent: {type: cli, command: "true"}
invariants:
  out: {check: {type: file_exists, path: out.txt}}
`;

/** 50 rules on the spec, every one of which holds for a failing experiment (the windowed ones from the third on). */
function rules(specId: string, url: string): Array<Record<string, unknown>> {
  const kinds: Array<{ condition: string; window?: string }> = [
    { condition: 'pass_rate < 1' },
    { condition: 'mean_tool_calls == 0' },
    { condition: 'side_effect_violations >= 0' },
    { condition: 'pass_rate < 0.5', window: 'last_3_runs' },
    { condition: 'pass_rate <= 0', window: 'last_1h' },
  ];
  return Array.from({ length: RULES }, (_, i) => ({
    name: `bench ${i}`,
    eval_id: specId,
    ...kinds[i % kinds.length]!,
    webhook_url: `${url}/hook/${specId}/${i}`,
  }));
}

/** Runs `EXPERIMENTS` failing experiments of the spec; each notification's delay after its experiment's completion, and the slowest of each. */
async function measure(
  server: TestServer,
  key: string,
  hooks: HttpReceiver,
  specId: string,
  expected: (n: number) => number,
): Promise<{ each: number[]; last: number[] }> {
  const each: number[] = [];
  const last: number[] = [];
  for (let n = 1; n <= EXPERIMENTS; n++) {
    const created = await server.request('POST', '/v1/experiments', { key, body: { name: `${specId} ${n}`, spec_id: specId, run: true } });
    if (created.status !== 201) throw new Error(`experiment: ${created.text}`);
    const id = created.body.id as string;
    let completedAt = 0;
    while (completedAt === 0) {
      const res = await server.request('GET', `/v1/experiments/${id}`, { key });
      if (res.body.status === 'completed') completedAt = Date.parse(res.body.completed_at);
      else if (res.body.status === 'failed' || res.body.status === 'cancelled') throw new Error(`experiment ${res.body.status}`);
      else await new Promise((r) => setTimeout(r, 20));
    }
    const want = expected(n);
    const deadline = Date.now() + 30_000;
    const mine = () => hooks.requests.filter((r) => r.path.startsWith(`/hook/${specId}/`) && r.body?.experiment_id === id);
    while (mine().length < want) {
      if (Date.now() > deadline) throw new Error(`${specId}: ${mine().length} of ${want} notifications of ${id} within 30 s`);
      await new Promise((r) => setTimeout(r, 10));
    }
    const delays = mine().map((r) => r.at - completedAt);
    each.push(...delays);
    last.push(Math.max(...delays));
  }
  return { each, last };
}

export async function benchAlerts(): Promise<string[]> {
  const hooks = await httpReceiver();
  let server: TestServer | null = null;
  try {
    server = await startServer({
      SVC_SANDBOX_HOST_ROOTFS: 'true',
      SVC_RATE_LIMIT_READS: '0',
      SVC_RATE_LIMIT_WRITES: '0',
      SVC_WEBHOOK_ALLOW_PRIVATE: '127.0.0.1',
    });
    const s = server;
    // A tenant each: 50 rules is a tenant's limit.
    const { key } = await createTenantKey(s, 'bench');
    const { key: alone } = await createTenantKey(s, 'bench-one');
    for (const [spec, bodies, k] of [
      ['many', rules('many', hooks.url), key],
      ['one', rules('one', hooks.url).slice(0, 1), alone],
    ] as const) {
      const put = await s.request('POST', '/v1/specs', { key: k, body: SPEC(spec), headers: { 'content-type': 'application/x-yaml' } });
      if (put.status !== 201) throw new Error(`spec: ${put.text}`);
      for (const body of bodies) {
        const made = await s.request('POST', '/v1/alerts', { key: k, body });
        if (made.status !== 201) throw new Error(`rule: ${made.text}`);
      }
    }
    // The last_3_runs rules (one in five) hold from the third experiment on.
    const windowed = RULES / 5;
    const many = await measure(s, key, hooks, 'many', (n) => (n >= 3 ? RULES : RULES - windowed));
    const one = await measure(s, alone, hooks, 'one', () => 1);
    const f = (ms: number) => `${ms.toFixed(0)} ms`;
    return [
      `| completion to webhook received, ${RULES} rules all firing (${EXPERIMENTS} experiments, ${many.each.length} notifications) | p50 ${f(pct(many.each, 0.5))}, p95 ${f(pct(many.each, 0.95))} | one rule: p50 ${f(pct(one.each, 0.5))}, p95 ${f(pct(one.each, 0.95))} | target p95 < 1 s |`,
      `| completion to the last of its ${RULES} notifications received | p50 ${f(pct(many.last, 0.5))}, p95 ${f(pct(many.last, 0.95))}, max ${f(Math.max(...many.last))} | | |`,
    ];
  } finally {
    await server?.cleanup();
    await hooks.close();
  }
}
