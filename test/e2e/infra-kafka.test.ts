/**
 * `node infra/kafka/kafka.mjs`, the broker an operator starts by hand from the checkout, writes
 * nothing into the checkout: the classpath cache, the broker's data and its logs go to the state
 * dir ($XDG_STATE_HOME/svc/kafka).
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';
// @ts-expect-error plain JS module without types
import { missingTools } from '../../infra/kafka/kafka.mjs';
import { REPO } from '../helpers/server.ts';

/** Every path under `dir` with its modification time, skipping what git ignores by rule of this repo. */
function snapshot(dir: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const entry of readdirSync(dir, { recursive: true }) as string[]) {
    if (entry.startsWith('node_modules') || entry.startsWith('.git')) continue;
    out.set(entry, statSync(path.join(dir, entry)).mtimeMs);
  }
  return out;
}

const lacking: string[] = missingTools();
const skip = lacking.length > 0 && process.env.CI !== 'true' ? `${lacking.join(' and ')} not on PATH (apt-get install default-jdk-headless maven)` : false;

test('a broker started by hand from the checkout writes into the state dir, never the checkout', { skip, timeout: 180_000 }, async () => {
  const state = mkdtempSync(path.join(os.tmpdir(), 'svc-state-'));
  const infra = path.join(REPO, 'infra', 'kafka');
  // The old by-hand location, in case an earlier version left one: it must not change either.
  const oldPlace = path.join(REPO, '.tmp');
  const look = () => ({ infra: snapshot(infra), oldPlace: existsSync(oldPlace) ? snapshot(oldPlace) : null });
  const before = look();
  try {
    const child = spawn(process.execPath, [path.join(infra, 'kafka.mjs')], {
      cwd: REPO,
      env: { ...process.env, XDG_STATE_HOME: state },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (out += d));
    const exited = new Promise((resolve) => child.once('exit', resolve));
    const deadline = Date.now() + 150_000;
    while (!/SVC_KAFKA_BROKERS=127\.0\.0\.1:\d+/.test(out)) {
      assert.equal(child.exitCode, null, `kafka.mjs exited:\n${out}`);
      assert.ok(Date.now() < deadline, `no broker within 150 s:\n${out}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    child.kill('SIGINT');
    await exited;

    const home = path.join(state, 'svc', 'kafka');
    assert.ok(existsSync(path.join(home, 'broker', 'data')), 'the broker data is in the state dir');
    assert.ok(existsSync(path.join(home, 'broker', 'logs')), 'and its logs');
    assert.ok(
      readdirSync(home).some((f) => /^classpath-[0-9a-f]+\.txt$/.test(f)),
      'and the classpath cache',
    );
    assert.deepEqual(look(), before, 'infra/kafka and .tmp are as they were');
  } finally {
    rmSync(state, { recursive: true, force: true });
  }
});
