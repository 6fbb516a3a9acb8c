import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, test } from 'node:test';
import { AppError } from '../../services/kernel/errors.ts';
import { AuditLog, type AuditRecord } from '../../services/sandbox-runner/workspace/audit-log.ts';
import { FsWatcher } from '../../services/sandbox-runner/workspace/fs-watcher.ts';
import { captureState } from '../../services/sandbox-runner/workspace/state.ts';
import { writeFile as apiWrite } from '../../services/sandbox-runner/workspace/files.ts';

const haveInotify = (() => {
  try {
    execFileSync('inotifywait', ['--help'], { stdio: 'ignore' });
    return true;
  } catch (err) {
    return (err as { status?: number }).status !== undefined; // --help exits 1 but runs
  }
})();
const skip = haveInotify ? false : 'inotifywait (inotify-tools) is not installed';

let ws: string;
let log: AuditLog;
beforeEach(async () => {
  ws = await mkdtemp(path.join(os.tmpdir(), 'ws-watch-'));
  await mkdir(path.join(ws, '.svc'));
  log = new AuditLog({ workspace: ws, sandboxId: 'sb-w' });
});
afterEach(async () => {
  await log.close();
  await rm(ws, { recursive: true, force: true });
});

const sh = (script: string) => execFileSync('sh', ['-c', script], { cwd: ws });
const fileEvents = (records: AuditRecord[]) => records.filter((r) => r.type.startsWith('file_')).map((r) => [r.type, r.details.path] as const);

test('sees a write, a read and a delete made by another process; ignores .svc', { skip }, async () => {
  const w = new FsWatcher({ workspace: ws, watch: ['/'], track: ['writes', 'reads', 'deletes'], audit: log });
  await w.start();
  sh('echo hi > f; cat f >/dev/null; rm f; echo x > .svc/planted; cat .svc/planted >/dev/null');
  await log.record('warning', { message: 'the log itself is not an agent write' });
  await w.stop();
  const records = await AuditLog.read(ws);
  assert.deepEqual(fileEvents(records), [
    ['file_write', 'f'],
    ['file_read', 'f'],
    ['file_delete', 'f'],
  ]);
});

test('a write record carries the size of the file when it is still there', { skip }, async () => {
  const w = new FsWatcher({ workspace: ws, watch: ['/'], track: ['writes'], audit: log });
  await w.start();
  sh('printf 12345 > sized.txt');
  await w.stop();
  assert.deepEqual(
    (await AuditLog.read(ws)).map((r) => [r.type, r.details]),
    [['file_write', { path: 'sized.txt', bytes: 5 }]],
  );
});

test('a symlink or hard link made while the agent runs is a write, though no close follows it', { skip }, async () => {
  await writeFile(path.join(ws, 'target.txt'), 'x');
  const w = new FsWatcher({ workspace: ws, watch: ['/'], track: ['writes'], audit: log, coalesceMs: 50 });
  await w.start();
  sh('ln -s target.txt soft && ln target.txt hard');
  await new Promise((r) => setTimeout(r, 300));
  // Recorded by the flush after the links appeared, before the watch ends.
  const seen = (await AuditLog.read(ws)).map((r) => [r.type, r.details]);
  await w.stop();
  assert.deepEqual(seen, [
    ['file_write', { path: 'soft', symlink: true }],
    ['file_write', { path: 'hard', bytes: 1 }],
  ]);
  assert.equal((await AuditLog.read(ws)).length, 2, 'not recorded again at stop');
});

test('track and watch filter; new nested directories are caught; renames are delete + write', { skip }, async () => {
  await mkdir(path.join(ws, 'src'));
  await writeFile(path.join(ws, 'outside.txt'), 'x');
  const w = new FsWatcher({ workspace: ws, watch: ['/workspace/src', 'build'], track: ['writes', 'deletes'], audit: log });
  await w.start();
  sh(
    'cat outside.txt >/dev/null; echo y >> outside.txt; cat src/../outside.txt > /dev/null; mkdir -p src/a/b/c && echo deep > src/a/b/c/f.txt; mkdir -p build/out && echo o > build/out/x; echo 1 > src/t; mv src/t src/u; cat src/u >/dev/null',
  );
  await w.stop();
  const events = fileEvents(await AuditLog.read(ws));
  assert.deepEqual(
    events.filter(([, p]) => p !== 'src/a/b/c/f.txt' && p !== 'build/out/x'),
    [
      ['file_write', 'src/t'],
      ['file_delete', 'src/t'],
      ['file_write', 'src/u'],
    ],
  );
  assert.ok(
    events.some(([t, p]) => t === 'file_write' && p === 'src/a/b/c/f.txt'),
    JSON.stringify(events),
  );
  assert.ok(
    events.some(([t, p]) => t === 'file_write' && p === 'build/out/x'),
    JSON.stringify(events),
  );
});

test('bursts are coalesced; an open for writing that changes nothing is not a write', { skip }, async () => {
  await writeFile(path.join(ws, 'same.txt'), 'x');
  const w = new FsWatcher({ workspace: ws, watch: ['.'], track: ['writes', 'reads'], audit: log, coalesceMs: 1000 });
  await w.start();
  sh(
    'for i in 1 2 3 4 5 6 7 8 9 10; do echo $i >> burst.log; done; for i in 1 2 3 4 5; do cat burst.log > /dev/null; done; : >> same.txt; echo 11 >> burst.log',
  );
  await w.stop();
  assert.deepEqual(fileEvents(await AuditLog.read(ws)), [
    ['file_write', 'burst.log'],
    ['file_read', 'burst.log'],
    ['file_write', 'burst.log'],
  ]);
});

test("the service's own operations can be suppressed", { skip }, async () => {
  await writeFile(path.join(ws, 'seen.txt'), 'x');
  const w = new FsWatcher({ workspace: ws, watch: ['/'], track: ['writes', 'reads', 'deletes'], audit: log });
  await w.start();
  await w.suppressDuring({ paths: ['/workspace/api.txt'] }, () => apiWrite(ws, 'api.txt', 'from the API'));
  await w.suppressDuring({ kinds: ['read'] }, () => captureState(ws));
  sh('cat seen.txt > /dev/null; echo agent > agent.txt');
  await w.stop();
  assert.deepEqual(fileEvents(await AuditLog.read(ws)), [
    ['file_read', 'seen.txt'],
    ['file_write', 'agent.txt'],
  ]);
});

test("an agent's read right after a suppression is recorded, even within the millisecond it ended", { skip }, async () => {
  // The clock stands still, so the barrier's CREATE and the agent's read that follows it arrive at the same Date.now().
  await writeFile(path.join(ws, 'seen.txt'), 'x');
  const w = new FsWatcher({ workspace: ws, watch: ['/'], track: ['reads'], audit: log });
  await w.start();
  const realNow = Date.now;
  const frozen = realNow();
  Date.now = () => frozen;
  try {
    await w.suppressDuring({ kinds: ['read'] }, () => captureState(ws));
    sh('cat seen.txt > /dev/null');
    await w.stop();
  } finally {
    Date.now = realNow;
  }
  assert.deepEqual(fileEvents(await AuditLog.read(ws)), [['file_read', 'seen.txt']]);
});

test('a file still open for writing is recorded at stop', { skip }, async () => {
  const w = new FsWatcher({ workspace: ws, watch: ['/'], track: ['writes'], audit: log });
  await w.start();
  const { spawn } = await import('node:child_process');
  const child = spawn('sh', ['-c', 'exec 3> open.log; echo started >&3; exec sleep 30'], { cwd: ws });
  while (!(await readFile(path.join(ws, 'open.log'), 'utf8').catch(() => '')).includes('started')) await new Promise((r) => setTimeout(r, 20));
  await w.stop();
  child.kill('SIGKILL');
  assert.deepEqual(fileEvents(await AuditLog.read(ws)), [['file_write', 'open.log']]);
});

test('bad watch and track settings are 400 naming the field', { skip }, async () => {
  const bad = async (watch: unknown, track: unknown, field: RegExp) => {
    const w = new FsWatcher({ workspace: ws, watch, track, audit: log });
    await assert.rejects(w.start(), (err: unknown) => err instanceof AppError && err.status === 400 && field.test(err.message));
  };
  await bad(['/etc'], ['writes'], /^audit\.file_system\.watch\[0\]: /);
  await bad(['src', '../x'], ['writes'], /^audit\.file_system\.watch\[1\]: /);
  await bad(['.svc'], ['writes'], /^audit\.file_system\.watch\[0\]: /);
  await bad('src', ['writes'], /^audit\.file_system\.watch: /);
  await bad(['/'], ['writes', 'chmods'], /^audit\.file_system\.track\[1\]: /);
});

test('a missing inotifywait fails start with a hint', async () => {
  const w = new FsWatcher({ workspace: ws, watch: ['/'], track: ['writes'], audit: log, command: '/nonexistent/inotifywait' });
  await assert.rejects(w.start(), /inotify-tools/);
  await w.stop();
});

test("where the kernel's inotify limit is reached, the watch says so in a warning and does not fail the start", { skip }, async () => {
  // The limit is the kernel's own, lowered to one watch in a user namespace of its own (nothing else on the host is touched).
  await mkdir(path.join(ws, 'a', 'b'), { recursive: true });
  const script = path.join(ws, '..', `${path.basename(ws)}-limit.mts`);
  await writeFile(
    script,
    `import { FsWatcher } from ${JSON.stringify(path.resolve('services/sandbox-runner/workspace/fs-watcher.ts'))};
const events = [];
const w = new FsWatcher({ workspace: ${JSON.stringify(ws)}, watch: ['/'], track: ['writes'], onEvent: (type, details) => void events.push({ type, details }) });
await w.start();
await w.stop();
console.log(JSON.stringify(events));
`,
  );
  try {
    const out = execFileSync(
      'unshare',
      ['-U', '-r', 'sh', '-c', 'echo 1 > /proc/sys/user/max_inotify_watches && exec "$0" --import tsx "$1"', process.execPath, script],
      { encoding: 'utf8' },
    );
    const events = JSON.parse(out.trim().split('\n').at(-1)!);
    assert.equal(events.length, 1, out);
    assert.equal(events[0].type, 'warning');
    assert.match(events[0].details.message, /upper limit on inotify watches reached.*reconciliation/);
  } finally {
    await rm(script, { force: true });
  }
});
