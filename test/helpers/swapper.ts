/**
 * A racing agent for filesystem tests: a python3 child that swaps two names as fast as it can
 * with renameat2(RENAME_EXCHANGE), so a directory and a symlink trade places atomically over and
 * over (what an agent inside a sandbox can do to the service's host-side walks).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { own } from './owned-processes.ts';

const EXCHANGE_LOOP = `
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
AT_FDCWD, RENAME_EXCHANGE = -100, 2
a, b = sys.argv[1].encode(), sys.argv[2].encode()
sys.stdout.write('ready\\n'); sys.stdout.flush()
while True:
    if libc.renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) != 0:
        sys.exit('renameat2: ' + os.strerror(ctypes.get_errno()))
`;

export interface Swapper {
  /** Stops the loop; leaves the two names in whichever state the last swap left them. */
  stop(): Promise<void>;
}

/** Starts swapping `a` and `b` (both must exist); resolves once the loop runs. */
export async function startSwapper(a: string, b: string): Promise<Swapper> {
  const child: ChildProcess = own(spawn('python3', ['-c', EXCHANGE_LOOP, a, b], { stdio: ['ignore', 'pipe', 'pipe'] }));
  let stderr = '';
  child.stderr!.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  await new Promise<void>((resolve, reject) => {
    child.stdout!.once('data', () => resolve());
    child.once('exit', (code) => reject(new Error(`swapper exited (${code}): ${stderr}`)));
  });
  return {
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await exited;
    },
  };
}
