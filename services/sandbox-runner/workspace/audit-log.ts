/**
 * The sandbox's audit log: JSON lines in `<workspace>/.svc/audit.jsonl` (the spec's "Audit event";
 * docs/decisions.md, "Audit log placement"). The service writes it from the host; inside the
 * sandbox `.svc` is mounted read-only, so the agent can read its own audit log but not change it.
 *
 * Each line is `{ts, sandbox_id, type, details}`; `ts` is ISO 8601 with milliseconds. Before a record
 * is written (or handed to `onRecord`), `redact` is applied to every string in `details`, keys
 * included (the runner passes a function that replaces secret values with `[REDACTED:<NAME>]`), so no
 * secret value reaches the file or the event stream.
 *
 * Records are written in the order `record` is called, on an O_APPEND descriptor: the lines that
 * arrive while a write is under way go in the next one, together (a burst of records is a few
 * writes, not one per line). `onRecord` is called after the line is written (the runner publishes each record as a
 * sandbox event); an exception it throws is swallowed, it never breaks auditing.
 *
 * Bounded, so an agent that floods (renames in a loop) costs the service neither memory nor its
 * event log: at most `recordsPerSecond` records in each one-second window, the rest of the window
 * dropped (`record` resolves with null) and counted in one `warning` record when the window ends
 * (`{dropped: {type: count}, from, to}`); at most `maxRecords` in all, then a `warning` says the
 * log is full, and one at `close` counts what was dropped after it. Those warnings are the only
 * records past the limits: at most one per window, two in all.
 */
import { constants } from 'node:fs';
import { lstat, mkdir, open, readFile, type FileHandle } from 'node:fs/promises';
import path from 'node:path';
import { SERVICE_DIR } from './paths.ts';
import { AUDIT_TYPES } from '../../domain/events/sandbox-events.ts';

export const AUDIT_FILE = 'audit.jsonl';

export type AuditType = (typeof AUDIT_TYPES)[number];

export interface AuditRecord {
  ts: string;
  sandbox_id: string;
  type: AuditType;
  details: Record<string, unknown>;
}

export interface AuditLogOptions {
  workspace: string;
  sandboxId: string;
  /** Applied to every string of `details` (values and keys) before the record is written. */
  redact?: (text: string) => string;
  /** Called with each record once written (redacted). */
  onRecord?: (record: AuditRecord) => void;
  /** fsync after every line (default false: the OS flushes; the log is closed at teardown). */
  fsync?: boolean;
  /** Most records in one second (default: no limit). */
  recordsPerSecond?: number;
  /** Most records in all (default: no limit). */
  maxRecords?: number;
}

const WINDOW_MS = 1000;

function auditLogPath(workspace: string): string {
  return path.join(workspace, SERVICE_DIR, AUDIT_FILE);
}

export class AuditLog {
  readonly path: string;
  private readonly options: AuditLogOptions;
  private handle: FileHandle | undefined;
  private opening: Promise<FileHandle> | undefined;
  /** Lines waiting for the next write, in order. */
  private queued: Array<{ record: AuditRecord; line: string; done: (error?: Error) => void }> = [];
  /** The writer's run while it has lines to write. */
  private tail: Promise<void> = Promise.resolve();
  private writing = false;
  private closed = false;
  private count = 0;
  /** Records let through so far (written or being written). */
  private admitted = 0;
  /** The current window: when it began, records let through in it, records dropped in it by type. */
  private window = { start: 0, admitted: 0, dropped: new Map<AuditType, number>() };
  private windowTimer: NodeJS.Timeout | undefined;
  /** Every record the limits dropped, by type: the forbidden rules cannot hold over what was not recorded. */
  private readonly droppedByType = new Map<AuditType, number>();
  /** Dropped because the log is full, by type. */
  private readonly overCap = new Map<AuditType, number>();

  constructor(options: AuditLogOptions) {
    this.options = options;
    this.path = auditLogPath(options.workspace);
  }

  /** Records written so far. */
  get written(): number {
    return this.count;
  }

  /**
   * Creates `.svc/` (0755) and the log (0644) if needed. Refuses a `.svc` or log that is a symlink
   * (the runner creates `.svc` before the sandbox starts, so the agent cannot plant one).
   */
  open(): Promise<FileHandle> {
    this.opening ??= (async () => {
      const dir = path.dirname(this.path);
      await mkdir(dir, { recursive: true, mode: 0o755 });
      const st = await lstat(dir);
      if (!st.isDirectory()) throw new Error(`${dir} is not a directory`);
      const fh = await open(this.path, constants.O_WRONLY | constants.O_APPEND | constants.O_CREAT | constants.O_NOFOLLOW, 0o644);
      this.handle = fh;
      return fh;
    })();
    return this.opening;
  }

  /**
   * Appends one record; resolves with it (as written) once it is in the file, or with null at once
   * when a limit drops it.
   */
  record(type: AuditType, details: Record<string, unknown> = {}, options: { ts?: Date } = {}): Promise<AuditRecord | null> {
    if (this.closed) return Promise.reject(new Error('audit log is closed'));
    if (!(AUDIT_TYPES as readonly string[]).includes(type)) return Promise.reject(new Error(`unknown audit type ${type}`));
    if (!this.admit(type)) return Promise.resolve(null);
    return this.append(type, details, options.ts);
  }

  /** Paths of the file_write and file_delete records written so far, by anyone (the watcher, the files API). */
  private readonly filePaths = { file_write: new Set<string>(), file_delete: new Set<string>() };

  /** Whether a `file_write` or `file_delete` record of `path` was written. */
  hasFileRecord(type: 'file_write' | 'file_delete', path: string): boolean {
    return this.filePaths[type].has(path);
  }

  /** How many records of each type the limits dropped so far. */
  get dropped(): Record<string, number> {
    return Object.fromEntries(this.droppedByType);
  }

  /** Whether the limits let a record of `type` through now; counts it, or its drop. */
  private admit(type: AuditType): boolean {
    const admitted = this.limit(type);
    if (!admitted) this.droppedByType.set(type, (this.droppedByType.get(type) ?? 0) + 1);
    return admitted;
  }

  private limit(type: AuditType): boolean {
    const { recordsPerSecond, maxRecords } = this.options;
    if (maxRecords !== undefined && this.admitted >= maxRecords) {
      if (this.overCap.size === 0) {
        void this.append('warning', { message: `the audit log is full (${maxRecords} records): later records are dropped, and counted when it closes` }).catch(
          () => undefined,
        );
      }
      this.overCap.set(type, (this.overCap.get(type) ?? 0) + 1);
      return false;
    }
    if (recordsPerSecond !== undefined) {
      const now = Date.now();
      if (now - this.window.start >= WINDOW_MS) {
        this.summariseWindow();
        this.window = { start: now, admitted: 0, dropped: new Map() };
      }
      if (this.window.admitted >= recordsPerSecond) {
        this.window.dropped.set(type, (this.window.dropped.get(type) ?? 0) + 1);
        // Said when the window ends, even if nothing more comes.
        this.windowTimer ??= setTimeout(() => this.summariseWindow(), this.window.start + WINDOW_MS - now).unref();
        return false;
      }
      this.window.admitted++;
    }
    this.admitted++;
    return true;
  }

  /** The `warning` that counts what the current window dropped, if it dropped anything. */
  private summariseWindow(): void {
    if (this.windowTimer) clearTimeout(this.windowTimer);
    this.windowTimer = undefined;
    const { start, dropped } = this.window;
    if (dropped.size === 0) return;
    this.window.dropped = new Map();
    const total = [...dropped.values()].reduce((a, b) => a + b, 0);
    this.admitted++;
    void this.append('warning', {
      message: `${total} audit records dropped: more than ${this.options.recordsPerSecond} in one second`,
      dropped: Object.fromEntries(dropped),
      from: new Date(start).toISOString(),
      to: new Date(start + WINDOW_MS).toISOString(),
    }).catch(() => undefined);
  }

  private append(type: AuditType, details: Record<string, unknown>, ts?: Date): Promise<AuditRecord> {
    const redact = this.options.redact;
    const record: AuditRecord = {
      ts: (ts ?? new Date()).toISOString(),
      sandbox_id: this.options.sandboxId,
      type,
      details: (redact ? redactDeep(details, redact) : details) as Record<string, unknown>,
    };
    if ((type === 'file_write' || type === 'file_delete') && typeof details.path === 'string') this.filePaths[type].add(details.path);
    return new Promise<AuditRecord>((resolve, reject) => {
      this.queued.push({ record, line: `${JSON.stringify(record)}\n`, done: (error) => (error ? reject(error) : resolve(record)) });
      if (!this.writing) {
        this.writing = true;
        this.tail = this.writeQueued();
      }
    });
  }

  /** Writes what is queued, a batch at a time, until nothing is. */
  private async writeQueued(): Promise<void> {
    while (this.queued.length > 0) {
      const batch = this.queued;
      this.queued = [];
      let failed: Error | undefined;
      try {
        const fh = await this.open();
        const bytes = Buffer.from(batch.map((b) => b.line).join(''));
        // A regular file takes the whole buffer unless the disk is full; a short write is finished.
        for (let at = 0; at < bytes.length; ) at += (await fh.write(bytes, at)).bytesWritten;
        if (this.options.fsync) await fh.sync();
      } catch (err) {
        failed = err as Error;
      }
      for (const { record, done } of batch) {
        if (failed) {
          done(failed);
          continue;
        }
        this.count++;
        try {
          this.options.onRecord?.(record);
        } catch {
          // A listener's failure never breaks auditing.
        }
        done();
      }
    }
    this.writing = false;
  }

  /** Waits for pending records, then closes the file. Later `record` calls reject. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.summariseWindow();
    if (this.overCap.size > 0) {
      const total = [...this.overCap.values()].reduce((a, b) => a + b, 0);
      void this.append('warning', {
        message: `${total} audit records dropped after the log was full (${this.options.maxRecords} records)`,
        dropped: Object.fromEntries(this.overCap),
      }).catch(() => undefined);
    }
    await this.tail;
    if (this.opening) await this.opening.catch(() => undefined);
    await this.handle?.close();
    this.handle = undefined;
  }

  /** Every record of a workspace's audit log (empty when there is none). */
  static async read(workspace: string): Promise<AuditRecord[]> {
    let text: string;
    try {
      text = await readFile(auditLogPath(workspace), 'utf8');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
      throw err;
    }
    return text
      .split('\n')
      .filter((l) => l.trim() !== '')
      .map((l) => JSON.parse(l) as AuditRecord);
  }
}

/** Applies `redact` to every string in a JSON-like value (object keys too). */
function redactDeep(value: unknown, redact: (text: string) => string): unknown {
  if (typeof value === 'string') return redact(value);
  if (Array.isArray(value)) return value.map((v) => redactDeep(v, redact));
  if (value !== null && typeof value === 'object' && !(value instanceof Date)) {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value)) out[redact(k)] = redactDeep(v, redact);
    return out;
  }
  return value;
}
