/**
 * A writable root as the file audit sees it (workspace/layer-state.ts): over an image, the state
 * of a real overlayfs (mounted here, as root) is its upper directory with its whiteouts plus the image's
 * files a whiteout, a file or an opaque directory hides, so its diff against an earlier state has
 * every deletion of the image's files, file by file, and never follows the image's links. Needs
 * root; how `/` is named among the places is in test/unit/workspace-places.test.ts.
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';
import { captureLayer } from '../../services/sandbox-runner/workspace/layer-state.ts';
import { diffStates } from '../../services/sandbox-runner/workspace/state.ts';

const asRoot = process.getuid?.() === 0 ? false : 'mounting an overlay needs root';

test("an overlay's state: writes, whiteouts, removed and remade directories of the image, links never followed", { skip: asRoot }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'layer-'));
  const [lower, upper, work, merged] = ['lower', 'upper', 'work', 'merged'].map((d) => path.join(dir, d)) as [string, string, string, string];
  for (const d of [lower, upper, work, merged]) fs.mkdirSync(d);
  const put = (rel: string, text: string) => {
    fs.mkdirSync(path.dirname(path.join(lower, rel)), { recursive: true });
    fs.writeFileSync(path.join(lower, rel), text);
  };
  put('etc/passwd', 'root\n');
  put('etc/kept', 'kept\n');
  put('etc/tree/sub/leaf', 'leaf\n');
  put('etc/remade/old', 'old\n');
  put('usr/lib/a.so', 'a\n');
  // The image's links lead to the host: never followed.
  fs.symlinkSync('/', path.join(lower, 'etc/host-root'));
  fs.symlinkSync('/etc', path.join(lower, 'usr/etc-link'));
  execFileSync('mount', ['-t', 'overlay', 'overlay', '-o', `lowerdir=${lower},upperdir=${upper},workdir=${work}`, merged]);
  try {
    const layer = { upper, lower, merged };
    const before = await captureLayer(layer);
    assert.deepEqual(before.files, {}, 'nothing written yet');
    const m = (rel: string) => path.join(merged, rel);
    fs.appendFileSync(m('etc/kept'), 'more\n');
    fs.writeFileSync(m('etc/new'), 'new\n');
    fs.rmSync(m('etc/passwd'));
    fs.rmSync(m('etc/tree'), { recursive: true });
    fs.rmSync(m('etc/remade'), { recursive: true });
    fs.mkdirSync(m('etc/remade'));
    fs.writeFileSync(m('etc/remade/fresh'), 'fresh\n');
    fs.rmSync(m('etc/host-root'));
    fs.rmSync(m('usr/etc-link'));
    fs.writeFileSync(m('usr/etc-link'), 'a file now\n');
    const after = await captureLayer(layer);
    assert.deepEqual(diffStates(before, after), {
      added: ['etc/kept', 'etc/new', 'etc/remade/fresh', 'usr/etc-link'],
      modified: [],
      // the image's files changed or made are in the layer, `added`; a whiteout is a removal, of the directory too
      removed: ['etc/host-root', 'etc/passwd', 'etc/remade/old', 'etc/tree', 'etc/tree/sub/leaf'],
    });
    assert.ok(!Object.keys(after.files).some((p) => p.startsWith('etc/host-root/') || p.startsWith('usr/etc-link/')), 'no name behind a link');
    // Nothing changed since: an empty diff (what was hidden before stays hidden).
    assert.deepEqual(diffStates(after, await captureLayer(layer)), { added: [], modified: [], removed: [] });
    // Without the merged view (a sandbox already gone) a remade directory is not taken for opaque, and nothing else is lost.
    const blind = await captureLayer({ upper, lower, merged: path.join(dir, 'gone') });
    assert.ok(!('etc/remade/old' in blind.files) && 'etc/tree/sub/leaf' in blind.files, JSON.stringify(blind.files));
  } finally {
    execFileSync('umount', [merged]);
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
