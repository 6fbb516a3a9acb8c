/**
 * Terminal sessions of a sandbox (GET /v1/sandboxes/:id/shell; docs/sandboxes.md "Shell"): a
 * shell on a pseudo-terminal of the sandbox, relayed by the api to a WebSocket and by the
 * sandbox's runner to the shell, over svc.terminal-input and svc.terminal-output (the session
 * is opened by a `terminal` request on svc.sandbox-requests). Pure: the limits both ends keep,
 * what a client may ask for, the records' shapes and their sealing.
 *
 * Flow control holds memory at every hop to a window per direction: the runner's shell reads
 * on only while the client has acknowledged all but TERMINAL.outputWindow bytes of its output (the
 * api acknowledges what the WebSocket has sent), and the api reads the WebSocket on only while
 * the runner has acknowledged all but TERMINAL.inputWindow bytes of the input (what the shell took).
 * A slow client slows the shell down; nothing piles up in between.
 */
import { newEventId } from '../kernel/ids.ts';
import type { Sealer } from '../kernel/tenant-secrets.ts';
import type { TerminalInput, TerminalOutput } from './events/terminal-events.ts';

export const TERMINAL = {
  /** Shells open at once in one sandbox. */
  maxPerSandbox: 8,
  /** Output bytes in flight from the shell to the client, not yet acknowledged. */
  outputWindow: 256 * 1024,
  /** Input bytes in flight from the client to the shell, not yet acknowledged. */
  inputWindow: 64 * 1024,
  /** Most bytes of one record's data: output and input are cut to it. */
  recordBytes: 64 * 1024,
  /** An end acknowledges once it has taken a quarter window, or this long after it took anything. */
  ackDelayMs: 20,
  /** A client's resizes go on at most one this often, the latest winning (a flood of them is not a flood of records). */
  resizeMs: 20,
  /** The api says it is still there this often, when it has said nothing else... */
  heartbeatMs: 5_000,
  /** ...and the runner hangs up a session it has heard nothing of for this long. */
  idleMs: 20_000,
  /** A client's window, in characters: at most this wide and tall. */
  maxSize: 1000,
  defaultSize: { cols: 80, rows: 24 },
  defaultTerm: 'xterm-256color',
} as const;

/** Why a window's width or height (`field`, as given) is not one, or null. */
export function terminalSizeProblem(field: string, value: unknown): string | null {
  const n = typeof value === 'string' && /^\d+$/.test(value) ? Number(value) : value;
  return Number.isInteger(n) && (n as number) >= 1 && (n as number) <= TERMINAL.maxSize
    ? null
    : `${field}: ${JSON.stringify(value)} is not a whole number of characters from 1 to ${TERMINAL.maxSize}`;
}

/** Why `term` is not a terminal type the shell can be given as TERM, or null. */
export function termProblem(term: string): string | null {
  return /^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$/.test(term)
    ? null
    : `term: ${JSON.stringify(term.slice(0, 80))} is not a terminal type (letters, digits and . _ + -, at most 64, e.g. xterm-256color)`;
}

/** What the api sends with a `terminal` request: the session it made, and the shell's terminal. */
export interface TerminalOpen {
  session_id: string;
  cols: number;
  rows: number;
  term: string;
  /** the session is hung up after this long (null: when the sandbox ends) */
  timeout_ms: number | null;
}

/** What the runner answers a `terminal` request with, once the shell runs. */
export interface TerminalOpened {
  session_id: string;
  shell: string;
}

type Session = { tenant: string; session_id: string; sandbox_id: string };

const inputContext = (sessionId: string, seq: number) => `terminal-input/${sessionId}/${seq}`;
const outputContext = (sessionId: string, seq: number) => `terminal-output/${sessionId}/${seq}`;

/** What every record of both terminal topics starts with. */
function recordHead(session: Session, seq: number) {
  return { tenant: session.tenant, event_id: newEventId(), ts: Date.now(), session_id: session.session_id, sandbox_id: session.sandbox_id, seq };
}

/** A record of svc.terminal-input; `data` (input) is sealed to its session and place. */
export function terminalInput(
  sealer: Sealer,
  session: Session,
  seq: number,
  kind: TerminalInput['kind'],
  fields: { data?: Buffer; cols?: number; rows?: number; bytes?: number; reason?: string } = {},
): TerminalInput {
  return {
    ...recordHead(session, seq),
    kind,
    data_sealed: fields.data ? sealer.seal(fields.data, inputContext(session.session_id, seq)) : null,
    cols: fields.cols ?? 0,
    rows: fields.rows ?? 0,
    bytes: fields.bytes ?? 0,
    reason: fields.reason ?? null,
  };
}

/** A record of svc.terminal-output; `data` (output) is sealed to its session and place. */
export function terminalOutput(
  sealer: Sealer,
  session: Session,
  seq: number,
  kind: TerminalOutput['kind'],
  fields: { data?: Buffer; bytes?: number; exitCode?: number; error?: string | null; reason?: string | null } = {},
): TerminalOutput {
  return {
    ...recordHead(session, seq),
    kind,
    data_sealed: fields.data ? sealer.seal(fields.data, outputContext(session.session_id, seq)) : null,
    bytes: fields.bytes ?? 0,
    exit_code: fields.exitCode ?? null,
    error: fields.error ?? null,
    reason: fields.reason ?? null,
  };
}

/** The bytes of an input record (empty for one without). */
export function inputData(sealer: Sealer, record: TerminalInput): Buffer {
  return record.data_sealed ? sealer.openBytes(record.data_sealed, inputContext(record.session_id, record.seq)) : Buffer.alloc(0);
}

/** The bytes of an output record (empty for one without). */
export function outputData(sealer: Sealer, record: TerminalOutput): Buffer {
  return record.data_sealed ? sealer.openBytes(record.data_sealed, outputContext(record.session_id, record.seq)) : Buffer.alloc(0);
}

/** One direction of a session on the log: who it belongs to, and the last seq given. */
export interface TerminalStream {
  tenant: string;
  session_id: string;
  sandbox_id: string;
  seq: number;
}

/** Something for a session's log before it is a record (BatchedAppends makes records of a batch at once). */
export interface TerminalItem<Kind extends string> {
  stream: TerminalStream;
  kind: Kind;
  data?: Buffer;
}

/**
 * Merges the data of each stream's items that follow each other (no other item of that stream
 * between them), up to TERMINAL.recordBytes a record: a burst of small chunks is a few records.
 */
export function mergeData<T extends TerminalItem<string>>(items: T[]): T[] {
  const out: T[] = [];
  const merged: Array<{ item: T; parts: Buffer[] }> = [];
  const open = new Map<TerminalStream, { item: T; parts: Buffer[]; size: number }>();
  for (const item of items) {
    if (!item.data) {
      open.delete(item.stream);
      out.push(item);
      continue;
    }
    const current = open.get(item.stream);
    if (current && current.size + item.data.length <= TERMINAL.recordBytes) {
      current.parts.push(item.data);
      current.size += item.data.length;
      continue;
    }
    const next = { item: { ...item }, parts: [item.data], size: item.data.length };
    open.set(item.stream, next);
    merged.push(next);
    out.push(next.item);
  }
  for (const { item, parts } of merged) if (parts.length > 1) item.data = Buffer.concat(parts);
  return out;
}
