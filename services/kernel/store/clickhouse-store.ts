/**
 * The distributed store: a ClickHouse server over HTTP through `@clickhouse/client`.
 *
 * Same dialect and same shapes as the chDB store (see encoding.ts): rows go in as the same
 * JSONEachRow bytes (the client serialises them with our encodeRow) and come back as JSONEachRow
 * with 64-bit integers quoted. With this configuration the client adds no setting of its own
 * beyond the one below (no compression, no wait_end_of_query), which is why 18.16 accepts it. Bound parameters travel as `param_<name>` URL
 * parameters (ClickHouse >= 19.15); a call without parameters sends none, so plain statements
 * also work against an old server (Debian's 18.16, used for the transport test), which rejects
 * `param_*` as unknown settings.
 *
 * The URL carries credentials and database: `http://user:pass@host:8123/db`. The server should
 * run in UTC (`<timezone>UTC</timezone>`, as infra/clickhouse/config.xml), so that DateTime text
 * means the same instant as in chDB, which runs its session in UTC.
 */

import { Readable } from 'node:stream';
import { ClickHouseLogLevel, createClient, type ClickHouseClient } from '@clickhouse/client';
import { AppError } from '../errors.ts';
import { assertTableName, encodeRow, normalizeParams, parseJsonEachRow } from './encoding.ts';
import { migrate, MIGRATIONS_DIR } from './migrations.ts';
import { StoreQueryError, type QueryParams, type RawQuery, type RawQueryStore, type RawResult, type Store } from './store.ts';

export interface ClickHouseStoreOptions {
  /** `http[s]://user:pass@host:port/database` */
  url: string;
  /** Where the numbered migrations live. @default kernel/store/migrations */
  migrationsDir?: string;
  /** Per-request timeout in ms. @default 30000 */
  requestTimeoutMs?: number;
}

/** Network-level failures: the server is unreachable, the call may succeed later. */
const UNAVAILABLE = new Set(['ECONNREFUSED', 'ECONNRESET', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENOTFOUND', 'EPIPE', 'EAI_AGAIN']);

export class ClickHouseStore implements Store, RawQueryStore {
  readonly kind = 'clickhouse' as const;
  private readonly client: ClickHouseClient;
  private readonly migrationsDir: string;
  private readonly host: string;
  private readonly database: string;

  constructor(options: ClickHouseStoreOptions) {
    this.migrationsDir = options.migrationsDir ?? MIGRATIONS_DIR;
    const url = new URL(options.url);
    this.host = `${url.protocol}//${url.host}`; // for messages: never the credentials
    this.database = decodeURIComponent(url.pathname.replace(/^\/+|\/+$/g, '')) || 'default';
    this.client = createClient({
      url: options.url,
      request_timeout: options.requestTimeoutMs ?? 30_000,
      // Sent with every request as a URL setting (18.16 knows it too). Set explicitly on both
      // adapters, whatever the defaults (chDB 26.7's is 0), so the shapes cannot drift.
      clickhouse_settings: { output_format_json_quote_64bit_integers: 1 },
      // Failures reach the caller as rejections and are logged there, with tenant context.
      log: { level: ClickHouseLogLevel.OFF },
      json: { parse: JSON.parse, stringify: (value: unknown) => encodeRow(value as Record<string, unknown>) },
    });
  }

  migrate(): Promise<string[]> {
    return migrate(this, this.migrationsDir);
  }

  async query<T = Record<string, unknown>>(sql: string, params?: QueryParams): Promise<T[]> {
    return this.call(async () => {
      const result = await this.client.query({ query: sql, format: 'JSONEachRow', ...boundParams(params) });
      return parseJsonEachRow<T>(await result.text());
    });
  }

  async command(sql: string, params?: QueryParams): Promise<void> {
    await this.call(() => this.client.command({ query: sql, ...boundParams(params) }));
  }

  async insert(table: string, rows: ReadonlyArray<Record<string, unknown>>): Promise<void> {
    if (rows.length === 0) return;
    assertTableName(table);
    // The client serialises each row with `json.stringify` below, i.e. encodeRow: the same
    // bytes chDB gets. The rows go as an object-mode stream, so a big batch is encoded and sent
    // piecemeal rather than in one event-loop-blocking join (a raw byte stream is refused by the
    // client for JSON formats).
    await this.call(() => this.client.insert({ table, values: Readable.from(rows), format: 'JSONEachRow' }));
  }

  /**
   * An analyst's query (the SQL endpoint), proxied to the server as one HTTP request: the settings
   * as URL settings (the enforced readonly and limits last, so they win; the server checks them
   * all against the configured user's constraints before applying any), the parameters as
   * `param_<name>`, the result bytes as the server sent them. The server's `database` is the one
   * of SVC_CLICKHOUSE_URL; another one is refused (qualify tables as `db.table` instead).
   */
  async rawQuery(query: RawQuery): Promise<RawResult> {
    if (query.database !== undefined && query.database !== this.database) {
      throw new StoreQueryError(
        81,
        `Code: 81. DB::Exception: Database ${query.database} is not served here: this endpoint queries ${this.database} on the ClickHouse server; qualify tables as db.table. (UNKNOWN_DATABASE)`,
      );
    }
    const settings: Record<string, string> = {};
    for (const [name, value] of query.settings) settings[name] = value;
    settings.default_format = query.format;
    const started = performance.now();
    try {
      const result = await this.call(() =>
        this.client.exec({
          query: query.sql,
          query_id: query.queryId,
          clickhouse_settings: settings as never,
          ...(Object.keys(query.params).length > 0 ? { query_params: query.params } : {}),
        }),
      );
      const chunks: Buffer[] = [];
      for await (const chunk of result.stream) chunks.push(Buffer.isBuffer(chunk) ? chunk : Buffer.from(chunk as Uint8Array));
      const summary = result.summary ?? {};
      return {
        bytes: Buffer.concat(chunks),
        rowsRead: Number((summary as { read_rows?: string }).read_rows ?? 0),
        bytesRead: Number((summary as { read_bytes?: string }).read_bytes ?? 0),
        elapsedMs: performance.now() - started,
      };
    } catch (err) {
      // A modern server's error carries its code; an old one's (18.16) only says it in the text.
      const code = Number((err as { code?: unknown }).code ?? /^Code: (\d+)/.exec(err instanceof Error ? err.message : '')?.[1]);
      if (err instanceof Error && !(err instanceof AppError) && Number.isInteger(code) && code > 0) {
        const type = (err as { type?: unknown }).type;
        // 18.16 writes `Code: N, e.displayText() = DB::Exception: <text>, e.what() = DB::Exception`.
        const old = /^Code: \d+, e\.displayText\(\) = DB::Exception: (.*?)(?:, e\.what\(\) = .*)?$/s.exec(err.message);
        const text = old
          ? `Code: ${code}. DB::Exception: ${old[1]}`
          : /^Code: \d+\./.test(err.message)
            ? err.message
            : `Code: ${code}. DB::Exception: ${err.message}${typeof type === 'string' && !err.message.includes(`(${type})`) ? ` (${type})` : ''}`;
        throw new StoreQueryError(code, text);
      }
      throw err;
    }
  }

  async ping(): Promise<boolean> {
    const result = await this.client.ping();
    return result.success;
  }

  async close(): Promise<void> {
    await this.client.close();
  }

  private async call<R>(fn: () => Promise<R>): Promise<R> {
    try {
      return await fn();
    } catch (err) {
      const code = (err as { code?: unknown }).code;
      if (typeof code === 'string' && UNAVAILABLE.has(code)) {
        throw new AppError('unavailable', `ClickHouse at ${this.host} is unreachable (${code})`, { cause: err });
      }
      throw err;
    }
  }
}

function boundParams(params: QueryParams | undefined): { query_params?: Record<string, unknown> } {
  const bound = normalizeParams(params);
  return bound ? { query_params: bound } : {};
}
