/**
 * The workspace files API (workspace/files.ts) where it gives files away: what it writes and the
 * directories it makes belong to the owner of the root they are beneath, with exactly the mode
 * asked for. Needs root (chown); the API's other cases are in test/unit/workspace-files.test.ts.
 */
import assert from 'node:assert/strict';
import { chown, lstat, mkdtemp, readFile as readHost, realpath, rm, stat, symlink, writeFile as writeHost } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { makeDirectory, writeFile } from '../../services/sandbox-runner/workspace/files.ts';

// A host directory a planted link points at: what is made through the link must not touch it.
let outside: string;
before(async () => {
  outside = await realpath(await mkdtemp(path.join(os.tmpdir(), 'ws-outside-')));
  await writeHost(path.join(outside, 'target'), 'keep');
});
after(async () => {
  await rm(outside, { recursive: true, force: true });
});

const asRoot = { skip: process.getuid?.() !== 0 ? 'needs root (to give files away)' : false };
const SANDBOX_USER = { uid: 65534, gid: 65534 };

test('writes belong to the owner of the root they are written beneath, parents made on the way too, with exactly the mode asked for', asRoot, async () => {
  const root = await realpath(await mkdtemp(path.join(os.tmpdir(), 'ws-owned-')));
  try {
    await chown(root, SANDBOX_USER.uid, SANDBOX_USER.gid);
    await writeHost(path.join(root, 'old.txt'), 'the service wrote this as root before');
    const old = process.umask(0o077);
    try {
      await writeFile(root, 'deep/er/bin.dat', Buffer.from([0x00, 0x01, 0xff]), { mode: 0o777 });
      await writeFile(root, 'old.txt', "now the sandbox user's");
    } finally {
      process.umask(old);
    }
    const file = await stat(path.join(root, 'deep/er/bin.dat'));
    assert.deepEqual([file.uid, file.gid, file.mode & 0o7777], [65534, 65534, 0o777], '0777 stays 0777 whatever the umask');
    assert.deepEqual([...(await readHost(path.join(root, 'deep/er/bin.dat')))], [0x00, 0x01, 0xff], 'bytes as they are');
    for (const dir of ['deep', 'deep/er']) {
      const st = await stat(path.join(root, dir));
      assert.deepEqual([st.uid, st.gid, st.mode & 0o7777], [65534, 65534, 0o755], dir);
    }
    const rewritten = await stat(path.join(root, 'old.txt'));
    assert.deepEqual([rewritten.uid, rewritten.mode & 0o777], [65534, 0o644], 'a file rewritten changes hands');
    // An owner given wins over the root's.
    await writeFile(root, 'mine/own.txt', 'x', { owner: { uid: 0, gid: 0 } });
    assert.deepEqual([(await stat(path.join(root, 'mine/own.txt'))).uid, (await stat(path.join(root, 'mine'))).uid], [0, 0]);
  } finally {
    await rm(root, { recursive: true, force: true });
  }
});

test('makeDirectory: a new directory with exactly its mode and owner; a name already there (a link too) is refused, never followed', asRoot, async () => {
  const root = await realpath(await mkdtemp(path.join(os.tmpdir(), 'ws-dirs-')));
  try {
    const old = process.umask(0o077);
    try {
      assert.equal(makeDirectory(root, 'home', { mode: 0o755, owner: SANDBOX_USER }), path.join(root, 'home'));
    } finally {
      process.umask(old);
    }
    const st = await stat(path.join(root, 'home'));
    assert.deepEqual([st.uid, st.gid, st.mode & 0o7777], [65534, 65534, 0o755]);
    assert.throws(() => makeDirectory(root, 'home', { mode: 0o700 }), /exists already/);
    await symlink(outside, path.join(root, 'planted'));
    assert.throws(() => makeDirectory(root, 'planted', { mode: 0o700, owner: SANDBOX_USER }), /exists already/);
    assert.equal((await stat(outside)).uid, 0, "the link's target is untouched");
    assert.ok((await lstat(path.join(root, 'planted'))).isSymbolicLink());
  } finally {
    await rm(root, { recursive: true, force: true });
  }
});
