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
