/**
 * The embedded store: ClickHouse in-process through chDB, its data in a directory.
 *
 * One data directory per process. libchdb binds a single data directory per process: a `Session`
 * on a second path while one is open throws ("only one active data directory per process"), and
 * moving to another path needs every session closed plus `drainPending()` first (close() below
 * does both). So the process opens one ChdbStore at start and closes it on shutdown.
 *
 * Lanes. Calls on one `Session` run one at a time (measured: a `SELECT 1` waited 650 ms
 * behind a heavy query on the same session, 3 ms on a second one). Sessions on the *same* path
 * share the engine and may coexist, so this store opens READ_LANES readers for queries, so API
 * reads never queue behind a batch insert and two reads overlap, and INSERT_LANES writers: DDL
 * runs on the first, inserts go to the least busy one, so two inserts really overlap (one insert
 * lane tops out near 50k trace rows/s here; two reach 90-120k). A write is visible to every
 * reader as soon as its promise resolves (same engine, same tables; the contract tests read
 * right after writing). Query parameters are put into the SQL text (inline-params.ts): the
 * library runs bound queries one at a time in the whole process.
 *
 * Only the async API is used (queryAsync / queryBindAsync / raw insert), which runs off the event
 * loop: timers and HTTP keep being served during a big insert or query. Rows are serialised in
 * slices with yields between them (encoding.ts) for the same reason.
 */

import { mkdirSync, rmSync } from 'node:fs';
import { open as openFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { drainPending, Session } from 'chdb';
import pLimit from 'p-limit';
import { assertTableName, encodeJsonCompactEachRow, parseJsonEachRow } from './encoding.ts';
import { inlineParams, quoteString } from './inline-params.ts';
import { migrate, MIGRATIONS_DIR } from './migrations.ts';
import {
  SETTING_NAME,
  StoreQueryError,
  type NativeInsert,
  type NativeInsertStore,
  type QueryParams,
  type RawQuery,
  type RawQueryStore,
  type RawResult,
  type Store,
} from './store.ts';

export interface ChdbStoreOptions {
  /** Directory of the persistent chDB database (created if missing). */
  path: string;
  /** Where the numbered migrations live. @default kernel/store/migrations */
  migrationsDir?: string;
}

/**
 * Engine arguments fixed at connect (they are not all settings a query could SET):
 * 64-bit integers quoted in JSON output (the contract of Store.query, and what a ClickHouse
 * server answers over HTTP by default); UTC as the session time zone, so a DateTime string means
 * the same instant here and on a server configured in UTC (infra/clickhouse/config.xml);
 * databases loaded before the first query rather than in the background.
 */
const CONNECTION_ARGS = ['--output_format_json_quote_64bit_integers=1', '--session_timezone=UTC', '--async_load_databases=0'];

/**
 * The service's own sessions. Their parameters are in the SQL text (inline-params.ts), and a
 * trace's resolution names up to 10,000 span ids (about 400 KB), past the parser's 256 KiB
 * default. Skip indexes are applied when the query is planned, not while its parts are read
 * (chDB 26.7's default): the service's filtered reads are bloom-filter lookups (a trace, a
 * sandbox, an experiment), and over 10M events as filled GET /v1/traces/:id went from p50
 * 71-98 to 56-60 ms, the experiment and sandbox filters from 33-49 to 26-30 ms.
 */
const SERVICE_ARGS = [...CONNECTION_ARGS, '--max_query_size=67108864', '--use_skip_indexes_on_data_read=0'];

/** Reader sessions; reads beyond this many at once queue on a lane. */
const READ_LANES = 2;
/** Writer sessions; inserts beyond this many at once queue on a lane. */
const INSERT_LANES = 2;

/** libuv's thread pool as this process was started with it (bin/threadpool.cjs; libuv's default is 4, its maximum 1024). */
function threadPoolSize(): number {
  const size = Number(process.env.UV_THREADPOOL_SIZE);
  return Number.isInteger(size) && size >= 1 ? Math.min(size, 1024) : 4;
}

/**
 * Engine calls running at once, process-wide. Each holds one of libuv's threads until its query
 * ends (chDB's async API), and the same pool runs the file system: four long analyst queries on
 * the default pool of 4 held every thread, and the log's appends waited 27 s behind them. Two
 * threads always stay for the file system, DNS and zlib.
 */
const engineCall = pLimit(Math.max(2, threadPoolSize() - 2));

/**
 * A block's parts into `file` in one writev (libuv splits at IOV_MAX and finishes partial
 * writes), never joined in memory: writeFile made one write, and one trip through libuv's pool,
 * per part (about 70 per block of trace events). Opening with O_TRUNC keeps an idle file's inode.
 */
async function writeParts(file: string, parts: readonly Buffer[]): Promise<void> {
  const handle = await openFile(file, 'w');
  try {
    const { bytesWritten } = await handle.writev(parts as Buffer[]);
    const size = parts.reduce((n, part) => n + part.length, 0);
    if (bytesWritten !== size) throw new Error(`${file}: wrote ${bytesWritten} of ${size} bytes`);
  } finally {
    await handle.close();
  }
}

export class ChdbStore implements Store, RawQueryStore, NativeInsertStore {
  readonly kind = 'chdb' as const;
  readonly path: string;
  private lanes: { readers: Lanes; writers: Lanes } | undefined;
  private readonly migrationsDir: string;
  /** Where insertNative puts a block for the engine to read; emptied at open (a crash leaves some). */
  private readonly inbox: string;
  /**
   * Inbox files not in use, written over by the next insert: a file made and removed per insert
   * cost an inode each, and on an ext4 without a journal (these machines) every new inode scans
   * past the ones removed in the last minutes (measured in one profile of trace ingest: 12% of
   * the service's CPU in the kernel's inode allocation, the parts' files and these together).
   */
  private readonly idleInboxFiles: string[] = [];
  private inboxFiles = 0;

  constructor(options: ChdbStoreOptions) {
    this.path = options.path;
    this.migrationsDir = options.migrationsDir ?? MIGRATIONS_DIR;
    mkdirSync(options.path, { recursive: true });
    // Absolute: the engine resolves a relative file() path against its own directory.
    this.inbox = resolve(options.path, 'svc-native-inserts');
    rmSync(resolve(options.path, 'svc-avro-inserts'), { recursive: true, force: true }); // the inbox's name before 2026-12-01
    rmSync(this.inbox, { recursive: true, force: true });
    mkdirSync(this.inbox);
    const sessions: Session[] = [];
    try {
      for (let i = 0; i < READ_LANES + INSERT_LANES; i++) sessions.push(new Session(options.path, { connectionArgs: SERVICE_ARGS }));
    } catch (err) {
      for (const session of sessions) session.close();
      throw err;
    }
    this.lanes = { readers: new Lanes(sessions.slice(0, READ_LANES)), writers: new Lanes(sessions.slice(READ_LANES)) };
  }

  migrate(): Promise<string[]> {
    return migrate(this, this.migrationsDir);
  }

  async query<T = Record<string, unknown>>(sql: string, params?: QueryParams): Promise<T[]> {
    const result = await this.open().readers.run((reader) => run(reader, sql, params));
    return parseJsonEachRow<T>(result);
  }

  async command(sql: string, params?: QueryParams): Promise<void> {
    await run(this.open().writers.sessions[0], sql, params);
  }

  /** Per table, its Nullable columns: an empty value there is not the column's default. */
  private readonly nullable = new Map<string, Promise<ReadonlySet<string>>>();

  private nullableColumns(table: string): Promise<ReadonlySet<string>> {
    let columns = this.nullable.get(table);
    if (!columns) {
      columns = this.query<{ name: string }>(
        "SELECT name FROM system.columns WHERE database = currentDatabase() AND table = {table:String} AND type LIKE 'Nullable(%'",
        { table },
      ).then((rows) => new Set(rows.map((r) => r.name)));
      columns.catch(() => this.nullable.delete(table));
      this.nullable.set(table, columns);
    }
    return columns;
  }

  async insert(table: string, rows: ReadonlyArray<Record<string, unknown>>): Promise<void> {
    if (rows.length === 0) return;
    assertTableName(table);
    // Raw passthrough: the payload is handed over as bytes and parsed by the engine's
    // multi-threaded JSONEachRow parser; no SQL text is built from the values.
    const { columns, payload } = await encodeJsonCompactEachRow(rows, await this.nullableColumns(table));
    await this.open().writers.run((writer) => engineCall(() => writer.insert({ table, values: payload, columns, format: 'JSONCompactEachRow' })));
  }

  /**
   * The raw insert takes text formats only, so the block goes through a file the engine's
   * `file()` reads (the analysts' SQL endpoint refuses that function; only the service calls it).
   * The SELECT has no expressions: planning it costs ~2 ms, not the ~20 ms of a mapping in SQL.
   */
  async insertNative({ table, columns, block }: NativeInsert): Promise<void> {
    assertTableName(table);
    for (const column of columns) assertTableName(column);
    const file = this.idleInboxFiles.pop() ?? join(this.inbox, `${this.inboxFiles++}.native`);
    try {
      await writeParts(file, block);
      // optimize_on_insert = 0: the engine does not collapse a block's own duplicate keys on
      // insert (ReplacingMergeTree), which cost 8-21% of its CPU per row at the sink's block sizes
      // (chdb-direct.ts ceiling, 3,400-row blocks, five pairs); replays never reach an insert (the
      // sink skips them) and readers that must not see a duplicate dedupe across parts anyway.
      const sql = `INSERT INTO ${table} (${columns.join(', ')}) SELECT * FROM file(${quoteString(file)}, 'Native') SETTINGS optimize_on_insert = 0`;
      await this.open().writers.run((writer) => engineCall(() => writer.queryAsync(sql, { format: 'TabSeparated' })));
    } finally {
      this.idleInboxFiles.push(file);
    }
  }

  async ping(): Promise<boolean> {
    try {
      const rows = await this.query<{ ok: number }>('SELECT 1 AS ok');
      return rows[0]?.ok === 1;
    } catch {
      return false;
    }
  }

  /**
   * An analyst's query (the SQL endpoint) on a session of its own, opened for this query and
   * closed after it: it never queues behind the reader or the writers, nor they behind it. The
   * query's settings are the session's engine arguments, the caller's enforced ones last (the last
   * occurrence of a setting wins; measured on chDB 3.4: arguments are per session, a second
   * session's settings are untouched, and opening one costs 0.1-3 ms). Returns the engine's bytes
   * in the asked format, untouched.
   */
  async rawQuery(query: RawQuery): Promise<RawResult> {
    this.open();
    const args = [...CONNECTION_ARGS];
    for (const [name, value] of query.settings) {
      if (!SETTING_NAME.test(name) || /[\0\r\n]/.test(value))
        throw new StoreQueryError(115, `Code: 115. DB::Exception: Invalid setting ${JSON.stringify(name)}. (UNKNOWN_SETTING)`);
      args.push(`--${name}=${value}`);
    }
    const session = new Session(this.path, { connectionArgs: args });
    const started = performance.now();
    try {
      if (query.database !== undefined) await engineCall(() => session.queryAsync(`USE ${quoteIdentifier(query.database!)}`, { format: 'TabSeparated' }));
      const params = Object.keys(query.params).length > 0 ? query.params : undefined;
      const result = await engineCall(() =>
        params ? session.queryBindAsync(query.sql, params, { format: query.format }) : session.queryAsync(query.sql, { format: query.format }),
      );
      return { bytes: result.bytes(), rowsRead: result.rowsRead, bytesRead: result.bytesRead, elapsedMs: performance.now() - started };
    } catch (err) {
      const code = (err as { clickhouseCode?: unknown }).clickhouseCode;
      if (typeof code === 'number') throw new StoreQueryError(code, (err as Error).message);
      throw err;
    } finally {
      session.close();
    }
  }

  /** Closes every session and waits until the engine has really let go of the directory. Idempotent. */
  async close(): Promise<void> {
    const lanes = this.lanes;
    if (!lanes) return;
    this.lanes = undefined;
    for (const session of [...lanes.readers.sessions, ...lanes.writers.sessions]) session.close();
    await drainPending();
  }

  private open(): { readers: Lanes; writers: Lanes } {
    if (!this.lanes) throw new Error(`chdb store at ${this.path} is closed`);
    return this.lanes;
  }
}

/** Sessions taking calls, each call on the least busy one. */
class Lanes {
  private readonly busy: number[];

  constructor(readonly sessions: Session[]) {
    this.busy = sessions.map(() => 0);
  }

  async run<T>(call: (session: Session) => Promise<T>): Promise<T> {
    const lane = this.busy.indexOf(Math.min(...this.busy));
    this.busy[lane]++;
    try {
      return await call(this.sessions[lane]);
    } finally {
      this.busy[lane]--;
    }
  }
}

/** A ClickHouse identifier in backquotes. */
function quoteIdentifier(name: string): string {
  return `\`${name.replace(/\\/g, '\\\\').replace(/`/g, '\\`')}\``;
}

async function run(session: Session, sql: string, params: QueryParams | undefined): Promise<string> {
  const text = inlineParams(sql, params);
  const result = await engineCall(() => session.queryAsync(text, { format: 'JSONEachRow' }));
  return result.text();
}
