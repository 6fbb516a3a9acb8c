// Quick figures for the local runtime (not a test; `npm run bench` owns the real targets):
//   node --import tsx test/isolation/measure-local-runtime.ts
// create-to-ready p50/p95, destroy p50, exec round trip of `true` vs spawning `sh -c true`
// directly (interleaved, same run), and 20 sandboxes created at once.
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { LocalRuntime } from '../../services/sandbox-runner/runtime/local-runtime.ts';
import type { SandboxResources } from '../../services/sandbox-runner/runtime/runtime.ts';

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'svc-measure-'));
const runtime = new LocalRuntime({ stateDir: path.join(root, 'state') });
const reason = await runtime.available();
if (reason) {
  console.log(`local runtime unavailable: ${reason}`);
  process.exit(0);
}
const resources: SandboxResources = { memoryBytes: 512 * 1024 * 1024, cpus: 1, pids: 256, diskBytes: null };
const pct = (xs: number[], p: number) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))]!;
const fmt = (xs: number[]) => `p50 ${pct(xs, 50).toFixed(2)} ms, p95 ${pct(xs, 95).toFixed(2)} ms (n=${xs.length})`;

async function create() {
  const id = `sb-${randomBytes(6).toString('hex')}`;
  const workspace = path.join(root, 'ws', id);
  fs.mkdirSync(workspace, { recursive: true });
  return runtime.create({ id, workspace, rootfs: null, env: {}, resources });
}

function spawnTrue(): Promise<number> {
  const t = performance.now();
  return new Promise((resolve) => spawn('sh', ['-c', 'true'], { stdio: ['ignore', 'pipe', 'pipe'] }).on('close', () => resolve(performance.now() - t)));
}

await (await create()).destroy(); // warm-up (builds the supervisor on a fresh state dir)
const creates: number[] = [];
const destroys: number[] = [];
for (let i = 0; i < 40; i++) {
  let t = performance.now();
  const sb = await create();
  creates.push(performance.now() - t);
  t = performance.now();
  await sb.destroy();
  destroys.push(performance.now() - t);
}
console.log(`create-to-ready: ${fmt(creates)}`);
console.log(`destroy:         ${fmt(destroys)}`);

const sb = await create();
for (let i = 0; i < 20; i++) await sb.exec({ command: 'true' });
const viaSandbox: number[] = [];
const direct: number[] = [];
for (let i = 0; i < 300; i++) {
  let t = performance.now();
  await sb.exec({ command: 'true' });
  viaSandbox.push(performance.now() - t);
  direct.push(await spawnTrue());
}
console.log(`exec 'true' in the sandbox:     ${fmt(viaSandbox)}`);
console.log(`spawn('sh', ['-c', 'true']):    ${fmt(direct)}`);
console.log(`round-trip overhead at p50:     ${(pct(viaSandbox, 50) - pct(direct, 50)).toFixed(2)} ms`);
await sb.destroy();

const t = performance.now();
const many = await Promise.allSettled(Array.from({ length: 20 }, () => create()));
const ok = many.filter((r) => r.status === 'fulfilled');
console.log(`20 concurrent creates: ${ok.length}/20 ready in ${(performance.now() - t).toFixed(1)} ms`);
await Promise.all(ok.map((r) => (r as PromiseFulfilledResult<Awaited<ReturnType<typeof create>>>).value.destroy()));
fs.rmSync(root, { recursive: true, force: true });
