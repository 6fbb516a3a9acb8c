/**
 * The `dashboard` section of `npm run bench` (docs/dashboard.md): the page of an experiment of
 * 200 scenarios in Debian's Chromium (headless, playwright-core), from navigation until the
 * scenarios table shows all 200 rows with the data from GET /v1/experiments/:id, cold (a new
 * browser context: nothing cached) and warm (the hashed assets cached, index.html revalidated);
 * and that API answer alone, for comparison. Target: under 1 s. Runs alone too:
 * `node --import tsx test/load/dashboard.ts`.
 */
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { createClient } from '../../packages/sdk/src/client.ts';
import { makeBundle } from '../helpers/bundles.ts';
import { createTenantKey, REPO, startServer } from '../helpers/server.ts';
import { CHROMIUM, CHROMIUM_ARGS } from '../helpers/chromium.ts';
import { pct } from './queries.ts';

const SCENARIOS = 200;
const LOADS = 10;

export async function benchDashboard(): Promise<string[]> {
  const executablePath = CHROMIUM;
  if (!executablePath) return ["| skipped: Debian's chromium is not installed (apt-get install chromium) | | | |"];
  execFileSync(process.execPath, [path.join(REPO, 'packages', 'dashboard', 'build.mjs')], { stdio: 'inherit' });
  const server = await startServer({ SVC_SANDBOX_HOST_ROOTFS: 'true', SVC_RATE_LIMIT_READS: '0', SVC_RATE_LIMIT_WRITES: '0' }, { split: false });
  const browser = await chromium.launch({ executablePath, headless: true, args: CHROMIUM_ARGS });
  try {
    const key = (await createTenantKey(server, 'bench')).key;
    const client = createClient({ baseUrl: server.url, apiKey: key, sandboxId: '' });
    await client.agents.upload(await makeBundle({ 'run.sh': '#!/bin/sh\necho ok > "$SVC_WORKSPACE/out.txt"\n' }), {
      name: 'bench-ui',
      entrypoint: ['sh', 'run.sh'],
    });
    await client.specs.put(
      'version: 1\nid: bench-ui\nbase: debian:bookworm\ntask: {prompt: p}\nagent: {type: snapshot, snapshot: bench-ui}\ninvariants:\n  out: {check: {type: file_exists, path: out.txt}}\n',
    );
    const matrix = Array.from({ length: SCENARIOS }, (_, i) => ({ case: i }));
    const { id } = await client.experiments.create({ name: 'bench 200 scenarios', spec_id: 'bench-ui', matrix, replicas: 1, run: true });
    for (;;) {
      const r = await client.experiments.get(id);
      if (['completed', 'failed', 'cancelled'].includes(r.status)) break;
      await new Promise((res) => setTimeout(res, 1000));
    }
    const api: number[] = [];
    for (let i = 0; i < LOADS; i++) {
      const started = performance.now();
      await client.experiments.get(id);
      api.push(performance.now() - started);
    }
    const load = async (page: import('playwright-core').Page) => {
      const started = performance.now();
      await page.goto(`${server.url}/ui/#/experiments/${id}`);
      await page.waitForFunction((n) => document.querySelectorAll('tr.scenario').length === n, SCENARIOS);
      return performance.now() - started;
    };
    const cold: number[] = [];
    const warm: number[] = [];
    for (let i = 0; i < LOADS; i++) {
      const context = await browser.newContext();
      await context.addInitScript((k) => sessionStorage.setItem('svc.apiKey', k), key);
      const page = await context.newPage();
      cold.push(await load(page));
      await page.goto('about:blank');
      warm.push(await load(page));
      await context.close();
    }
    const f = (xs: number[]) => `p50 ${pct(xs, 0.5).toFixed(0)} ms, max ${Math.max(...xs).toFixed(0)} ms`;
    return [
      `| experiment page of ${SCENARIOS} scenarios, navigation until every row shows (cold: new context) | ${f(cold)} | | < 1 s |`,
      `| the same, warm (hashed assets cached, index.html revalidated) | ${f(warm)} | | < 1 s |`,
      `| GET /v1/experiments/:id alone (RunResults of ${SCENARIOS} scenarios) | ${f(api)} | | |`,
    ];
  } finally {
    await browser.close();
    await server.cleanup();
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  console.log('| dashboard (Chromium, local runtime) | | | |\n|---|---:|---:|---|');
  for (const line of await benchDashboard()) console.log(line);
}
