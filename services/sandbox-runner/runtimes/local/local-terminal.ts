/**
 * A terminal of the `local` runtime: the host's end of the supervisor's TERMINAL operation
 * (services/sandbox-runner/runtimes/local/supervisor/supervisor.c), a shell on a pseudo-terminal under a shepherd of its own.
 * LocalSandbox sends the frames and hands this class those of its id.
 *
 * Both directions are bounded. Output: the shepherd stops reading the pty once `outputWindow`
 * bytes it sent are not acknowledged, and `ack` acknowledges what the consumer took, so the
 * shell waits at a full terminal rather than anything piling up here. Input: at most
 * CHANNEL_WINDOW of cost (bytes plus COST_OVERHEAD per INPUT frame, as the supervisor counts
 * it) is on its way to the shepherd, which reports it TAKEN; the rest waits here, and `write`
 * says false past INPUT_HIGH_WATER so the caller holds its own sender back until `onDrain`.
 */
import { EXIT_KILLED, type SandboxTerminal, type TerminalOptions } from '../runtime.ts';
import { T_ACK, T_ERROR, T_EXIT, T_HANGUP, T_INPUT, T_RESIZE, T_STARTED, T_STDOUT, T_TAKEN } from './supervisor-channel.ts';

/** supervisor.c TERMINAL_COST_OVERHEAD and TERMINAL_INPUT_WINDOW_MAX */
const COST_OVERHEAD = 8;
const CHANNEL_WINDOW = 32 * 1024;
/** Bytes in one INPUT frame: whole within the pipe's atomic write (supervisor.c TERMINAL_MESSAGE_MAX, 4091). */
const INPUT_CHUNK = 4000;
/** Past this much input waiting here, `write` says false. */
const INPUT_HIGH_WATER = 64 * 1024;
/** Past this much, input is dropped: only a caller that ignores `write`'s false gets here. */
const INPUT_MAX = 1024 * 1024;

export class LocalTerminal implements SandboxTerminal {
  shell = '';
  inputBytes = 0;
  outputBytes = 0;
  readonly started: Promise<SandboxTerminal>;
  readonly exited: Promise<{ exitCode: number }>;
  private onStarted!: (error: Error | null) => void;
  private onExited!: (exitCode: number) => void;
  private readonly waiting: Buffer[] = [];
  private queued = 0;
  /** input cost sent to the supervisor and not yet TAKEN */
  private inFlight = 0;
  private drainOwed = false;
  private closed = false;
  private ended = false;

  constructor(
    private readonly send: (type: number, payload?: Buffer) => void,
    private readonly options: TerminalOptions,
  ) {
    this.started = new Promise<SandboxTerminal>((resolve, reject) => {
      this.onStarted = (error) => (error ? reject(error) : resolve(this));
    });
    this.exited = new Promise((resolve) => {
      this.onExited = (exitCode) => resolve({ exitCode });
    });
    this.started.catch(() => {});
  }

  /** The TERMINAL frame's payload: the size, the windows and the environment (with TERM). */
  static request(options: TerminalOptions, env: Record<string, string>): Buffer {
    const head = Buffer.alloc(12);
    head.writeUInt16LE(clampSize(options.cols), 0);
    head.writeUInt16LE(clampSize(options.rows), 2);
    head.writeUInt32LE(options.outputWindow, 4);
    head.writeUInt32LE(CHANNEL_WINDOW, 8);
    const entries = Object.entries({ ...env, TERM: options.term })
      .filter(([key]) => key && !key.includes('=') && !key.includes('\0'))
      .map(([key, value]) => `${key}=${value.replace(/\0/g, '')}\0`);
    return Buffer.concat([head, Buffer.from(entries.join(''), 'utf8')]);
  }

  write(data: Buffer): boolean {
    if (this.ended || this.closed) return false;
    if (this.queued + data.length > INPUT_MAX) return false;
    if (data.length > 0) {
      this.waiting.push(data);
      this.queued += data.length;
      this.inputBytes += data.length;
      this.pump();
    }
    if (this.queued <= INPUT_HIGH_WATER) return true;
    this.drainOwed = true;
    return false;
  }

  resize(cols: number, rows: number): void {
    if (this.ended) return;
    const size = Buffer.alloc(4);
    size.writeUInt16LE(clampSize(cols), 0);
    size.writeUInt16LE(clampSize(rows), 2);
    this.send(T_RESIZE, size);
  }

  ack(bytes: number): void {
    if (this.ended || bytes <= 0) return;
    const n = Buffer.alloc(4);
    n.writeUInt32LE(Math.min(bytes, 0xffffffff), 0);
    this.send(T_ACK, n);
  }

  close(): void {
    if (this.ended || this.closed) return;
    this.closed = true;
    this.waiting.length = 0;
    this.queued = 0;
    this.send(T_HANGUP);
  }

  /** A frame of this terminal's id from the supervisor. */
  onFrame(type: number, payload: Buffer): void {
    if (type === T_STARTED) {
      this.shell = payload.subarray(4).toString('utf8');
      this.onStarted(null);
    } else if (type === T_STDOUT) {
      this.outputBytes += payload.length;
      this.options.onData(Buffer.from(payload));
    } else if (type === T_TAKEN) {
      this.inFlight = Math.max(0, this.inFlight - payload.readUInt32LE(0));
      this.pump();
    } else if (type === T_EXIT) {
      const status = payload.readInt32LE(0);
      this.end((status & 0x7f) === 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f));
    } else if (type === T_ERROR) {
      // Only before it started: the shell could not.
      this.onStarted(new Error(payload.toString('utf8').trim()));
      this.end(126);
    }
  }

  /** The sandbox is gone, and the shell with it. */
  gone(error: Error): void {
    this.onStarted(error);
    this.end(EXIT_KILLED);
  }

  private end(exitCode: number): void {
    if (this.ended) return;
    this.ended = true;
    this.waiting.length = 0;
    this.queued = 0;
    this.onExited(exitCode);
  }

  /** Sends what waits, as far as the channel's window goes. */
  private pump(): void {
    while (this.waiting.length > 0) {
      const first = this.waiting[0];
      const chunk = first.length > INPUT_CHUNK ? first.subarray(0, INPUT_CHUNK) : first;
      if (this.inFlight + chunk.length + COST_OVERHEAD > CHANNEL_WINDOW) break;
      this.send(T_INPUT, chunk);
      this.inFlight += chunk.length + COST_OVERHEAD;
      this.queued -= chunk.length;
      if (chunk === first) this.waiting.shift();
      else this.waiting[0] = first.subarray(chunk.length);
    }
    if (this.drainOwed && this.queued <= INPUT_HIGH_WATER / 2) {
      this.drainOwed = false;
      this.options.onDrain?.();
    }
  }
}

/** A window size the pty takes: a whole number of 1 to 65535 characters. */
function clampSize(n: number): number {
  return Math.min(0xffff, Math.max(1, Math.floor(n) || 1));
}
