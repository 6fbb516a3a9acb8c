import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { chmod, mkdir, mkdtemp, rm, symlink, utimes, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { captureState, ChecksumCache, diffStates, type FilesystemState } from '../../services/sandbox-runner/workspace/state.ts';

let ws: string;
const sha = (s: string | Buffer) => createHash('sha256').update(s).digest('hex');
const put = async (rel: string, content: string | Buffer, mode = 0o644) => {
  await mkdir(path.dirname(path.join(ws, rel)), { recursive: true });
  await writeFile(path.join(ws, rel), content);
  await chmod(path.join(ws, rel), mode);
};

before(async () => {
  ws = await mkdtemp(path.join(os.tmpdir(), 'ws-state-'));
  await put('a.txt', 'hello');
  await put('src/main.py', 'print(1)\n', 0o755);
  await put('node_modules/x/index.js', 'skip');
  await put('deep/.git/HEAD', 'skip');
  await put('deep/pkg/__pycache__/m.pyc', 'skip');
  await put('.svc/audit.jsonl', 'skip');
  await put('deep/pkg/node_modules/y.js', 'skip');
  await put('deep/.gitkeep', '');
  await put('big.bin', Buffer.alloc(1024 * 1024 + 1, 1));
  await put('exact.bin', Buffer.alloc(1024 * 1024, 2));
  await symlink('a.txt', path.join(ws, 'link'));
  await symlink('/etc', path.join(ws, 'etc-link'));
});
after(() => rm(ws, { recursive: true, force: true }));

test('state lists files with size, octal mode and sha256; skips service and tool directories', async () => {
  const s = await captureState(ws);
  assert.match(s.captured_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
  assert.deepEqual(Object.keys(s.files), ['a.txt', 'big.bin', 'deep/.gitkeep', 'etc-link', 'exact.bin', 'link', 'src/main.py']);
  assert.deepEqual(s.files['a.txt'], { size: 5, mode: '0644', checksum: sha('hello') });
  assert.deepEqual(s.files['src/main.py'], { size: 9, mode: '0755', checksum: sha('print(1)\n') });
  assert.deepEqual(s.files['deep/.gitkeep'], { size: 0, mode: '0644', checksum: sha('') });
});

test('files over 1 MiB keep size and mode but get no checksum; the limit is a setting', async () => {
  const s = await captureState(ws);
  assert.deepEqual(s.files['big.bin'], { size: 1024 * 1024 + 1, mode: '0644' });
  assert.equal(s.files['exact.bin']!.checksum, sha(Buffer.alloc(1024 * 1024, 2)));
  const small = await captureState(ws, { checksumMaxBytes: 4 });
  assert.equal(small.files['a.txt']!.checksum, undefined);
  assert.equal(small.files['deep/.gitkeep']!.checksum, sha(''));
});

test('symlinks are recorded, not followed', async () => {
  const s = await captureState(ws);
  assert.deepEqual(s.files.link, { size: 5, mode: s.files.link!.mode, checksum: sha('a.txt'), symlink: 'a.txt' });
  assert.equal(s.files['etc-link']!.symlink, '/etc');
  assert.ok(!Object.keys(s.files).some((k) => k.startsWith('etc-link/')));
});

test('the cache re-hashes only changed files', async () => {
  const cache = new ChecksumCache();
  const old = new Date(Date.now() - 60_000);
  const s1 = await captureState(ws, { cache, racyMs: 0 });
  assert.equal(cache.lastHashed, 4); // the regular files of 1 MiB or less
  const s2 = await captureState(ws, { cache, racyMs: 0 });
  assert.equal(cache.lastHashed, 0);
  assert.deepEqual(s2.files, s1.files);
  await writeFile(path.join(ws, 'a.txt'), 'HELLO'); // same size, new content
  await utimes(path.join(ws, 'a.txt'), old, old); // mtime set back: ctime still changes
  const s3 = await captureState(ws, { cache, racyMs: 0 });
  assert.equal(cache.lastHashed, 1);
  assert.equal(s3.files['a.txt']!.checksum, sha('HELLO'));
  assert.deepEqual(diffStates(s2, s3), { added: [], modified: ['a.txt'], removed: [] });
});

test('recently changed files are not trusted from the cache (racy window)', async () => {
  const cache = new ChecksumCache();
  await writeFile(path.join(ws, 'fresh.txt'), 'one');
  await captureState(ws, { cache, racyMs: 60_000 });
  await captureState(ws, { cache, racyMs: 60_000 });
  assert.ok(cache.lastHashed >= 1);
  await rm(path.join(ws, 'fresh.txt'));
});

test('diff: added, modified, removed, sorted; by checksum, else size and mode', () => {
  const st = (files: FilesystemState['files']): FilesystemState => ({ captured_at: '', files });
  const before = st({
    'same.txt': { size: 1, mode: '0644', checksum: 'a' },
    'changed.txt': { size: 1, mode: '0644', checksum: 'a' },
    'chmod-only.txt': { size: 1, mode: '0644', checksum: 'a' },
    'gone.txt': { size: 1, mode: '0644', checksum: 'a' },
    'big-same.bin': { size: 2e6, mode: '0644' },
    'big-grown.bin': { size: 2e6, mode: '0644' },
    'big-chmod.bin': { size: 2e6, mode: '0644' },
    'z/was-file': { size: 1, mode: '0644', checksum: 'x' },
    'a/gone2.txt': { size: 1, mode: '0644', checksum: 'a' },
  });
  const after = st({
    'same.txt': { size: 1, mode: '0644', checksum: 'a' },
    'changed.txt': { size: 1, mode: '0644', checksum: 'b' },
    'chmod-only.txt': { size: 1, mode: '0755', checksum: 'a' },
    'big-same.bin': { size: 2e6, mode: '0644' },
    'big-grown.bin': { size: 3e6, mode: '0644' },
    'big-chmod.bin': { size: 2e6, mode: '0755' },
    'z/was-file': { size: 1, mode: '0777', checksum: 'x', symlink: 'y' },
    'new.txt': { size: 0, mode: '0644', checksum: 'c' },
    'b/new.txt': { size: 0, mode: '0644', checksum: 'c' },
  });
  assert.deepEqual(diffStates(before, after), {
    added: ['b/new.txt', 'new.txt'],
    modified: ['big-chmod.bin', 'big-grown.bin', 'changed.txt', 'z/was-file'],
    removed: ['a/gone2.txt', 'gone.txt'],
  });
});

test('diff of real captures', async () => {
  const before = await captureState(ws);
  await put('src/new.ts', 'x');
  await writeFile(path.join(ws, 'src/main.py'), 'print(2)\n');
  await rm(path.join(ws, 'deep/.gitkeep'));
  await put('node_modules/ignored.js', 'x');
  assert.deepEqual(diffStates(before, await captureState(ws)), { added: ['src/new.ts'], modified: ['src/main.py'], removed: ['deep/.gitkeep'] });
});
