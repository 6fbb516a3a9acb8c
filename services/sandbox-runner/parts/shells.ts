/**
 * The shells open on a sandbox's terminals (docs/sandboxes.md "Shell"): its processes are the
 * sandbox user's, like a command's. Its start and end are `terminal` events of the stream and
 * the shell a `process_spawn` record of the audit, with its exit code and byte counts; what
 * went through it is recorded nowhere. They start with the sandbox's ready; at teardown every
 * shell is hung up with why the sandbox ends.
 */
import { AppError, type ErrorCode } from '../../kernel/errors.ts';
import { TERMINAL } from '../../domain/terminal-sessions.ts';
import type { SandboxHandle, SandboxTerminal, TerminalOptions } from '../runtimes/runtime.ts';
import type { AuditTrail } from './audit-trail.ts';
import type { EmitEvent } from './sandbox-events.ts';

/** A shell of the sandbox (LiveSandbox.openTerminal). */
export interface ShellTerminal {
  readonly terminal: SandboxTerminal;
  /** Hangs it up; the first reason given is the one its end carries. */
  close(reason: string, error: ErrorCode): void;
  /** Nothing of it is left, and its end is recorded: the shell's exit code, and why the service ended it (null: it exited). */
  readonly ended: Promise<{ exitCode: number; error: ErrorCode | null; reason: string | null }>;
}

/** How long a destroy waits for its shells to hang up (and their ends to be recorded) before it tears the sandbox down. */
const TERMINALS_END_MS = 3000;

export class SandboxShells {
  /** open shells by session id */
  private readonly terminals = new Map<string, ShellTerminal>();

  constructor(
    private readonly sandboxId: string,
    private readonly trail: AuditTrail,
    private readonly event: EmitEvent,
  ) {}

  /** Refuses a shell over TERMINAL.maxPerSandbox, before the sandbox is touched. */
  assertRoom(): void {
    if (this.terminals.size >= TERMINAL.maxPerSandbox)
      throw new AppError('conflict', `sandbox ${this.sandboxId} has ${TERMINAL.maxPerSandbox} shells open, the most at once; exit one first`);
  }

  /** Opens a shell on `box` for session `sessionId`; answers once it runs. */
  async open(box: SandboxHandle, sessionId: string, options: TerminalOptions): Promise<ShellTerminal> {
    const started = performance.now();
    const terminal = await box.openTerminal(options).catch((err: Error) => {
      throw new AppError('conflict', `the shell did not start in sandbox ${this.sandboxId}: ${err.message}`);
    });
    let ending: { reason: string; error: ErrorCode } | null = null;
    const ended = terminal.exited.then(async ({ exitCode }) => {
      this.terminals.delete(sessionId);
      const end = {
        session_id: sessionId,
        exit_code: exitCode,
        duration_ms: Math.round(performance.now() - started),
        input_bytes: terminal.inputBytes,
        output_bytes: terminal.outputBytes,
        ...(ending ? { reason: ending.reason } : {}),
      };
      await this.trail.log
        ?.record('process_spawn', {
          command: `${terminal.shell} -i`,
          terminal: sessionId,
          exit_code: exitCode,
          duration_ms: end.duration_ms,
          output_bytes: terminal.outputBytes,
        })
        .catch(() => undefined);
      await this.event('terminal', { phase: 'closed', ...end });
      return { exitCode, error: ending?.error ?? null, reason: ending?.reason ?? null };
    });
    const shell: ShellTerminal = {
      terminal,
      ended,
      close: (reason, error) => {
        ending ??= { reason, error };
        terminal.close();
      },
    };
    this.terminals.set(sessionId, shell);
    void this.event('terminal', { phase: 'opened', session_id: sessionId, shell: terminal.shell, term: options.term, cols: options.cols, rows: options.rows });
    return shell;
  }

  /** Hangs up every shell with why the sandbox ends, and waits (a while) for their ends to be recorded. */
  async closeAll(reason: string): Promise<void> {
    if (this.terminals.size === 0) return;
    const why =
      reason === 'destroyed'
        ? `sandbox ${this.sandboxId} was destroyed`
        : reason === 'timeout'
          ? `sandbox ${this.sandboxId} reached its timeout`
          : `sandbox ${this.sandboxId} ended: ${reason}`;
    const ends = [...this.terminals.values()].map((shell) => {
      shell.close(why, 'not_found');
      return shell.ended;
    });
    await Promise.race([Promise.allSettled(ends), new Promise((resolve) => setTimeout(resolve, TERMINALS_END_MS).unref())]);
  }
}
