/** A drift fixture's `pick`: the run's seed chooses which changes apply, the same way every time. */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { seededPick } from '../../services/sandbox-runner/boot/fixtures.ts';

const changes = ['a', 'b', 'c', 'd', 'e', 'f'];

test('the same seed picks the same changes, in their listed order; other seeds pick otherwise', () => {
  const once = seededPick(changes, 3, 42);
  assert.deepEqual(seededPick(changes, 3, 42), once);
  assert.equal(once.length, 3);
  assert.deepEqual([...once].sort(), once, 'kept in their listed order');
  const picks = new Set(Array.from({ length: 50 }, (_, seed) => seededPick(changes, 3, seed).join('')));
  assert.ok(picks.size > 10, `50 seeds made only ${picks.size} different picks`);
  // Every change is picked by some seed: no change is left out by the generator.
  assert.deepEqual([...new Set([...picks].join(''))].sort(), changes);
});

test('a pick of as many as there are, or more, is all of them', () => {
  assert.deepEqual(seededPick(changes, 6, 7), changes);
  assert.deepEqual(seededPick(changes, 100, 7), changes);
  assert.deepEqual(seededPick([], 2, 7), []);
});
