/**
 * Filesystem state capture on a generated workspace: cold (nothing cached), warm (a ChecksumCache
 * from the previous capture, nothing changed), and warm after changing 1% of the files.
 *
 *   node --import tsx test/load/workspace-bench.ts [files=10000] [--concurrency=8]
 *
 * The workspace mixes small source-like files (200 B - 8 KiB) in nested directories, a few files
 * over 1 MiB (no checksum) and skipped directories (node_modules, .git) that must cost nothing.
 * "Cold" runs after the page cache is warm (the files were just written); a real cold disk is slower.
 */
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { captureState, ChecksumCache, diffStates } from '../../services/sandbox-runner/workspace/state.ts';

const n = Number(process.argv.find((a) => /^\d+$/.test(a)) ?? 10_000);
const concurrency = Number(process.argv.find((a) => a.startsWith('--concurrency='))?.split('=')[1] ?? 8);

const ws = await mkdtemp(path.join(os.tmpdir(), 'ws-bench-'));
try {
  const t0 = performance.now();
  const rels: string[] = [];
  let bytes = 0;
  for (let i = 0; i < n; i++) {
    const rel = `src/m${i % 20}/d${i % 97}/file${i}.txt`;
    rels.push(rel);
  }
  const dirs = new Set(rels.map((r) => path.dirname(r)));
  for (const d of dirs) await mkdir(path.join(ws, d), { recursive: true });
  const write = async (rel: string, size: number) => {
    const buf = Buffer.alloc(size, rel);
    bytes += size;
    await writeFile(path.join(ws, rel), buf);
  };
  for (let i = 0; i < rels.length; i += 256) {
    await Promise.all(rels.slice(i, i + 256).map((rel, j) => write(rel, 200 + (((i + j) * 7919) % 8000))));
  }
  await mkdir(path.join(ws, 'assets'));
  for (let i = 0; i < 5; i++) await write(`assets/big${i}.bin`, 2 * 1024 * 1024);
  await mkdir(path.join(ws, 'node_modules/pkg'), { recursive: true });
  await mkdir(path.join(ws, '.git/objects'), { recursive: true });
  for (let i = 0; i < 2000; i++) await writeFile(path.join(ws, `node_modules/pkg/f${i}.js`), 'x');
  console.log(`generated ${n} files (+5 of 2 MiB, +2000 skipped) in ${ms(performance.now() - t0)}, ${(bytes / 1048576).toFixed(1)} MiB`);

  // Files changed within the racy window (1 s) are never trusted from the cache; real workspaces
  // were mostly written before the run, so let the generated ones age past it.
  await new Promise((resolve) => setTimeout(resolve, 1100));
  const cache = new ChecksumCache();
  let before: Awaited<ReturnType<typeof captureState>> | undefined;
  const time = async (label: string, prep?: () => Promise<void>) => {
    if (prep) await prep();
    const t = performance.now();
    const s = await captureState(ws, { cache, concurrency });
    const dt = performance.now() - t;
    const d = before ? diffStates(before, s) : undefined;
    console.log(
      `${label.padEnd(28)} ${ms(dt).padStart(9)}  files=${Object.keys(s.files).length} hashed=${cache.lastHashed}` +
        (d ? ` diff=+${d.added.length}/~${d.modified.length}/-${d.removed.length}` : ''),
    );
    before ??= s;
  };
  await time('cold (no cache)');
  await time('warm (nothing changed)');
  await time('warm again');
  await time('warm, 1% changed', async () => {
    for (let i = 0; i < n; i += 100) await writeFile(path.join(ws, rels[i]!), `changed ${i}`);
  });
  const fresh = new ChecksumCache();
  const t = performance.now();
  await captureState(ws, { cache: fresh, concurrency });
  console.log(`${'cold again (new cache)'.padEnd(28)} ${ms(performance.now() - t).padStart(9)}`);
  const a = await captureState(ws, { cache, concurrency });
  const t2 = performance.now();
  diffStates(before!, a);
  console.log(`${'diffStates'.padEnd(28)} ${ms(performance.now() - t2).padStart(9)}`);
  // Event-loop responsiveness during a cold capture: the longest gap between timer ticks.
  let last = performance.now();
  let worst = 0;
  const tick = setInterval(() => {
    const now = performance.now();
    worst = Math.max(worst, now - last);
    last = now;
  }, 1);
  await captureState(ws, { concurrency });
  clearInterval(tick);
  console.log(`${'longest event-loop stall'.padEnd(28)} ${ms(worst).padStart(9)}  (during a cold capture)`);
  console.log(`node ${process.version}, ${os.cpus().length} CPUs, concurrency ${concurrency}, UV_THREADPOOL_SIZE=${process.env.UV_THREADPOOL_SIZE ?? '4 (default)'}`);
} finally {
  await rm(ws, { recursive: true, force: true });
}

function ms(x: number): string {
  return `${x.toFixed(0)} ms`;
}
