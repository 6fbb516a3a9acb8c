/**
 * Runs the analysts' queries of the SQL endpoint (routes/sql.ts): the text checked (check.ts),
 * the URL's settings vetted and the limits enforced (settings.ts), at most MAX_CONCURRENT at
 * once per process, and the engine's bytes handed back untouched, except Native re-framed for a
 * client that announces `client_protocol_version` (native.ts).
 */
import type { Config } from '../../kernel/config.ts';
import { hasRawQuery, StoreQueryError, type RawQuery, type RawQueryStore, type RawResult, type Store } from '../../kernel/store/store.ts';
import { checkQuery, denyTableFunctions } from './check.ts';
import { nativeForRevision } from './native.ts';
import { queryText } from './query-text.ts';
import { querySettings } from './settings.ts';
import { fromEngineError, SqlError } from './sql-errors.ts';

/** Analyst queries at once per process; past it, 429 with ClickHouse's TOO_MANY_SIMULTANEOUS_QUERIES. */
const MAX_CONCURRENT = 4;

/** One request's query: its URL parameters, its POST body's text, its id. */
export interface SqlRequest {
  params: URLSearchParams;
  body: string;
  queryId: string;
}

/** A query's result: the bytes to send, in `format`, and what the engine read. */
export interface SqlResult {
  bytes: Uint8Array;
  format: string;
  stats: Omit<RawResult, 'bytes'>;
}

/** The output options of ClickHouse's HTTP interface; a bad one is a SqlError. */
function outputOptions(params: URLSearchParams): { defaultFormat: string; revision: number; database: string | undefined } {
  for (const flag of ['compress', 'decompress']) {
    if (params.has(flag) && params.get(flag) !== '0') {
      throw new SqlError(
        48,
        'NOT_IMPLEMENTED',
        `${flag}=1 (ClickHouse's native block compression) is not supported here: use HTTP compression (enable_http_compression=1 with Accept-Encoding: gzip)`,
        400,
      );
    }
  }
  const defaultFormat = params.get('default_format') || 'TabSeparated';
  if (!/^[A-Za-z0-9_]+$/.test(defaultFormat)) throw new SqlError(73, 'UNKNOWN_FORMAT', `Unknown format ${JSON.stringify(defaultFormat)}`);
  const revision = params.get('client_protocol_version') ?? '0';
  if (!/^\d{1,9}$/.test(revision))
    throw new SqlError(27, 'CANNOT_PARSE_INPUT_ASSERTION_FAILED', `Cannot parse client_protocol_version ${JSON.stringify(revision)} as a number`);
  return { defaultFormat, revision: Number(revision), database: params.get('database') || undefined };
}

export class AnalystQueries {
  private inFlight = 0;
  /** The engine's setting names and table functions, read once (the engine knows what it has). */
  private catalog: Promise<ReadonlySet<string>> | undefined;

  constructor(
    private readonly store: Store,
    private readonly config: Config,
  ) {}

  /** The store's raw query path; NOT_IMPLEMENTED (501) when it has none. */
  engine(): RawQueryStore {
    if (!hasRawQuery(this.store)) throw new SqlError(48, 'NOT_IMPLEMENTED', 'This store does not serve SQL queries', 501);
    return this.store;
  }

  /** Checks and runs one query; every refusal and engine error is a SqlError. */
  async run({ params, body, queryId }: SqlRequest): Promise<SqlResult> {
    const sql = queryText(params.get('query') ?? '', body);
    const checked = checkQuery(sql);
    const { defaultFormat, revision, database } = outputOptions(params);
    const { config } = this;
    const limits = { max_execution_time: config.sqlMaxExecutionTime / 1000, max_memory_usage: config.sqlMaxMemory, max_result_bytes: config.sqlMaxResultBytes };
    const { settings, queryParams } = querySettings(params, await this.knownSettings(), limits);
    const { bytes, ...stats } = await this.execute({ sql, format: defaultFormat, settings, params: queryParams, database, queryId });
    const format = checked.format ?? defaultFormat;
    return { bytes: /^Native$/i.test(format) && revision > 0 ? nativeForRevision(bytes, revision) : bytes, format, stats };
  }

  private async execute(query: RawQuery): Promise<RawResult> {
    if (this.inFlight >= MAX_CONCURRENT) {
      throw new SqlError(
        202,
        'TOO_MANY_SIMULTANEOUS_QUERIES',
        `Too many simultaneous queries: at most ${MAX_CONCURRENT} SQL queries run at once; retry shortly`,
        429,
      );
    }
    this.inFlight++;
    try {
      return await this.engine().rawQuery(query);
    } catch (err) {
      if (err instanceof StoreQueryError) throw fromEngineError(err.clickhouseCode, err.message);
      throw err;
    } finally {
      this.inFlight--;
    }
  }

  private knownSettings(): Promise<ReadonlySet<string>> {
    this.catalog ??= (async () => {
      const [settings, functions] = await Promise.all([
        this.store.query<{ name: string }>('SELECT name FROM system.settings'),
        this.store.query<{ name: string }>('SELECT name FROM system.table_functions').catch(() => []),
      ]);
      denyTableFunctions(functions.map((f) => f.name));
      return new Set(settings.map((s) => s.name));
    })();
    this.catalog.catch(() => (this.catalog = undefined));
    return this.catalog;
  }
}
