// The launcher (services/sandbox-runner/runtimes/local/launcher.ts and .cjs) with real processes: what a
// launched process writes before its pipes reach the runner is the runner's, and an argument
// may name the pid of a process launched just before.
import assert from 'node:assert/strict';
import type { Readable } from 'node:stream';
import { after, describe, test } from 'node:test';
import { Launcher, type LaunchedProcess } from '../../services/sandbox-runner/runtimes/local/launcher.ts';

const launcher = new Launcher();
after(() => launcher.close());

/** Everything `p` writes on fd `fd` until it closes it. */
function readAll(p: LaunchedProcess, fd: number): Promise<string> {
  const stream = p.stdio[fd] as Readable;
  let text = '';
  stream.on('data', (chunk: Buffer) => (text += chunk.toString('utf8')));
  return new Promise((resolve, reject) => {
    stream.on('end', () => resolve(text));
    stream.on('error', reject);
  });
}

/** Holds this event loop for `ms`: the launcher's hand-over of the pipes waits for it. */
function hold(ms: number): void {
  const until = Date.now() + ms;
  while (Date.now() < until) {
    // busy
  }
}

describe('launcher', () => {
  test('what a process writes (and closes) before its pipes are handed over reaches the runner', async () => {
    for (let i = 0; i < 10; i++) {
      const p = launcher.launch('/bin/sh', ['-c', `echo early-err-${i} >&2; echo early-out-${i} >&4; exec 2>&- 4>&-; sleep 5`]);
      // The process writes while the runner is too busy to take its pipes.
      hold(50);
      await p.started;
      assert.deepEqual(await Promise.all([readAll(p, 2), readAll(p, 4)]), [`early-err-${i}\n`, `early-out-${i}\n`]);
      p.kill('SIGKILL');
    }
  });

  test('an argument that is a process launched before it stands for its pid', async () => {
    const first = launcher.launch('/bin/sleep', ['5']);
    const second = launcher.launch('/bin/sh', ['-c', 'echo "$0" >&4', first]);
    await Promise.all([first.started, second.started]);
    assert.equal(await readAll(second, 4), `${first.pid}\n`);
    first.kill('SIGKILL');
  });

  test('fd5 is written by the launcher as the process starts, and closed; the other pipes come as always', async () => {
    const big = 'x'.repeat(200_000);
    const p = launcher.launch('/bin/sh', ['-c', 'cat <&5 | wc -c >&4; echo done >&2'], { fd5: big });
    hold(50);
    await p.started;
    assert.equal(p.stdio[5], null);
    assert.deepEqual(await Promise.all([readAll(p, 4), readAll(p, 2)]), [`${big.length}\n`, 'done\n']);
  });

  test('naming a process that is not running fails the launch', async () => {
    const gone = launcher.launch('/bin/true', []);
    await new Promise((resolve) => gone.once('exit', resolve));
    const second = launcher.launch('/bin/echo', [gone]);
    second.on('error', () => {});
    await assert.rejects(second.started, /a process its arguments name is not running/);
  });
});
