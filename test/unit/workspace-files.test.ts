import assert from 'node:assert/strict';
import { lstat, mkdir, mkdtemp, readFile as readHost, realpath, rm, stat, symlink, writeFile as writeHost } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { AppError } from '../../services/kernel/errors.ts';
import { deleteFile, readFile, writeFile } from '../../services/sandbox-runner/workspace/files.ts';
import { resolveWorkspacePath } from '../../services/sandbox-runner/workspace/paths.ts';

let ws: string;
let outside: string;
before(async () => {
  ws = await realpath(await mkdtemp(path.join(os.tmpdir(), 'ws-files-')));
  outside = await realpath(await mkdtemp(path.join(os.tmpdir(), 'ws-outside-')));
  await writeHost(path.join(outside, 'target'), 'keep');
  await symlink(outside, path.join(ws, 'out'));
  await symlink(path.join(outside, 'target'), path.join(ws, 'outfile'));
  await mkdir(path.join(ws, '.svc'));
  await writeHost(path.join(ws, '.svc', 'audit.jsonl'), '{}\n');
});
after(async () => {
  await rm(ws, { recursive: true, force: true });
  await rm(outside, { recursive: true, force: true });
});

const status = (code: number, field?: string) => (err: unknown) => {
  assert.ok(err instanceof AppError, String(err));
  assert.equal(err.status, code, err.message);
  if (field) assert.ok(err.message.startsWith(`${field}: `), err.message);
  return true;
};

test('write creates parent directories, mode 0644 whatever the umask, and reports bytes', async () => {
  const old = process.umask(0o077);
  try {
    const r = await writeFile(ws, '/workspace/a/b/c/note.txt', 'héllo');
    assert.deepEqual(r, { path: 'a/b/c/note.txt', bytes: 6, created: true });
  } finally {
    process.umask(old);
  }
  const st = await stat(path.join(ws, 'a/b/c/note.txt'));
  assert.equal(st.mode & 0o777, 0o644);
  assert.equal(await readHost(path.join(ws, 'a/b/c/note.txt'), 'utf8'), 'héllo');
  const again = await writeFile(ws, 'a/b/c/note.txt', 'x');
  assert.deepEqual(again, { path: 'a/b/c/note.txt', bytes: 1, created: false });
  assert.equal(await readHost(path.join(ws, 'a/b/c/note.txt'), 'utf8'), 'x');
});

test('write resets the mode of an existing file to 0644', async () => {
  await writeHost(path.join(ws, 'exec.sh'), '#!/bin/sh', { mode: 0o755 });
  await writeFile(ws, 'exec.sh', 'echo');
  assert.equal((await stat(path.join(ws, 'exec.sh'))).mode & 0o777, 0o644);
});

test('read returns the bytes; read and write accept a resolveWorkspacePath result', async () => {
  await writeFile(ws, resolveWorkspacePath(ws, 'r.txt'), 'data');
  const r = await readFile(ws, resolveWorkspacePath(ws, '/workspace/r.txt'));
  assert.equal(r.path, 'r.txt');
  assert.equal(r.bytes, 4);
  assert.equal(r.content.toString(), 'data');
  assert.equal((await readFile(ws, '.svc/audit.jsonl')).content.toString(), '{}\n');
});

test('read: missing is 404, a directory is 400, too big is 413', async () => {
  await assert.rejects(readFile(ws, 'nope.txt'), status(404));
  await assert.rejects(readFile(ws, 'nodir/nope.txt'), status(404));
  await assert.rejects(readFile(ws, 'a'), status(400, 'path'));
  await assert.rejects(readFile(ws, 'r.txt', { maxBytes: 2 }), status(413));
});

test('delete removes the file and reports its size; missing is 404', async () => {
  await writeFile(ws, 'gone.txt', '12345');
  assert.deepEqual(await deleteFile(ws, '/workspace/gone.txt'), { path: 'gone.txt', bytes: 5 });
  await assert.rejects(lstat(path.join(ws, 'gone.txt')), /ENOENT/);
  await assert.rejects(deleteFile(ws, 'gone.txt'), (err: unknown) => err instanceof AppError && err.code === 'not_found');
  await assert.rejects(deleteFile(ws, 'a'), status(400, 'path'));
});

test('symlinks out of the workspace: no read, no write, no delete through them', async () => {
  await assert.rejects(readFile(ws, 'out/target'), status(400, 'path'));
  await assert.rejects(readFile(ws, 'outfile'), status(400, 'path'));
  await assert.rejects(writeFile(ws, 'outfile', 'pwned'), status(400, 'path'));
  await assert.rejects(writeFile(ws, 'out/new.txt', 'pwned'), status(400, 'path'));
  await assert.rejects(deleteFile(ws, 'out/target'), status(400, 'path'));
  assert.equal(await readHost(path.join(outside, 'target'), 'utf8'), 'keep');
  await assert.rejects(lstat(path.join(outside, 'new.txt')), /ENOENT/);
  // Deleting the link itself is fine: it removes the link, not its target.
  assert.equal((await deleteFile(ws, 'outfile')).path, 'outfile');
  assert.equal(await readHost(path.join(outside, 'target'), 'utf8'), 'keep');
});

test('symlinks inside the workspace are followed (sandbox-absolute targets too)', async () => {
  await mkdir(path.join(ws, 'real'));
  await symlink('/workspace/real', path.join(ws, 'link'));
  await writeFile(ws, 'link/f.txt', 'via link');
  assert.equal(await readHost(path.join(ws, 'real', 'f.txt'), 'utf8'), 'via link');
  assert.equal((await readFile(ws, 'link/f.txt')).content.toString(), 'via link');
});

test('.svc is read-only through the API (403), content must be a string', async () => {
  await assert.rejects(writeFile(ws, '.svc/audit.jsonl', ''), status(403, 'path'));
  await assert.rejects(deleteFile(ws, '/workspace/.svc/audit.jsonl'), status(403, 'path'));
  await assert.rejects(writeFile(ws, 'x.txt', 42), status(400, 'content'));
  await assert.rejects(writeFile(ws, '../x.txt', ''), status(400, 'path'));
  await assert.rejects(writeFile(ws, 'a', 'over a dir'), status(400, 'path'));
});
