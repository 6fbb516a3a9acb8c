/**
 * A test that starts a process owns its end: when the runner cancels a test file at its timeout,
 * the processes it started do not outlive the run. The owned one is stopped by the file itself
 * (test/helpers/owned-processes.ts), the stray daemon by test/run.mjs, which finds it by the run's
 * SVC_TEST_RUN mark and says so. The file under test is test/fixtures/cancelled-with-children.ts.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

// Not from helpers/server.ts: importing it would make `npm test` start Kafka for this file.
const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');

/** Whether `pid` is a live process (a zombie is not: it has ended, only its parent has not looked). */
function alive(pid: number): boolean {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2)[0] !== 'Z';
  } catch {
    return false;
  }
}

/** Pids of live processes whose environment holds `entry` (NAME=value). */
function carrying(entry: string): number[] {
  return fs
    .readdirSync('/proc')
    .filter((p) => /^\d+$/.test(p))
    .filter((p) => {
      try {
        return fs.readFileSync(`/proc/${p}/environ`, 'latin1').split('\0').includes(entry);
      } catch {
        return false;
      }
    })
    .map(Number);
}

test('a test file cancelled at its timeout leaves no process running after the run', { skip: process.platform !== 'linux' && 'reads /proc' }, async () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'svc-ownership-'));
  const probe = path.join(dir, 'probe.json');
  try {
    const run = spawn(
      process.execPath,
      [path.join(REPO, 'test', 'run.mjs'), '--test-timeout=3000', '--test-reporter=tap', path.join(REPO, 'test', 'fixtures', 'cancelled-with-children.ts')],
      {
        cwd: REPO,
        // Without NODE_TEST_CONTEXT: the nested runner would take itself for a test file and run nothing.
        env: { ...Object.fromEntries(Object.entries(process.env).filter(([name]) => name !== 'NODE_TEST_CONTEXT')), OWNERSHIP_PROBE: probe, CI: '' },
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    let output = '';
    run.stdout!.on('data', (d) => (output += d));
    run.stderr!.on('data', (d) => (output += d));
    const code = await new Promise((resolve) => run.once('exit', resolve));
    assert.notEqual(code, 0, `the fixture's test is cancelled, so the run fails:\n${output}`);
    const { mark, owned, stray } = JSON.parse(fs.readFileSync(probe, 'utf8'));
    assert.ok(mark && owned && stray, `the fixture ran under a marked run and started both: ${JSON.stringify({ mark, owned, stray })}`);

    assert.equal(alive(owned), false, `the owned process ${owned} outlived the run:\n${output}`);
    assert.equal(alive(stray), false, `the detached process ${stray} outlived the run:\n${output}`);
    assert.deepEqual(carrying(`SVC_TEST_RUN=${mark}`), [], "nothing carries the run's mark");
    // The file stopped its own process; only the one no helper knew about was left for the run.
    assert.match(output, new RegExp(`^  ${stray} `, 'm'), `the run names the process it stopped:\n${output}`);
    assert.doesNotMatch(output, new RegExp(`^  ${owned} `, 'm'), `the owned process was stopped by its file, not by the run:\n${output}`);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});
