/**
 * `determinism.frozen_time`: libfaketime, preloaded into every process of the sandbox, shares a
 * start time between processes through a semaphore and a shared memory object in /dev/shm
 * (FAKETIME_SHARED names them). Left to itself, every command's first process made a pair named
 * after its pid, left behind when it exec'd or was killed: files in the agent's /dev/shm that the
 * audit counted as the agent's writes. Here one process makes the pair, renames it to known names
 * (mv without the preload) and dies by SIGKILL so its library does not remove it: every later
 * process only attaches, writes nothing, and reads a clock that runs on from the same start.
 *
 * The sandbox's clock is made at boot. Its files are in the agent's /dev/shm, so the agent can
 * rewrite it: each check gets a clock of its own, under names made for it after the agent's
 * processes are gone.
 */
import { randomBytes } from 'node:crypto';
import { rmSync } from 'node:fs';
import path from 'node:path';
import type { ExecResult, SandboxHandle } from './runtimes/runtime.ts';

/** libfaketime, preloaded for a frozen clock (Debian's path; bound into the sandbox read-only). */
export const LIBFAKETIME = '/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1';

interface ClockNames {
  sem: string;
  shm: string;
}

const SANDBOX_CLOCK: ClockNames = { sem: 'svc-clock-sem', shm: 'svc-clock-shm' };

/** FAKETIME_SHARED: the names of a clock's semaphore and shared memory. */
const shared = (names: ClockNames) => `/${names.sem} /${names.shm}`;

/** The files of a clock in /dev/shm (glibc names a semaphore's file `sem.<name>`). */
const files = (names: ClockNames) => [`sem.${names.sem}`, names.shm] as const;

/** Run with FAKETIME_SHARED naming a clock not made yet: its shell makes the pair, they are renamed to the names, and it dies keeping them. */
const makeCommand = (names: ClockNames) => {
  const [sem, shm] = files(names);
  return `LD_PRELOAD= mv -f "/dev/shm/sem.faketime_sem_$$" /dev/shm/${sem} && LD_PRELOAD= mv -f "/dev/shm/faketime_shm_$$" /dev/shm/${shm} && kill -KILL $$; exit 3`;
};

/** The variables of a frozen clock at `frozenTime` (ISO 8601), shared by the sandbox's processes. */
export function frozenClockEnv(frozenTime: string): Record<string, string> {
  return {
    LD_PRELOAD: LIBFAKETIME,
    FAKETIME: `@${frozenTime.replace('T', ' ').replace(/\.\d+Z$|Z$/, '')}`,
    FAKETIME_DONT_RESET: '1',
    FAKETIME_SHARED: shared(SANDBOX_CLOCK),
    TZ: 'UTC',
  };
}

/** Makes a clock starting now under `names`; true when it was made (its shell died by SIGKILL, as asked). */
async function make(box: SandboxHandle, names: ClockNames): Promise<{ made: boolean; result: ExecResult }> {
  const result = await box.exec({ command: makeCommand(names), env: { FAKETIME_SHARED: shared(names) }, timeoutMs: 30_000 });
  return { made: result.exitCode === 128 + 9, result };
}

/** The sandbox's clock, made before anything runs in it; `result` says why not when it could not be. */
export function makeSandboxClock(box: SandboxHandle): Promise<{ made: boolean; result: ExecResult }> {
  return make(box, SANDBOX_CLOCK);
}

/**
 * A check's own clock, under names no one knew before (when it could not be made, the check's
 * processes make one of their own). `remove` deletes its files; whatever a check that runs the
 * agent's code put at those names (a directory, say) goes too: the agent's own tmpfs, never
 * followed through a link.
 */
export async function makeCheckClock(box: SandboxHandle): Promise<{ env: Record<string, string>; remove(): void }> {
  const hex = randomBytes(8).toString('hex');
  const names = { sem: `svc-check-clock-${hex}-sem`, shm: `svc-check-clock-${hex}-shm` };
  const dir = box.writablePlaces.find((place) => place.at === '/dev/shm')?.host;
  const remove = () => {
    if (dir) for (const file of files(names)) rmSync(path.join(dir, file), { force: true, recursive: true });
  };
  if (!(await make(box, names)).made) remove();
  return { env: { FAKETIME_SHARED: shared(names) }, remove };
}
