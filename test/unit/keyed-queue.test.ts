/**
 * KeyedQueue (services/kernel/keyed-queue.ts): tasks of one key run one at a time in order, a
 * failure does not stop the next, keys do not wait for each other, and `settled` waits for all.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KeyedQueue } from '../../services/kernel/keyed-queue.ts';

const tick = () => new Promise((resolve) => setImmediate(resolve));

test('tasks of one key run in order, one at a time, past a failure', async () => {
  const queue = new KeyedQueue();
  const steps: string[] = [];
  const task =
    (name: string, fail = false) =>
    async () => {
      steps.push(`${name} start`);
      await tick();
      steps.push(`${name} end`);
      if (fail) throw new Error(name);
      return name;
    };
  const a = queue.run('k', task('a'));
  const b = queue.run('k', task('b', true));
  const c = queue.run('k', task('c'));
  assert.equal(await a, 'a');
  await assert.rejects(b, /^Error: b$/);
  assert.equal(await c, 'c');
  assert.deepEqual(steps, ['a start', 'a end', 'b start', 'b end', 'c start', 'c end']);
});

test('keys do not wait for each other', async () => {
  const queue = new KeyedQueue();
  let release!: () => void;
  const held = queue.run('a', () => new Promise<void>((resolve) => (release = resolve)));
  assert.equal(await queue.run('b', async () => 'b'), 'b');
  release();
  await held;
});

test('settled resolves once every task queued before it has finished', async () => {
  const queue = new KeyedQueue();
  const done: string[] = [];
  void queue.run('a', async () => {
    await tick();
    done.push('a');
  });
  void queue
    .run('b', async () => {
      await tick();
      await tick();
      throw new Error('b');
    })
    .catch(() => done.push('b'));
  await queue.settled();
  assert.deepEqual(done.sort(), ['a', 'b']);
  await queue.settled(); // nothing queued: at once
});
