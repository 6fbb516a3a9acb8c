/**
 * The runner's end of terminal sessions (domain/terminal-sessions.ts): a `terminal` request
 * opens a shell in one of this runner's sandboxes (LiveSandbox.openTerminal); the shell's
 * output goes to svc.terminal-output, and what the api sends on svc.terminal-input (which every
 * runner reads from its tail, acting on the sessions it holds) goes to the shell.
 *
 * Flow: output is acknowledged by the api as its client takes it, and the acknowledgements go
 * on to the runtime, which holds the shell once TERMINAL.outputWindow is not acknowledged;
 * input is acknowledged to the api once the runtime has taken it (at once, or when it drains).
 *
 * A session ends when its shell does, when the api closes it (its client left), when nothing
 * of the api has been heard for TERMINAL.idleMs (it died, or lost the session), at its timeout,
 * and with its sandbox; its last record, `end`, says the shell's exit code and why.
 */
import { subscribe, type Kernel } from '../kernel/actor.ts';
import { AckBatcher } from '../kernel/ack-batcher.ts';
import { BatchedAppends } from '../kernel/batched-appends.ts';
import { AppError, type ErrorCode } from '../kernel/errors.ts';
import type { Consumer } from '../kernel/log/event-log.ts';
import type { Sealer } from '../kernel/tenant-secrets.ts';
import { TOPICS } from '../kernel/topics.ts';
import type { TerminalInput, TerminalOutput } from '../domain/events/terminal-events.ts';
import {
  inputData,
  mergeData,
  TERMINAL,
  terminalOutput,
  termProblem,
  terminalSizeProblem,
  type TerminalItem,
  type TerminalOpen,
  type TerminalOpened,
  type TerminalStream,
} from '../domain/terminal-sessions.ts';
import type { LiveSandbox } from './sandbox.ts';
import type { ShellTerminal } from './parts/shells.ts';

type OutputItem = TerminalItem<TerminalOutput['kind']> & { bytes?: number; exitCode?: number; error?: ErrorCode | null; reason?: string | null };

export class TerminalSessions {
  private readonly sessions = new Map<string, RunnerTerminal>();
  private appends!: BatchedAppends<OutputItem>;
  private consumer: Consumer | null = null;
  private sweeper: NodeJS.Timeout | null = null;

  constructor(
    private readonly kernel: Kernel,
    private readonly sealer: Sealer,
  ) {}

  async start(): Promise<void> {
    const { sealer } = this;
    this.appends = new BatchedAppends(this.kernel, TOPICS.terminalOutput, (items) =>
      mergeData(items).map((item) => ({
        key: item.stream.session_id,
        tenant: item.stream.tenant,
        value: terminalOutput(sealer, item.stream, ++item.stream.seq, item.kind, item),
      })),
    );
    this.consumer = await subscribe<TerminalInput>(this.kernel, {
      groupId: `sandbox-runner.terminals.${this.kernel.instanceId}`,
      topics: [TOPICS.terminalInput],
      fromBeginning: false,
      commit: false,
      handle: async (events) => {
        for (const { value } of events) if (value) this.sessions.get(value.session_id)?.receive(value);
      },
    });
    this.sweeper = setInterval(() => {
      for (const session of this.sessions.values()) session.checkHeard();
    }, TERMINAL.heartbeatMs);
    this.sweeper.unref();
  }

  /** Called once the runner's sandboxes are destroyed, and their sessions with them. */
  async stop(): Promise<void> {
    if (this.sweeper) clearInterval(this.sweeper);
    await this.consumer?.stop();
    this.consumer = null;
    await this.appends?.idle();
  }

  /** Opens a session on `live` (a `terminal` request's payload); answers once its shell runs. */
  async open(live: LiveSandbox, payload: TerminalOpen): Promise<{ status: number; body: TerminalOpened }> {
    const request = checkedOpen(payload);
    if (this.sessions.has(request.session_id)) throw new AppError('conflict', `terminal session ${request.session_id} is open already`);
    const stream: TerminalStream = { tenant: live.tenant, session_id: request.session_id, sandbox_id: live.id, seq: 0 };
    const session = new RunnerTerminal(stream, (item) => this.push(item), this.sealer);
    this.sessions.set(stream.session_id, session);
    try {
      const shell = await live.openTerminal(stream.session_id, {
        cols: request.cols,
        rows: request.rows,
        term: request.term,
        outputWindow: TERMINAL.outputWindow,
        onData: (chunk) => session.output(chunk),
        onDrain: () => session.drained(),
      });
      session.attach(shell, request.timeout_ms);
      void shell.ended.then(() => this.sessions.delete(stream.session_id));
      return { status: 201, body: { session_id: stream.session_id, shell: shell.terminal.shell } };
    } catch (err) {
      this.sessions.delete(stream.session_id);
      throw err;
    }
  }

  private push(item: OutputItem): void {
    this.appends
      .push(item)
      .catch((err) =>
        this.kernel.logger.error({ err, session_id: item.stream.session_id, sandbox_id: item.stream.sandbox_id }, 'terminal output did not reach the log'),
      );
  }
}

/** The payload of a `terminal` request, checked again here (the api checked it; the runner does not trust the log's bytes to match the contract's type). */
function checkedOpen(payload: TerminalOpen): TerminalOpen {
  const { session_id, cols, rows, term, timeout_ms } = payload as Partial<TerminalOpen>;
  const problem =
    (typeof session_id === 'string' && /^term-[0-9a-f]{24}$/.test(session_id) ? null : 'session_id: not a terminal session id') ??
    terminalSizeProblem('cols', cols) ??
    terminalSizeProblem('rows', rows) ??
    (typeof term === 'string' ? termProblem(term) : 'term: missing') ??
    (timeout_ms === null || timeout_ms === undefined || (Number.isInteger(timeout_ms) && timeout_ms > 0) ? null : 'timeout_ms: not a positive whole number');
  if (problem) throw new AppError('bad_request', problem);
  return { session_id: session_id!, cols: cols!, rows: rows!, term: term!, timeout_ms: timeout_ms ?? null };
}

/** One session: its shell, and its two streams on the log. */
class RunnerTerminal {
  private shell: ShellTerminal | null = null;
  private heardAt = Date.now();
  private lastSeq = 0;
  /** input the runtime took while over its high-water mark: acknowledged when it drains */
  private held = 0;
  private holding = false;
  private readonly inputAcks: AckBatcher;
  private timer: NodeJS.Timeout | null = null;

  constructor(
    private readonly stream: TerminalStream,
    private readonly push: (item: OutputItem) => void,
    private readonly sealer: Sealer,
  ) {
    this.inputAcks = new AckBatcher(TERMINAL.inputWindow, TERMINAL.ackDelayMs, (bytes) => this.push({ stream, kind: 'ack', bytes }));
  }

  attach(shell: ShellTerminal, timeoutMs: number | null): void {
    this.shell = shell;
    if (timeoutMs !== null) {
      this.timer = setTimeout(() => shell.close(`the shell reached the session's timeout (${Math.round(timeoutMs / 1000)} s)`, 'timeout'), timeoutMs);
      this.timer.unref();
    }
    void shell.ended.then(({ exitCode, error, reason }) => {
      if (this.timer) clearTimeout(this.timer);
      this.inputAcks.stop();
      this.push({ stream: this.stream, kind: 'end', exitCode, error, reason });
    });
  }

  /** The shell's output, as the runtime gives it (it may come before `attach`). */
  output(chunk: Buffer): void {
    this.push({ stream: this.stream, kind: 'output', data: chunk });
  }

  drained(): void {
    this.holding = false;
    this.inputAcks.consumed(this.held);
    this.held = 0;
  }

  /** Hangs up a session the api has gone silent on. */
  checkHeard(): void {
    if (Date.now() - this.heardAt > TERMINAL.idleMs)
      this.shell?.close(`nothing was heard of the api relaying the session for ${TERMINAL.idleMs / 1000} s`, 'timeout');
  }

  receive(record: TerminalInput): void {
    if (record.seq <= this.lastSeq || record.tenant !== this.stream.tenant || !this.shell) return;
    this.lastSeq = record.seq;
    this.heardAt = Date.now();
    const { terminal } = this.shell;
    if (record.kind === 'input') {
      const data = inputData(this.sealer, record);
      // The runtime holds at most what the api's window lets in: past its mark, acknowledge only when it drains.
      this.holding = !terminal.write(data) || this.holding;
      if (this.holding) this.held += data.length;
      else this.inputAcks.consumed(data.length);
    } else if (record.kind === 'resize' && terminalSizeProblem('cols', record.cols) === null && terminalSizeProblem('rows', record.rows) === null) {
      terminal.resize(record.cols, record.rows);
    } else if (record.kind === 'ack') {
      terminal.ack(record.bytes);
    } else if (record.kind === 'close') {
      this.shell.close(record.reason ?? 'the api closed the session', 'not_found');
    }
  }
}
