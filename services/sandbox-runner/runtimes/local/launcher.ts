/**
 * Starts processes through the launcher child (launcher.cjs), so the service's own large
 * process never forks. A launched process looks like a ChildProcess to its user: the same
 * stdio pipes (fds 2-5), `exit` and `error` events, `kill`, `exitCode` and `signalCode`.
 */
import { fork, type ChildProcess } from 'node:child_process';
import { EventEmitter } from 'node:events';
import path from 'node:path';
import type { Readable, Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';

const SCRIPT = path.join(path.dirname(fileURLToPath(import.meta.url)), 'launcher.cjs');

export class LaunchedProcess extends EventEmitter {
  pid: number | undefined;
  exitCode: number | null = null;
  signalCode: NodeJS.Signals | null = null;
  readonly stdio: Array<Readable | Writable | null> = [null, null, null, null, null, null];
  /** Resolves once the process runs and its pipes (fds 2-5) are here; rejects when it could not start. */
  readonly started: Promise<void>;
  /** Settles `started` (the first call counts). */
  settle: (err?: Error) => void = () => {};

  constructor(
    private readonly launcher: Launcher,
    readonly id: number,
  ) {
    super();
    this.started = new Promise((resolve, reject) => {
      this.settle = (err) => {
        this.settle = () => {};
        if (err) reject(err);
        else resolve();
      };
    });
    this.started.catch(() => {});
  }

  kill(signal: NodeJS.Signals = 'SIGTERM'): boolean {
    this.launcher.send({ op: 'kill', id: this.id, signal });
    return true;
  }
}

type Message = {
  id: number;
  pid?: number;
  pipes?: number;
  fd?: number;
  exit?: { code: number | null; signal: NodeJS.Signals | null };
  error?: string;
  ran?: RunResult;
};

/** How a command started with `run` ended. */
export interface RunResult {
  code: number | null;
  signal: NodeJS.Signals | null;
  /** its last 4 KiB */
  stderr: string;
  /** its output (up to 4 MiB), when asked for with `stdout: true` */
  stdout: string;
}

export interface LaunchOptions {
  /** Written to the process's fd 5 by the launcher as it starts (then closed; fd 5 is not handed over): it need not wait for the round trip of its pipes. */
  fd5?: string;
}

export class Launcher {
  private child: ChildProcess | null = null;
  private readonly launched = new Map<number, { process: LaunchedProcess; fds: number; pipes: number }>();
  private readonly runs = new Map<number, (result: RunResult) => void>();
  private next = 0;

  private start(): ChildProcess {
    if (this.child?.connected) return this.child;
    const child = fork(SCRIPT, [], { stdio: ['ignore', 'inherit', 'inherit', 'ipc'], execArgv: [] });
    child.on('message', (m: Message, handle: unknown) => this.onMessage(m, handle as Readable & Writable));
    child.on('exit', (code, signal) => {
      // Unasked, it took with it the undos of the mounts it made (a runner killed later leaves them).
      if (this.child === child)
        process.stderr.write(`sandbox launcher ${child.pid} exited unexpectedly (${signal ?? `exit code ${code}`}); a new one starts with the next sandbox\n`);
      // Every process it launched is gone with it (parent-death signal).
      for (const [id, entry] of this.launched) {
        entry.process.settle(new Error('the launcher exited'));
        this.finish(id, { code: null, signal: 'SIGKILL' });
      }
      for (const [id, done] of this.runs) {
        this.runs.delete(id);
        done({ code: null, signal: 'SIGKILL', stderr: 'the launcher exited', stdout: '' });
      }
      if (this.child === child) this.child = null;
    });
    // Idle, the launcher must not keep the service's event loop alive; a spawn in flight must.
    child.unref();
    this.channel(child)?.unref();
    this.child = child;
    return child;
  }

  private channel(child: ChildProcess | null): { ref(): void; unref(): void } | undefined {
    return (child as unknown as { channel?: { ref(): void; unref(): void } } | null)?.channel;
  }

  private pending = 0;

  /** Starts the launcher now, so the first sandbox does not wait for it. */
  warm(): void {
    this.start();
  }

  send(message: object): void {
    this.child?.send(message);
  }

  /** Resolves once the process runs and its pipes (fds 2-5) are here. */
  async spawn(command: string, args: Array<string | LaunchedProcess>, options: LaunchOptions = {}): Promise<LaunchedProcess> {
    const launched = this.launch(command, args, options);
    await launched.started;
    return launched;
  }

  /**
   * Starts a process and returns it at once (`started` says when it runs). An argument that is
   * a process launched before it stands for that one's pid, filled in by the launcher: the two
   * start without waiting for each other's round trip.
   */
  launch(command: string, args: Array<string | LaunchedProcess>, options: LaunchOptions = {}): LaunchedProcess {
    const child = this.start();
    const launched = new LaunchedProcess(this, ++this.next);
    if (this.pending++ === 0) this.channel(child)?.ref();
    launched.started
      .finally(() => {
        if (--this.pending === 0) this.channel(this.child)?.unref();
      })
      .catch(() => {});
    this.launched.set(launched.id, { process: launched, fds: 0, pipes: 4 });
    child.send({ op: 'spawn', id: launched.id, command, args: args.map((a) => (typeof a === 'string' ? a : { pidOf: a.id })), fd5: options.fd5 });
    return launched;
  }

  /**
   * Runs a short command to its end (killed after `timeoutMs`). Not `spawn`: the pipes of a
   * process that exits at once may close in the launcher before they are handed over. `undo`,
   * kept once the command succeeded, is what the launcher runs should this process die before it
   * calls `forget(undo.key)` (a mount it no longer can unmount itself).
   */
  run(
    command: string,
    args: string[],
    options: { timeoutMs?: number; undo?: { key: string; command: string; args: string[] }; stdout?: boolean } = {},
  ): Promise<RunResult> {
    const child = this.start();
    const id = ++this.next;
    if (this.pending++ === 0) this.channel(child)?.ref();
    return new Promise((resolve) => {
      this.runs.set(id, (result) => {
        if (--this.pending === 0) this.channel(this.child)?.unref();
        resolve(result);
      });
      child.send({ op: 'run', id, command, args, timeoutMs: options.timeoutMs ?? 60_000, undo: options.undo, stdout: options.stdout === true });
    });
  }

  /** Drops what `run` was told to undo under `key` (it is undone, or needs no undoing). */
  forget(key: string): void {
    this.child?.send({ op: 'forget', key });
  }

  /** What to undo should this process die, for what another process does (as `run`'s `undo`, without a command run for it). */
  remember(undo: { key: string; command: string; args: string[] }): void {
    this.start().send({ op: 'remember', undo });
  }

  close(): void {
    const child = this.child;
    this.child = null;
    child?.kill();
  }

  private onMessage(m: Message, handle: (Readable & Writable) | undefined): void {
    if (m.ran) {
      this.runs.get(m.id)?.(m.ran);
      this.runs.delete(m.id);
      return;
    }
    const entry = this.launched.get(m.id);
    if (!entry) return;
    if (m.pid !== undefined) entry.process.pid = m.pid;
    if (m.pipes !== undefined) entry.pipes = m.pipes;
    if (m.fd !== undefined && handle) {
      entry.process.stdio[m.fd] = handle;
      if (++entry.fds === entry.pipes) entry.process.settle();
    }
    if (m.error !== undefined) {
      entry.process.settle(new Error(m.error));
      entry.process.emit('error', new Error(m.error));
    }
    if (m.exit) this.finish(m.id, m.exit);
  }

  private finish(id: number, exit: { code: number | null; signal: NodeJS.Signals | null }): void {
    const entry = this.launched.get(id);
    if (!entry) return;
    this.launched.delete(id);
    entry.process.exitCode = exit.code;
    entry.process.signalCode = exit.signal;
    entry.process.emit('exit', exit.code, exit.signal);
  }
}
