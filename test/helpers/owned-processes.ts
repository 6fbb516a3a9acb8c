/**
 * A test that starts a process owns its end. Helpers that start a long-lived process (the
 * service, its split deployment, a registry, dockerd, an outside server) register it with
 * `own(child)`; when the test file's process ends, every registered process still running is
 * stopped, whether the tests passed, failed or were cancelled:
 *
 * - SIGTERM or SIGINT to the file (the runner's per-file timeout, Ctrl-C): the teardowns registered
 *   with `onCancel` run (what is not a child process, such as a compose project), then SIGTERM to
 *   each, SIGKILL to those still up after a grace period (a service undoes its mounts and stops
 *   its own children on SIGTERM), then the file exits.
 * - any other exit: SIGKILL to each (an 'exit' listener cannot wait).
 *
 * What escapes (the children of a process killed with -9, a file killed with -9) test/run.mjs
 * stops when the run ends: every process of a run carries its SVC_TEST_RUN mark.
 */
import type { ChildProcess } from 'node:child_process';
import os from 'node:os';

/** How long owned processes get to stop after a SIGTERM before they are killed. */
const GRACE_MS = 10_000;

/** How long the `onCancel` teardowns get before the owned processes are stopped anyway. */
const TEARDOWN_MS = 120_000;

const owned = new Set<ChildProcess>();
const teardowns = new Set<() => Promise<unknown>>();
let listening = false;

const running = (child: ChildProcess) => child.exitCode === null && child.signalCode === null;

/** Registers `child` to be stopped when this process ends; returns it. */
export function own<T extends ChildProcess>(child: T): T {
  listen();
  owned.add(child);
  child.once('exit', () => owned.delete(child));
  return child;
}

/**
 * Registers `teardown` to run if the file is cancelled (SIGTERM, SIGINT) before it undoes what
 * it started itself; returns the function that unregisters it (call it once the file has).
 */
export function onCancel(teardown: () => Promise<unknown>): () => void {
  listen();
  teardowns.add(teardown);
  return () => teardowns.delete(teardown);
}

/** SIGTERM to every owned process still running, SIGKILL to those not gone after `graceMs`. */
async function stopOwned(graceMs = GRACE_MS): Promise<void> {
  const live = [...owned].filter(running);
  const gone = live.map((child) => new Promise((resolve) => (running(child) ? child.once('exit', resolve) : resolve(null))));
  for (const child of live) child.kill('SIGTERM');
  const timer = setTimeout(() => {
    for (const child of live.filter(running)) child.kill('SIGKILL');
  }, graceMs);
  await Promise.all(gone);
  clearTimeout(timer);
}

function listen(): void {
  if (listening) return;
  listening = true;
  process.on('exit', () => {
    for (const child of owned) if (running(child)) child.kill('SIGKILL');
  });
  for (const signal of ['SIGTERM', 'SIGINT', 'SIGHUP'] as const) {
    // Once: a second signal while the owned processes stop ends the file at once.
    process.once(signal, () => {
      const timeout = new Promise((resolve) => setTimeout(resolve, TEARDOWN_MS).unref());
      void Promise.race([Promise.allSettled([...teardowns].map((teardown) => teardown())), timeout])
        .then(() => stopOwned())
        .finally(() => process.exit(128 + os.constants.signals[signal]));
    });
  }
}
