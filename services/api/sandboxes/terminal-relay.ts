/**
 * The api's end of terminal sessions (domain/terminal-sessions.ts): it opens a session on the
 * sandbox's runner (a `terminal` request), relays its client's input, window size and
 * acknowledgements of output to the runner over svc.terminal-input, and the shell's output back
 * from svc.terminal-output, which every api process reads from its tail, keeping only the
 * sessions it holds.
 *
 * Flow: the client acknowledges output as it sends it on (`consumed`); input goes on while the
 * runner has acknowledged all but TERMINAL.inputWindow of it, and `input` says false past that
 * so the client's reading waits (`writable` says when to go on).
 *
 * While a session lives the relay says so to the runner every TERMINAL.heartbeatMs (the runner
 * hangs up a session it stops hearing of: this process died), and a sandbox that ends
 * (destroyed, timed out, its runner dead: the sandboxes' view says so) ends its sessions here
 * even if its runner could not say so.
 */
import { subscribe, type Kernel } from '../../kernel/actor.ts';
import { AckBatcher } from '../../kernel/ack-batcher.ts';
import type { Principal } from '../../kernel/auth.ts';
import { BatchedAppends } from '../../kernel/batched-appends.ts';
import type { ErrorCode } from '../../kernel/errors.ts';
import { newTerminalSessionId } from '../../kernel/ids.ts';
import type { Consumer } from '../../kernel/log/event-log.ts';
import { Sealer, secretsKey } from '../../kernel/tenant-secrets.ts';
import { TOPICS } from '../../kernel/topics.ts';
import type { SandboxChanged } from '../../domain/events/sandbox-events.ts';
import type { TerminalInput, TerminalOutput } from '../../domain/events/terminal-events.ts';
import {
  mergeData,
  outputData,
  TERMINAL,
  terminalInput,
  type TerminalItem,
  type TerminalOpen,
  type TerminalOpened,
  type TerminalStream,
} from '../../domain/terminal-sessions.ts';
import type { SandboxCatalog } from '../catalogs/sandbox-catalog.ts';
import type { SandboxOperations } from './sandbox-operations.ts';

type InputItem = TerminalItem<TerminalInput['kind']> & { cols?: number; rows?: number; bytes?: number; reason?: string };

/** How a session ended: the shell's exit code when it is known, and why when the service ended it. */
export interface TerminalEnd {
  exitCode: number | null;
  error: ErrorCode | null;
  reason: string | null;
}

/** Who a session relays to (the WebSocket's side). */
export interface TerminalClient {
  /** The shell's output; the client acknowledges it (`RelayedTerminal.consumed`) once it has sent it on. */
  output(data: Buffer): void;
  /** Input may flow again (`input` had said false). */
  writable(): void;
  ended(end: TerminalEnd): void;
}

export class TerminalRelay {
  private readonly sessions = new Map<string, RelayedTerminal>();
  private sealer!: Sealer;
  private appends!: BatchedAppends<InputItem>;
  private consumer: Consumer | null = null;
  private heartbeat: NodeJS.Timeout | null = null;
  private stopListening: (() => void) | null = null;

  constructor(
    private readonly kernel: Kernel,
    private readonly sandboxes: SandboxCatalog,
  ) {}

  async start(): Promise<void> {
    const sealer = (this.sealer = new Sealer(secretsKey(this.kernel.config)));
    this.appends = new BatchedAppends(this.kernel, TOPICS.terminalInput, (items) =>
      mergeData(items).map((item) => ({
        key: item.stream.session_id,
        tenant: item.stream.tenant,
        value: terminalInput(sealer, item.stream, ++item.stream.seq, item.kind, item),
      })),
    );
    this.consumer = await subscribe<TerminalOutput>(this.kernel, {
      groupId: `streams.terminal-output.${this.kernel.instanceId}`,
      topics: [TOPICS.terminalOutput],
      fromBeginning: false,
      commit: false,
      handle: async (events) => {
        for (const { value } of events) if (value) this.sessions.get(value.session_id)?.receive(value);
      },
    });
    this.heartbeat = setInterval(() => {
      for (const session of this.sessions.values()) session.beat();
    }, TERMINAL.heartbeatMs);
    this.heartbeat.unref();
    this.stopListening = this.sandboxes.onEnded((sandbox) => this.sandboxEnded(sandbox));
  }

  /** Ends every session (their runners hang the shells up), before the server closes its sockets. */
  async stop(): Promise<void> {
    if (this.heartbeat) clearInterval(this.heartbeat);
    this.stopListening?.();
    for (const session of [...this.sessions.values()])
      session.end({ exitCode: null, error: 'unavailable', reason: 'the service is stopping' }, 'the api stopped');
    await this.appends?.idle();
    await this.consumer?.stop();
    this.consumer = null;
  }

  /**
   * Opens a session on the sandbox's runner; resolves once its shell runs. Output that comes
   * before the client is attached goes to `client` as it comes (it holds it: nothing more than
   * the output window comes unacknowledged).
   */
  async open(
    operations: SandboxOperations,
    principal: Principal,
    sandbox: SandboxChanged,
    options: Omit<TerminalOpen, 'session_id'>,
    client: TerminalClient,
  ): Promise<RelayedTerminal> {
    const stream: TerminalStream = { tenant: sandbox.tenant, session_id: newTerminalSessionId(), sandbox_id: sandbox.sandbox_id, seq: 0 };
    const session = new RelayedTerminal(
      stream,
      client,
      this.sealer,
      (item) => this.push(item),
      () => this.sessions.delete(stream.session_id),
    );
    // Before the request: the shell's first output may come before the reply does.
    this.sessions.set(stream.session_id, session);
    try {
      const answer = await operations.send(principal, sandbox.sandbox_id, 'terminal', { ...options, session_id: stream.session_id } satisfies TerminalOpen);
      session.shell = (answer.body as TerminalOpened).shell;
      return session;
    } catch (err) {
      this.sessions.delete(stream.session_id);
      throw err;
    }
  }

  private sandboxEnded(sandbox: SandboxChanged): void {
    const reason =
      sandbox.state === 'error' ? `sandbox ${sandbox.sandbox_id} ended: ${sandbox.error ?? 'error'}` : `sandbox ${sandbox.sandbox_id} was destroyed`;
    for (const session of [...this.sessions.values()])
      if (session.sandboxId === sandbox.sandbox_id) session.end({ exitCode: null, error: 'not_found', reason }, null);
  }

  private push(item: InputItem): void {
    this.appends
      .push(item)
      .catch((err) =>
        this.kernel.logger.error({ err, session_id: item.stream.session_id, sandbox_id: item.stream.sandbox_id }, 'terminal input did not reach the log'),
      );
  }
}

/** One session as the api relays it. */
export class RelayedTerminal {
  shell = '';
  /** input bytes sent and not yet acknowledged by the runner */
  private inFlight = 0;
  private lastSeq = 0;
  private sentAt = Date.now();
  private ended = false;
  private readonly outputAcks: AckBatcher;
  /** the latest size asked for while the last one is too recent (TERMINAL.resizeMs) */
  private nextSize: { cols: number; rows: number } | null = null;
  private resizing: NodeJS.Timeout | null = null;

  constructor(
    private readonly stream: TerminalStream,
    private readonly client: TerminalClient,
    private readonly sealer: Sealer,
    private readonly push: (item: InputItem) => void,
    private readonly forget: () => void,
  ) {
    this.outputAcks = new AckBatcher(TERMINAL.outputWindow, TERMINAL.ackDelayMs, (bytes) => this.send({ stream, kind: 'ack', bytes }));
  }

  get id(): string {
    return this.stream.session_id;
  }

  get sandboxId(): string {
    return this.stream.sandbox_id;
  }

  /** Sends the client's bytes on; false once the runner's acknowledgements are a window behind (wait for `writable`). */
  input(data: Buffer): boolean {
    if (this.ended) return false;
    if (data.length === 0) return this.inFlight < TERMINAL.inputWindow;
    for (let at = 0; at < data.length; at += TERMINAL.recordBytes)
      this.send({ stream: this.stream, kind: 'input', data: data.subarray(at, at + TERMINAL.recordBytes) });
    this.inFlight += data.length;
    return this.inFlight < TERMINAL.inputWindow;
  }

  resize(cols: number, rows: number): void {
    this.nextSize = { cols, rows };
    if (this.resizing) return;
    this.send({ stream: this.stream, kind: 'resize', cols, rows });
    this.nextSize = null;
    this.resizing = setTimeout(() => {
      this.resizing = null;
      if (this.nextSize) this.resize(this.nextSize.cols, this.nextSize.rows);
    }, TERMINAL.resizeMs);
  }

  /** The client has sent `bytes` of output on. */
  consumed(bytes: number): void {
    if (!this.ended) this.outputAcks.consumed(bytes);
  }

  /** The client left: the runner hangs the shell up. */
  close(reason: string): void {
    this.end(null, reason);
  }

  /** Says the session is still wanted, unless something else said so lately. */
  beat(): void {
    if (Date.now() - this.sentAt >= TERMINAL.heartbeatMs) this.send({ stream: this.stream, kind: 'ping' });
  }

  /** Ends the session here: tells the client `end` (when given), and the runner `closing` (when given). */
  end(end: TerminalEnd | null, closing: string | null): void {
    if (this.ended) return;
    if (closing !== null) this.send({ stream: this.stream, kind: 'close', reason: closing });
    this.ended = true;
    this.outputAcks.stop();
    if (this.resizing) clearTimeout(this.resizing);
    this.forget();
    if (end) this.client.ended(end);
  }

  receive(record: TerminalOutput): void {
    if (record.seq <= this.lastSeq || record.tenant !== this.stream.tenant || this.ended) return;
    this.lastSeq = record.seq;
    if (record.kind === 'output') {
      this.client.output(outputData(this.sealer, record));
    } else if (record.kind === 'ack') {
      const wasFull = this.inFlight >= TERMINAL.inputWindow;
      this.inFlight = Math.max(0, this.inFlight - record.bytes);
      if (wasFull && this.inFlight < TERMINAL.inputWindow) this.client.writable();
    } else if (record.kind === 'end') {
      this.end({ exitCode: record.exit_code, error: record.error as ErrorCode | null, reason: record.reason }, null);
    }
  }

  private send(item: InputItem): void {
    if (this.ended) return;
    this.sentAt = Date.now();
    this.push(item);
  }
}
