/**
 * One process of a distributed deployment: `node services/main.ts run <services...>` as a child
 * process with the given environment (and nothing of the test's own SVC_* settings), its output
 * kept for assertions.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import path from 'node:path';
import { own } from './owned-processes.ts';
import { REPO } from './server.ts';

export interface SvcProcess {
  pid: number;
  output(): string;
  /** Exit code, or the signal, once the process has exited; null while it runs. */
  exit(): number | string | null;
  /** Resolves once the output matches; fails when the process exits first or after `ms`. */
  waitFor(pattern: RegExp, ms?: number): Promise<void>;
  /** Resolves with the exit code (or signal) once the process has exited; fails after `ms`. */
  exited(ms?: number): Promise<number | string>;
  /** SIGTERM, then waits for the exit. */
  stop(): Promise<number | string>;
  kill9(): Promise<void>;
}

export function runSvc(services: string[], env: Record<string, string>): SvcProcess {
  // SVC_TEST_RUN is not a setting: it marks the process as this test run's (test/run.mjs).
  const inherited = Object.fromEntries(Object.entries(process.env).filter(([name]) => !name.startsWith('SVC_') || name === 'SVC_TEST_RUN'));
  const child: ChildProcess = own(
    spawn(process.execPath, ['--import', 'tsx', path.join(REPO, 'services', 'main.ts'), 'run', ...services], {
      cwd: REPO,
      env: { ...inherited, SVC_LOG_LEVEL: 'info', SVC_TRACE_RETENTION: 'forever', ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    }),
  );
  let out = '';
  child.stdout!.on('data', (d) => (out += d));
  child.stderr!.on('data', (d) => (out += d));
  const exit = () => child.exitCode ?? child.signalCode;
  const exitPromise = new Promise<number | string>((resolve) => child.once('exit', (code, signal) => resolve(code ?? signal ?? -1)));
  const deadline = (ms: number, what: string) =>
    new Promise<never>((_, reject) => setTimeout(() => reject(new Error(`${what} within ${ms} ms; output:\n${out.slice(-4000)}`)), ms).unref());
  return {
    pid: child.pid!,
    output: () => out,
    exit,
    async waitFor(pattern, ms = 60_000) {
      const until = Date.now() + ms;
      while (!pattern.test(out)) {
        if (exit() !== null) throw new Error(`the process exited (${exit()}) before printing ${pattern}; output:\n${out.slice(-4000)}`);
        if (Date.now() > until) throw new Error(`no ${pattern} within ${ms} ms; output:\n${out.slice(-4000)}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    },
    exited: (ms = 60_000) => Promise.race([exitPromise, deadline(ms, 'the process did not exit')]),
    async stop() {
      if (exit() === null) child.kill('SIGTERM');
      return exitPromise;
    },
    async kill9() {
      if (exit() === null) child.kill('SIGKILL');
      await exitPromise;
    },
  };
}
