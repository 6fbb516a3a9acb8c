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
import type { QueryParams, Store } from './store.ts';

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

export class ClickHouseStore implements Store {
  readonly kind = 'clickhouse' as const;
  private readonly client: ClickHouseClient;
  private readonly migrationsDir: string;
  private readonly host: string;

  constructor(options: ClickHouseStoreOptions) {
    this.migrationsDir = options.migrationsDir ?? MIGRATIONS_DIR;
    const url = new URL(options.url);
    this.host = `${url.protocol}//${url.host}`; // for messages: never the credentials
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
