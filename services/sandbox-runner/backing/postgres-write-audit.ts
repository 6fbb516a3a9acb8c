/**
 * The committed-write audit of a sandbox's PostgreSQL: the logical replication slot
 * (test_decoding), read while writes come and on flush, each read bounded, drained into DbWrites:
 * one per transaction, table and operation, consecutive single-table transactions of the same
 * kind merged. DDL arrives in the slot as transactional messages (DDL_PREFIX) that the
 * template's event triggers write. postgres.ts makes the slot and starts and stops this.
 */
import type pg from 'pg';
import type { WriteOperation } from './postgres-wire.ts';

export interface DbWrite {
  /** schema-qualified unless in `public`, unquoted: "orders", "audit.log", "My Table" */
  table: string;
  /** `ddl`: a schema change (CREATE, ALTER, DROP, table rewrites, REFRESH MATERIALIZED VIEW ...), `command` says which */
  operation: WriteOperation | 'ddl';
  /** a `ddl` record's command tag ("ALTER TABLE", "CREATE VIEW") */
  command?: string;
  row_count: number;
  /** transactions merged into this record (1 unless consecutive ones wrote the same way) */
  transactions: number;
  rolled_back: boolean;
  /** ISO time of the (last) commit; for a rolled-back write, when the rollback was seen */
  ts: string;
}

/** The result of a query's last statement (a string of several gives one per statement). */
export function lastResult(result: pg.QueryResult | pg.QueryResult[]): pg.QueryResult | undefined {
  return Array.isArray(result) ? result.at(-1) : result;
}

/** the logical replication slot the audit reads */
export const SLOT = 'svc_audit';
/** the prefix of the slot messages that record DDL */
export const DDL_PREFIX = 'svc_ddl';

/** changes per slot read (a transaction is never split, so one read can return more) */
const CHANGES_PER_READ = 50_000;
const ROWS_PER_FETCH = 500;
const BUSY_POLL_MS = 250;
const IDLE_POLL_MS = 1_000;

export class WriteAudit {
  private chain: Promise<unknown> = Promise.resolve();
  private timer: NodeJS.Timeout | null = null;
  private stopped = false;
  /** whether writes are reported (begin() was called) */
  started = false;
  /** the error of the last background read, reported by the next flush */
  private failure: Error | null = null;

  constructor(
    private readonly client: pg.Client,
    private readonly onWrite: ((write: DbWrite) => void) | undefined,
  ) {}

  /** Skips what the slot holds so far, then reports: on every drain, and every 250 ms to 1 s. */
  async begin(): Promise<void> {
    if (this.started) return;
    await this.drain(true);
    this.started = true;
    this.schedule(BUSY_POLL_MS);
  }

  /** Reads the slot to its end (after any read under way), passing what it finds to onWrite (or not, when `discard`). */
  drain(discard = false): Promise<void> {
    if (!discard && !this.started) return Promise.resolve();
    const run = this.chain.then(async () => {
      if (this.failure) {
        const failure = this.failure;
        this.failure = null;
        throw failure;
      }
      await this.readAll(discard);
    });
    this.chain = run.catch(() => {});
    return run;
  }

  /** Ends the connection (a read under way fails with it). */
  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    await this.client.end().catch(() => {});
  }

  private schedule(delayMs: number): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => {
      this.chain = this.chain
        .then(() => this.readAll(false))
        .then((changes) => this.schedule(changes > 0 ? BUSY_POLL_MS : IDLE_POLL_MS))
        .catch((err: Error) => {
          this.failure = new Error(`reading the audit slot: ${err.message}`);
          this.schedule(IDLE_POLL_MS);
        });
    }, delayMs);
    this.timer.unref();
  }

  /** the number of rows changed that were read */
  private async readAll(discard: boolean): Promise<number> {
    if (this.stopped) return 0;
    // Commits are asynchronous here, and the slot reads only flushed WAL: a synchronous commit of
    // a transaction that wrote (a message, ignored below) flushes everything committed before it.
    await this.client.query(`SELECT pg_logical_emit_message(true, 'svc', '')`);
    let changed = 0;
    for (;;) {
      const read = await this.readOnce(discard);
      changed += read.changed;
      if (read.lines < CHANGES_PER_READ || this.stopped) return changed;
    }
  }

  /** One bounded read of the slot, fetched through a cursor so memory stays bounded too. */
  private async readOnce(discard: boolean): Promise<{ lines: number; changed: number }> {
    const changes = new SlotChanges(discard ? () => {} : (write) => this.emit(write));
    // A change line can be huge (it carries the row): only the start of a long one is needed.
    // Empty transactions are not skipped: test_decoding (15) writes no BEGIN and COMMIT around a
    // transaction whose only changes are messages, which the DDL records are.
    const options = `'include-xids', '1', 'include-timestamp', '1'`;
    const select = `SELECT CASE WHEN octet_length(data) <= 8192 THEN data ELSE left(data, 512) END AS data FROM pg_logical_slot_get_changes('${SLOT}', NULL, ${CHANGES_PER_READ}, ${options})`;
    let lines = 0;
    try {
      const first = await this.client.query(`BEGIN; DECLARE svc_changes NO SCROLL CURSOR FOR ${select}; FETCH ${ROWS_PER_FETCH} FROM svc_changes`);
      let rows: Array<{ data: string }> = lastResult(first)?.rows ?? [];
      for (;;) {
        for (const row of rows) changes.line(row.data);
        lines += rows.length;
        if (rows.length < ROWS_PER_FETCH) break;
        rows = (await this.client.query(`FETCH ${ROWS_PER_FETCH} FROM svc_changes`)).rows;
      }
      await this.client.query('COMMIT');
    } catch (err) {
      await this.client.query('ROLLBACK').catch(() => {});
      throw err;
    }
    changes.end();
    return { lines, changed: changes.changed };
  }

  private emit(write: DbWrite): void {
    try {
      this.onWrite?.(write);
    } catch {
      // a listener's error must not stop the audit
    }
  }
}

/**
 * test_decoding's lines, one transaction at a time:
 *   BEGIN 745
 *   table public.orders: INSERT: id[integer]:1 ...
 *   table public."My Table", audit.log: TRUNCATE: (no-flags)
 *   COMMIT 745 (at 2026-11-25 10:00:00.123456+00)
 */
class SlotChanges {
  /** rows changed, in every transaction read */
  changed = 0;
  private transaction = new Map<string, DbWrite>();
  /** a single-table transaction's record, held to merge the next one into */
  private held: DbWrite | null = null;

  constructor(private readonly emit: (write: DbWrite) => void) {}

  line(text: string): void {
    if (text.startsWith('BEGIN')) {
      this.transaction.clear();
    } else if (text.startsWith('COMMIT')) {
      this.commit(commitTime(text));
    } else if (text.startsWith('table ')) {
      const change = parseChange(text);
      if (!change) return;
      this.changed++;
      for (const table of change.tables) this.count(table, change.operation);
    } else if (text.startsWith(DDL_MESSAGE)) {
      this.changed++;
      const ddl = parseDdl(text.slice(text.indexOf('content:', DDL_MESSAGE.length) + 'content:'.length));
      this.count(ddl.table, 'ddl', ddl.command);
    }
  }

  end(): void {
    if (this.held) this.emit(this.held);
    this.held = null;
  }

  private count(table: string, operation: DbWrite['operation'], command?: string): void {
    const key = `${operation}\0${table}\0${command ?? ''}`;
    const write = this.transaction.get(key);
    const rows = operation === 'truncate' || operation === 'ddl' ? 0 : 1;
    if (write) write.row_count += rows;
    else
      this.transaction.set(key, {
        table,
        operation,
        ...(command === undefined ? {} : { command }),
        row_count: rows,
        transactions: 1,
        rolled_back: false,
        ts: '',
      });
  }

  private commit(ts: string): void {
    const writes = [...this.transaction.values()];
    this.transaction.clear();
    if (!writes.length) return;
    for (const write of writes) write.ts = ts;
    const held = this.held;
    if (writes.length === 1 && held && held.table === writes[0]!.table && held.operation === writes[0]!.operation && held.command === writes[0]!.command) {
      held.row_count += writes[0]!.row_count;
      held.transactions++;
      held.ts = ts;
      return;
    }
    this.end();
    if (writes.length === 1) this.held = writes[0]!;
    else for (const write of writes) this.emit(write);
  }
}

/** test_decoding's line for a message of the DDL event triggers: `message: transactional: 1 prefix: svc_ddl, sz: 57 content:{...}` */
const DDL_MESSAGE = `message: transactional: 1 prefix: ${DDL_PREFIX}, `;

/** The JSON svc_internal.emit_ddl wrote (cut short only past the read's line limit: then what is left). */
function parseDdl(content: string): { table: string; command: string } {
  try {
    const parsed = JSON.parse(content) as { table?: unknown; command?: unknown };
    return { table: String(parsed.table ?? ''), command: String(parsed.command ?? '') };
  } catch {
    return { table: '', command: /"command" : "([^"]*)"/.exec(content)?.[1] ?? '' };
  }
}

const OPERATIONS: Record<string, WriteOperation> = { INSERT: 'insert', UPDATE: 'update', DELETE: 'delete', TRUNCATE: 'truncate' };

/** `table <name>[, <name>...]: <OPERATION>: ...`, names as quote_qualified_identifier writes them. */
function parseChange(text: string): { tables: string[]; operation: WriteOperation } | null {
  const tables: string[] = [];
  let at = 'table '.length;
  for (;;) {
    const schema = readIdentifier(text, at);
    if (!schema || text[schema.end] !== '.') return null;
    const name = readIdentifier(text, schema.end + 1);
    if (!name) return null;
    tables.push(schema.value === 'public' ? name.value : `${schema.value}.${name.value}`);
    at = name.end;
    if (text.startsWith(', ', at)) at += 2;
    else if (text.startsWith(': ', at)) break;
    else return null;
  }
  const operation = OPERATIONS[text.slice(at + 2, text.indexOf(':', at + 2))];
  return operation ? { tables, operation } : null;
}

function readIdentifier(text: string, at: number): { value: string; end: number } | null {
  if (text[at] !== '"') {
    const end = text.slice(at).search(/[.,:]/);
    return end <= 0 ? null : { value: text.slice(at, at + end), end: at + end };
  }
  let value = '';
  let i = at + 1;
  for (;;) {
    const close = text.indexOf('"', i);
    if (close < 0) return null;
    value += text.slice(i, close);
    if (text[close + 1] !== '"') return { value, end: close + 1 };
    value += '"';
    i = close + 2;
  }
}

/** `COMMIT 745 (at 2026-11-25 10:00:00.123456+00)` → ISO; now when the line has no time. */
function commitTime(text: string): string {
  const match = /\(at (\d{4}-\d\d-\d\d) (\d\d:\d\d:\d\d(?:\.\d+)?)([+-]\d\d)(?::?(\d\d))?\)/.exec(text);
  if (!match) return new Date().toISOString();
  const date = new Date(`${match[1]}T${match[2]}${match[3]}:${match[4] ?? '00'}`);
  return Number.isNaN(date.getTime()) ? new Date().toISOString() : date.toISOString();
}
