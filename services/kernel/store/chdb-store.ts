/**
 * The embedded store: ClickHouse in-process through chDB, its data in a directory.
 *
 * One session per process. libchdb binds a single data directory per process: a `Session` on a
 * second path while one is open throws ("only one active data directory per process"), and moving
 * to another path needs `close()` plus `drainPending()` first (close() below does both). A second
 * `Session` on the *same* path shares the engine and is allowed, but buys nothing, so the process
 * opens one ChdbStore at start and closes it on shutdown. Fan-out across cores happens inside the
 * engine (each query or insert runs multi-threaded on the libuv pool), not across sessions.
 *
 * Only the async API is used (queryAsync / queryBindAsync / raw insert), which runs off the event
 * loop: timers and HTTP keep being served during a big insert or query.
 */

import { mkdirSync } from 'node:fs';
import { drainPending, Session } from 'chdb';
import { assertTableName, encodeJsonEachRow, normalizeParams, parseJsonEachRow } from './encoding.ts';
import { migrate, MIGRATIONS_DIR } from './migrations.ts';
import type { QueryParams, Store } from './store.ts';

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
const CONNECTION_ARGS = [
  '--output_format_json_quote_64bit_integers=1',
  '--session_timezone=UTC',
  '--async_load_databases=0',
];

export class ChdbStore implements Store {
  readonly kind = 'chdb' as const;
  readonly path: string;
  private session: Session | undefined;
  private readonly migrationsDir: string;

  constructor(options: ChdbStoreOptions) {
    this.path = options.path;
    this.migrationsDir = options.migrationsDir ?? MIGRATIONS_DIR;
    mkdirSync(options.path, { recursive: true });
    this.session = new Session(options.path, { connectionArgs: CONNECTION_ARGS });
  }

  migrate(): Promise<string[]> {
    return migrate(this, this.migrationsDir);
  }

  async query<T = Record<string, unknown>>(sql: string, params?: QueryParams): Promise<T[]> {
    const result = await this.run(sql, params);
    return parseJsonEachRow<T>(result);
  }

  async command(sql: string, params?: QueryParams): Promise<void> {
    await this.run(sql, params);
  }

  async insert(table: string, rows: ReadonlyArray<Record<string, unknown>>): Promise<void> {
    if (rows.length === 0) return;
    assertTableName(table);
    // Raw passthrough: the payload is handed over as bytes and parsed by the engine's
    // multi-threaded JSONEachRow parser; no SQL text is built from the values.
    const payload = await encodeJsonEachRow(rows);
    await this.open().insert({ table, values: payload, format: 'JSONEachRow' });
  }

  async ping(): Promise<boolean> {
    try {
      const rows = await this.query<{ ok: number }>('SELECT 1 AS ok');
      return rows[0]?.ok === 1;
    } catch {
      return false;
    }
  }

  /** Closes the session and waits until the engine has really let go of the directory. */
  async close(): Promise<void> {
    const session = this.session;
    if (!session) return;
    this.session = undefined;
    session.close();
    await drainPending();
  }

  private open(): Session {
    if (!this.session) throw new Error(`chdb store at ${this.path} is closed`);
    return this.session;
  }

  private async run(sql: string, params: QueryParams | undefined): Promise<string> {
    const session = this.open();
    const bound = normalizeParams(params);
    const result = bound
      ? await session.queryBindAsync(sql, bound, { format: 'JSONEachRow' })
      : await session.queryAsync(sql, { format: 'JSONEachRow' });
    return result.text();
  }
}
