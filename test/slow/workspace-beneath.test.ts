/**
 * The path-safe layer (workspace/beneath.ts) and everything built on it, under a racing agent: a
 * directory of the workspace is swapped with a symlink to a root-only host directory by
 * renameat2(RENAME_EXCHANGE) in a tight loop while the service reads, writes, deletes, captures
 * state and scans new directories. Nothing may come back from, or land in, the host directory,
 * and a race is a 400, never a 500.
 */
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { chmod, mkdir, mkdtemp, readdir, readFile as readHost, realpath, rm, symlink, writeFile as writeHost } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { AppError } from '../../services/kernel/errors.ts';
import { AuditLog } from '../../services/sandbox-runner/workspace/audit-log.ts';
import { closeFd, removeBeneath, resolveBeneath } from '../../services/sandbox-runner/workspace/beneath.ts';
import { copyTreeIn, deleteFile, readFile, removeTree, writeFile } from '../../services/sandbox-runner/workspace/files.ts';
import { FsWatcher } from '../../services/sandbox-runner/workspace/fs-watcher.ts';
import { captureState } from '../../services/sandbox-runner/workspace/state.ts';
import { startSwapper } from '../helpers/swapper.ts';

const MARKER = `host-marker-${process.pid}`;
let ws: string;
let host: string;

before(async () => {
  ws = await realpath(await mkdtemp(path.join(os.tmpdir(), 'ws-beneath-')));
  host = await realpath(await mkdtemp(path.join(os.tmpdir(), 'host-root-only-')));
  await writeHost(path.join(host, MARKER), 'host secret');
  await writeHost(path.join(host, 'victim'), 'keep');
  await chmod(host, 0o700);
  await mkdir(path.join(ws, '.svc'));
});
after(async () => {
  await rm(ws, { recursive: true, force: true });
  await rm(host, { recursive: true, force: true });
});

/** A fresh pair in the workspace: `<name>` a real directory holding `files`, `<name>-link` a symlink to the host directory. */
async function pair(name: string, files: Record<string, string> = { 'inside.txt': 'inside' }): Promise<[string, string]> {
  const dir = path.join(ws, name);
  await mkdir(dir);
  for (const [f, content] of Object.entries(files)) await writeHost(path.join(dir, f), content);
  await symlink(host, `${dir}-link`);
  return [dir, `${dir}-link`];
}

/** A race may refuse the call (400) or find nothing (404); anything else is a bug. */
function raceOutcome(err: unknown): string {
  assert.ok(err instanceof AppError, `not an AppError: ${(err as Error).stack}`);
  assert.ok(err.status === 400 || err.status === 404, err.message);
  return String(err.status);
}

async function hostUnchanged(): Promise<void> {
  assert.deepEqual((await readdir(host)).sort(), [MARKER, 'victim'].sort());
  assert.equal(await readHost(path.join(host, 'victim'), 'utf8'), 'keep');
}

test('resolveBeneath holds the parent open and refuses a chain out of the workspace', async () => {
  await pair('plain');
  const r = resolveBeneath(ws, ['plain', 'inside.txt'], { field: 'path' });
  try {
    assert.equal(r.relative, 'plain/inside.txt');
    assert.equal(r.name, 'inside.txt');
    assert.ok(r.dir >= 0);
  } finally {
    closeFd(r.dir);
  }
  assert.throws(() => resolveBeneath(ws, ['plain-link', MARKER], { field: 'f' }), /^AppError: f: resolves outside the workspace/);
  assert.throws(() => resolveBeneath(ws, ['plain', 'inside.txt', 'x'], { field: 'f' }), /f: a parent component is not a directory/);
  // Creating parents never starts under .svc.
  assert.throws(() => resolveBeneath(ws, ['.svc', 'new', 'x'], { field: 'f', forWrite: true, createDirs: 0o755 }), /f: \.svc\/ is managed/);
  await assert.rejects(readHost(path.join(ws, '.svc', 'new')), /ENOENT/);
});

test('files API: reads, writes and deletes under a racing directory/symlink exchange never reach the host', async () => {
  const [dir, link] = await pair('race-files', { 'inside.txt': 'inside', victim: 'mine' });
  const swapper = await startSwapper(dir, link);
  const outcomes = new Map<string, number>();
  const count = (what: string) => outcomes.set(what, (outcomes.get(what) ?? 0) + 1);
  try {
    for (let i = 0; i < 300; i++) {
      for (const name of ['race-files', 'race-files-link']) {
        const read = await readFile(ws, `${name}/${MARKER}`).then((r) => r.content.toString(), raceOutcome);
        assert.notEqual(read, 'host secret');
        count(`read ${read}`);
        count(`write ${await writeFile(ws, `${name}/dropped.txt`, 'agent data').then(() => 'ok', raceOutcome)}`);
        count(`delete ${await deleteFile(ws, `${name}/victim`).then(() => 'ok', raceOutcome)}`);
      }
    }
  } finally {
    await swapper.stop();
  }
  await hostUnchanged();
  assert.ok(outcomes.size > 0, JSON.stringify([...outcomes]));
});

test('state: a directory exchanged with a symlink to a root-only host directory never lists host names', async () => {
  const [dir, link] = await pair('race-state');
  const swapper = await startSwapper(dir, link);
  try {
    for (let i = 0; i < 150; i++) {
      const { files } = await captureState(ws);
      for (const [rel, entry] of Object.entries(files)) {
        assert.ok(!rel.includes(MARKER) && !rel.endsWith('/victim'), `host file listed: ${rel}`);
        if (rel.startsWith('race-state')) assert.ok(entry.symlink === host || rel.endsWith('/inside.txt'), `${rel}: ${JSON.stringify(entry)}`);
      }
    }
  } finally {
    await swapper.stop();
  }
});

const haveInotify = (() => {
  try {
    execFileSync('inotifywait', ['--help'], { stdio: 'ignore' });
    return true;
  } catch (err) {
    return (err as { status?: number }).status !== undefined;
  }
})();

/** New directories each swapped for a symlink to the host directory right after their creation, while the host directory is busy. */
const NEW_DIR_RACE = `
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
ws, host, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
for i in range(rounds):
    d, l = os.path.join(ws, 'n%d' % i), os.path.join(ws, 'l%d' % i)
    os.mkdir(d)
    os.symlink(host, l)
    libc.renameat2(-100, d.encode(), -100, l.encode(), 2)
    with open(os.path.join(host, 'busy-%d' % (i % 5)), 'w') as f:
        f.write('host activity')
`;

test('audit watcher: new directories swapped for a host symlink never yield host names', {
  skip: haveInotify ? false : 'inotifywait (inotify-tools) is not installed',
}, async () => {
  const log = new AuditLog({ workspace: ws, sandboxId: 'sb-race' });
  const w = new FsWatcher({ workspace: ws, watch: ['/'], track: ['writes', 'reads', 'deletes'], audit: log });
  await w.start();
  try {
    await new Promise<void>((resolve, reject) => {
      const child = spawn('python3', ['-c', NEW_DIR_RACE, ws, host, '400'], { stdio: 'inherit' });
      child.once('exit', (code) => (code === 0 ? resolve() : reject(new Error(`race script exited ${code}`))));
    });
    // Host activity after the race: a watch left on the host directory would report it.
    for (let i = 0; i < 5; i++) await writeHost(path.join(host, `busy-${i}`), 'later');
  } finally {
    await w.stop();
    await log.close();
  }
  const records = await AuditLog.read(ws);
  for (const r of records) {
    const text = JSON.stringify(r.details);
    assert.ok(!text.includes(MARKER) && !text.includes('busy-') && !text.includes('victim'), `host name in the audit log: ${text}`);
  }
  for (const f of await readdir(host)) if (f.startsWith('busy-')) await rm(path.join(host, f));
  await hostUnchanged();
});

test('removeBeneath: a workspace removed while its directories are exchanged with a host symlink never deletes host files', async () => {
  for (let i = 0; i < 40; i++) {
    const box = await realpath(await mkdtemp(path.join(os.tmpdir(), 'ws-remove-')));
    const dir = path.join(box, 'd');
    await mkdir(path.join(dir, 'deep', 'er'), { recursive: true });
    for (const f of ['victim', MARKER, 'a', 'b']) await writeHost(path.join(dir, f), 'agent');
    await writeHost(path.join(dir, 'deep', 'er', 'victim'), 'agent');
    await symlink(host, path.join(box, 'd-link'));
    const swapper = await startSwapper(dir, path.join(box, 'd-link'));
    try {
      removeBeneath(box);
    } catch (err) {
      // A name changing kind under it may make a call fail; it must never follow the link.
      assert.ok((err as NodeJS.ErrnoException).code, String(err));
    } finally {
      await swapper.stop();
    }
    await hostUnchanged();
    await rm(box, { recursive: true, force: true });
  }
  // Without a race it removes everything, the root included.
  const box = await mkdtemp(path.join(os.tmpdir(), 'ws-remove-'));
  await mkdir(path.join(box, 'a', 'b', 'c'), { recursive: true });
  await writeHost(path.join(box, 'a', 'b', 'c', 'f'), 'x');
  await symlink(host, path.join(box, 'a', 'to-host'));
  assert.equal(removeBeneath(box), 0);
  await assert.rejects(readdir(box), /ENOENT/);
  await hostUnchanged();
});

// A task-file bundle copied into a workspace the agent has been in (grader bundles come after it):
// every link it planted where the bundle's names go is a way out that the copy must not take, and
// the removal after the checks must not follow one either.
test('copyTreeIn never writes through a planted link out of the workspace; removeTree removes a link, not what it points at', async () => {
  const root = await mkdtemp(path.join(os.tmpdir(), 'svc-copytree-'));
  try {
    const workspace = path.join(root, 'ws');
    const outside = path.join(root, 'outside');
    const bundle = path.join(root, 'bundle');
    await mkdir(path.join(bundle, 'gt'), { recursive: true });
    await mkdir(workspace);
    await mkdir(outside);
    await writeHost(path.join(bundle, 'gt', 'secret.txt'), 'grader\n');
    await writeHost(path.join(outside, 'keep.txt'), 'host\n');
    // Planted: the bundle's top directory, and the `to` directory, as links out.
    await symlink(outside, path.join(workspace, 'gt'));
    await symlink(outside, path.join(workspace, 'to'));
    await assert.rejects(
      copyTreeIn(workspace, bundle, '', { field: 'grader.bundles[0].to' }),
      (err: unknown) => err instanceof AppError && /grader\.bundles\[0\]\.to/.test(err.message),
    );
    await assert.rejects(copyTreeIn(workspace, bundle, 'to', { field: 'grader.bundles[0].to' }), (err: unknown) => err instanceof AppError);
    assert.deepEqual((await readdir(outside)).sort(), ['keep.txt'], 'nothing was written outside');
    // After the checks: the names are removed as they are, links included; the host directory stays.
    await removeTree(workspace, 'gt', { field: 'grader.bundles' });
    await removeTree(workspace, 'to', { field: 'grader.bundles' });
    assert.deepEqual(await readdir(workspace), []);
    assert.equal(await readHost(path.join(outside, 'keep.txt'), 'utf8'), 'host\n');
    // Without planted links the copy lands, modes and all.
    const written = await copyTreeIn(workspace, bundle, 'task', { field: 'setup.bundles[0].to' });
    assert.deepEqual(written, ['task/gt']);
    assert.equal(await readHost(path.join(workspace, 'task', 'gt', 'secret.txt'), 'utf8'), 'grader\n');
  } finally {
    await rm(root, { recursive: true, force: true });
  }
});
