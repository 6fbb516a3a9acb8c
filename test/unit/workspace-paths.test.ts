import assert from 'node:assert/strict';
import { mkdir, mkdtemp, realpath, rm, symlink, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { AppError } from '../../services/kernel/errors.ts';
import { resolveRealPath, resolveWorkspacePath } from '../../services/sandbox-runner/workspace/paths.ts';

let ws: string;
let outside: string;
before(async () => {
  ws = await realpath(await mkdtemp(path.join(os.tmpdir(), 'ws-paths-')));
  outside = await realpath(await mkdtemp(path.join(os.tmpdir(), 'ws-outside-')));
  await mkdir(path.join(ws, 'dir'));
  await writeFile(path.join(ws, 'dir', 'a.txt'), 'a');
  await writeFile(path.join(outside, 'secret'), 's');
  await symlink(outside, path.join(ws, 'out')); // host absolute, outside
  await symlink('/etc', path.join(ws, 'etc')); // sandbox-absolute, outside
  await symlink('/workspace/dir', path.join(ws, 'indir')); // sandbox-absolute, inside
  await symlink('../..', path.join(ws, 'dir', 'up')); // relative, escapes
  await symlink('a.txt', path.join(ws, 'dir', 'alias')); // relative, inside
  await symlink('.svc', path.join(ws, 'svclink'));
});
after(async () => {
  await rm(ws, { recursive: true, force: true });
  await rm(outside, { recursive: true, force: true });
});

function is400(field: string, re?: RegExp) {
  return (err: unknown) => {
    assert.ok(err instanceof AppError, String(err));
    assert.equal(err.status, 400);
    assert.ok(err.message.startsWith(`${field}: `), err.message);
    if (re) assert.match(err.message, re);
    return true;
  };
}

test('/workspace/foo.txt and foo.txt are the same file', () => {
  const a = resolveWorkspacePath('/ws', '/workspace/foo.txt');
  const b = resolveWorkspacePath('/ws', 'foo.txt');
  assert.deepEqual(a, b);
  assert.deepEqual(a, { relative: 'foo.txt', absolute: '/ws/foo.txt' });
  assert.equal(resolveWorkspacePath('/ws', './a//b/./c').relative, 'a/b/c');
  assert.equal(resolveWorkspacePath('/ws', '/workspace/a/b/').relative, 'a/b');
});

test('bad inputs are 400 naming the field', () => {
  const cases: [unknown, RegExp][] = [
    ['', /empty/],
    [42, /string/],
    [null, /string/],
    [undefined, /string/],
    ['a\0b', /NUL/],
    ['/etc/passwd', /workspace/],
    ['/workspacefoo', /workspace/],
    ['/workspace', /workspace itself/],
    ['/workspace/', /workspace itself/],
    ['.', /workspace itself/],
    ['..', /\.\./],
    ['../x', /\.\./],
    ['a/../b', /\.\./],
    ['/workspace/../etc/passwd', /\.\./],
    ['a/..', /\.\./],
    ['x'.repeat(256), /255/],
    ['a/'.repeat(2100), /4096/],
  ];
  for (const [input, re] of cases) assert.throws(() => resolveWorkspacePath('/ws', input, 'body.path'), is400('body.path', re), JSON.stringify(input));
  assert.throws(() => resolveWorkspacePath('/ws', ''), is400('path'));
});

test('a name with dots that is not a .. segment is fine', () => {
  assert.equal(resolveWorkspacePath('/ws', 'a..b/..c/c..').relative, 'a..b/..c/c..');
});

test('symlinks: inside targets resolve (sandbox view), escapes are 400', async () => {
  const r = await resolveRealPath(ws, '/workspace/indir/a.txt');
  assert.equal(r.relative, 'indir/a.txt');
  assert.equal(r.realRelative, 'dir/a.txt');
  assert.equal(r.real, path.join(ws, 'dir', 'a.txt'));
  assert.equal((await resolveRealPath(ws, 'dir/alias')).realRelative, 'dir/a.txt');
  assert.equal((await resolveRealPath(ws, 'dir/alias', 'path', { followFinal: false })).realRelative, 'dir/alias');
  assert.equal((await resolveRealPath(ws, 'new/dir/file')).realRelative, 'new/dir/file');
  await assert.rejects(resolveRealPath(ws, 'out/secret', 'path'), is400('path', /outside/));
  await assert.rejects(resolveRealPath(ws, 'out/new-file', 'path'), is400('path', /outside/));
  await assert.rejects(resolveRealPath(ws, 'etc/passwd', 'f'), is400('f', /outside/));
  await assert.rejects(resolveRealPath(ws, 'dir/up/x', 'path'), is400('path', /outside/));
  await assert.rejects(resolveRealPath(ws, 'out'), is400('path', /outside/));
});

test('.svc may be read but not written, also through a symlink', async () => {
  assert.equal((await resolveRealPath(ws, '.svc/audit.jsonl')).realRelative, '.svc/audit.jsonl');
  for (const p of ['.svc/audit.jsonl', '/workspace/.svc/x', '.svc', 'svclink/audit.jsonl']) {
    await assert.rejects(resolveRealPath(ws, p, 'path', { forWrite: true }), (err: unknown) => {
      assert.ok(err instanceof AppError);
      assert.equal(err.status, 403);
      assert.equal(err.code, 'forbidden');
      assert.match(err.message, /^path: /);
      return true;
    });
  }
  // A file merely named like it is fine.
  assert.equal((await resolveRealPath(ws, 'dir/.svc', 'path', { forWrite: true })).realRelative, 'dir/.svc');
});
