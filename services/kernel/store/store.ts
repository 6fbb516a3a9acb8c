/**
 * The store seam: ClickHouse, one SQL dialect, two transports. `chdb` runs ClickHouse in-process
 * with its data in the data dir (the embedded default); `clickhouse` talks to a server over HTTP
 * (SVC_CLICKHOUSE_URL). Queries take bound parameters in ClickHouse's `{name:Type}` syntax and
 * are never assembled from input.
 */

export type QueryParams = Record<string, unknown>;

export interface Store {
  readonly kind: 'chdb' | 'clickhouse';
  /** Applies the numbered migrations in kernel/store/migrations not yet applied; returns their names. */
  migrate(): Promise<string[]>;
  /** Runs a SELECT and returns its rows as objects (JSONEachRow semantics; 64-bit ints as strings). */
  query<T = Record<string, unknown>>(sql: string, params?: QueryParams): Promise<T[]>;
  /** Runs a statement that returns no rows (DDL, ALTER, ...). */
  command(sql: string, params?: QueryParams): Promise<void>;
  /** Inserts rows, one object per row keyed by column name, as one INSERT. */
  insert(table: string, rows: ReadonlyArray<Record<string, unknown>>): Promise<void>;
  /** True when the store answers a trivial query. */
  ping(): Promise<boolean>;
  close(): Promise<void>;
}

/**
 * An analyst's query on the SQL endpoint (services/api/routes/sql.ts, docs/analysts.md). The caller
 * vets the SQL and the settings; the store runs it apart from the service's own reads and writes
 * and hands back the engine's bytes untouched.
 */
export interface RawQuery {
  sql: string;
  /** Output format when the SQL has no FORMAT clause (ClickHouse's `default_format`). */
  format: string;
  /**
   * Settings of this query, applied in this order: the caller puts the enforced ones (readonly,
   * limits) last, so that they win.
   */
  settings: ReadonlyArray<readonly [name: string, value: string]>;
  /** `{name:Type}` parameters, as ClickHouse's text form (`param_<name>` URL parameters). */
  params: Record<string, string>;
  /** Database of unqualified table names; the store's own when absent. */
  database?: string;
  queryId: string;
}

export interface RawResult {
  bytes: Uint8Array;
  rowsRead: number;
  bytesRead: number;
  elapsedMs: number;
}

/** A query the engine refused or failed: ClickHouse's error code and its `Code: N. DB::Exception: ...` text. */
export class StoreQueryError extends Error {
  constructor(
    readonly clickhouseCode: number,
    message: string,
  ) {
    super(message);
    this.name = 'StoreQueryError';
  }
}

/** A setting name as it may be passed to an engine (`--name=value`, a URL parameter). */
export const SETTING_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

/**
 * Rows handed to the engine as one block in ClickHouse's Native format (sink/trace-event-block.ts),
 * as its parts in order: `columns` name the block's columns. The sink stores trace events this way on chDB,
 * with no JS object per row and no expression for the engine to plan (docs/performance.md, "Trace ingest").
 */
export interface NativeInsert {
  table: string;
  columns: readonly string[];
  block: readonly Buffer[];
}

/** A store that takes Native blocks (chDB; the Debian server's 18.16 has no Map type for them). */
export interface NativeInsertStore {
  insertNative(insert: NativeInsert): Promise<void>;
}

export function readsNative(store: Store): store is Store & NativeInsertStore {
  return typeof (store as Partial<NativeInsertStore>).insertNative === 'function';
}

/** The raw query path both adapters implement (kept apart from Store so tests' fakes need not). */
export interface RawQueryStore {
  rawQuery(query: RawQuery): Promise<RawResult>;
}

export function hasRawQuery(store: Store): store is Store & RawQueryStore {
  return typeof (store as Partial<RawQueryStore>).rawQuery === 'function';
}
