/**
 * A writable root as the file audit sees it (workspace/places.ts): `/` is a place under the
 * others, named by absolute paths. The state of an overlay over an image is in
 * test/isolation/workspace-layer-state.test.ts (it mounts one, as root).
 */
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';
import { underPrefix, WritablePlaces } from '../../services/sandbox-runner/workspace/places.ts';

test('a root place: names are absolute paths, the deepest place wins, / watches every place', async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'places-'));
  try {
    for (const d of ['ws', 'tmp', 'layer']) fs.mkdirSync(path.join(dir, d));
    const view = await WritablePlaces.of(path.join(dir, 'ws'), [
      { at: '/', host: path.join(dir, 'layer') },
      { at: '/tmp', host: path.join(dir, 'tmp') },
    ]);
    assert.equal(view.nameOf(path.join(dir, 'layer', 'etc/x')), '/etc/x');
    assert.equal(view.nameOf(path.join(dir, 'tmp', 'a')), '/tmp/a');
    assert.equal(view.nameOf(path.join(dir, 'layer')), null);
    assert.deepEqual(view.locate('/etc/x'), { root: path.join(dir, 'layer'), rel: 'etc/x' });
    assert.deepEqual(view.locate('/tmp/a'), { root: path.join(dir, 'tmp'), rel: 'a' });
    assert.deepEqual(view.locate('/'), { root: path.join(dir, 'layer'), rel: '' });
    assert.deepEqual(view.watchPrefixes('/etc', 'w'), ['/etc']);
    const all = view.watchPrefixes('/', 'w')!;
    for (const name of ['/etc/x', '/tmp/a', 'src/a.py'])
      assert.ok(
        all.some((p) => underPrefix(name, p)),
        name,
      );
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
