/**
 * The analysts' SQL endpoint, `/v1/admin/sql`: read-only SQL over the service's ClickHouse tables
 * speaking enough of ClickHouse's HTTP interface for curl, @clickhouse/client and Grafana's
 * ClickHouse plugin (clickhouse-go, protocol HTTP). docs/analysts.md is the user documentation.
 *
 * - Queries: `GET ?query=`, a POST body, or both (the URL's query, a newline, then the body, as
 *   ClickHouse joins them). One statement; SELECT, WITH, SHOW, DESCRIBE, EXPLAIN, EXISTS only.
 * - Output: the FORMAT clause, else `default_format`, else TabSeparated; the engine's bytes are
 *   sent untouched, except Native for a client that announces `client_protocol_version` (see
 *   sql/native.ts). `enable_http_compression=1` with `Accept-Encoding` gzip, deflate or br
 *   compresses the response; a gzip, deflate or br request body is decompressed.
 * - Settings from URL parameters (known settings only; the ones that would lift the limits or the
 *   read-only mode are refused), `param_<name>` bound into `{name:Type}`, `database`, `query_id`.
 * - Auth: the admin key, as ClickHouse clients send a password (Basic auth with any user,
 *   X-ClickHouse-User/X-ClickHouse-Key, `user`/`password` URL parameters) or as a Bearer token.
 * - Errors: ClickHouse's `Code: N. DB::Exception: ...` text, its HTTP statuses, and the
 *   X-ClickHouse-Exception-Code header.
 * - Each query runs with readonly=1, max_execution_time, max_memory_usage and max_result_bytes
 *   from SVC_SQL_*; on chDB in a session of its own (never queuing behind the API's reads or the
 *   sink's inserts), on a ClickHouse server as one proxied request with the same settings.
 *
 * It is mounted in app.ts before the JSON body parser, the JSON error renderer and the per-key
 * rate limits, which do not apply to it (it is an operator's endpoint, like /v1/admin/*).
 */
import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import { promisify } from 'node:util';
import zlib from 'node:zlib';
import type { Context, Next } from 'koa';
import type { Kernel } from '../../kernel/actor.ts';
import type { Auth } from '../../kernel/auth.ts';
import { AppError } from '../../kernel/errors.ts';
import { hasRawQuery, SETTING_NAME, StoreQueryError } from '../../kernel/store/store.ts';
import { checkQuery, denyTableFunctions } from '../sql/check.ts';
import { fromEngineError, renderSqlError, SqlError } from '../sql/sql-errors.ts';
import { nativeForRevision } from '../sql/native.ts';

export const SQL_PATH = '/v1/admin/sql';

/** Largest query text (URL query plus body) accepted. */
const MAX_QUERY_BYTES = 1 << 20;
/** Analyst queries at once per process; past it, 429 with ClickHouse's TOO_MANY_SIMULTANEOUS_QUERIES. */
const MAX_CONCURRENT = 4;

/** URL parameters of ClickHouse's HTTP interface that are not settings. */
const RESERVED = new Set([
  'query', 'database', 'default_format', 'user', 'password', 'quota_key', 'query_id', 'session_id', 'session_timeout',
  'session_check', 'compress', 'decompress', 'client_protocol_version', 'buffer_size', 'wait_end_of_query', 'enable_http_compression',
  'http_zlib_compression_level', 'role',
]);

/** Settings a URL may not change: they would lift the read-only mode or the limits, or write logs. */
const DENIED_SETTINGS = /^(allow_ddl|allow_introspection_functions|max_memory_usage_for_user|max_untracked_memory|memory_.*|.*overcommit.*|max_server_memory_usage.*|max_concurrent_queries.*|send_logs_.*|log_.*|opentelemetry_.*|profile|user_files_path)$/;

const BINARY_FORMATS = /^(Native|RowBinary.*|Parquet|Arrow|ArrowStream|ORC|Avro|Protobuf.*|CapnProto|MsgPack|BSONEachRow|Npy|Buffers)$/i;

function contentType(format: string): string {
  if (BINARY_FORMATS.test(format)) return 'application/octet-stream';
  if (/^(JSON|JSONCompact|JSONStrings|JSONCompactStrings|JSONColumns|JSONCompactColumns|JSONColumnsWithMetadata|JSONObjectEachRow|PrettyJSONEachRow)$/i.test(format)) return 'application/json; charset=UTF-8';
  if (/EachRow|^JSONLines$|^NDJSON$/i.test(format)) return 'application/x-ndjson; charset=UTF-8';
  if (/^(TabSeparated|TSV)/i.test(format)) return 'text/tab-separated-values; charset=UTF-8';
  if (/^CSV/i.test(format)) return 'text/csv; charset=UTF-8; header=absent';
  if (/^XML$/i.test(format)) return 'application/xml; charset=UTF-8';
  return 'text/plain; charset=UTF-8';
}

interface Credentials {
  token: string | undefined;
  how: string;
}

/** The key as a ClickHouse client sends a password, or a Bearer token. */
function credentials(ctx: Context, params: URLSearchParams): Credentials {
  const header = ctx.get('Authorization');
  const bearer = /^Bearer\s+(\S+)\s*$/i.exec(header)?.[1];
  if (bearer !== undefined) return { token: bearer, how: 'bearer' };
  const basic = /^Basic\s+([A-Za-z0-9+/=]+)\s*$/i.exec(header)?.[1];
  if (basic !== undefined) {
    const decoded = Buffer.from(basic, 'base64').toString('utf8');
    const colon = decoded.indexOf(':');
    return { token: colon >= 0 ? decoded.slice(colon + 1) : '', how: 'basic' };
  }
  if (header) return { token: '', how: 'malformed' };
  const key = ctx.get('X-ClickHouse-Key');
  if (key || ctx.get('X-ClickHouse-User')) return { token: key, how: 'headers' };
  if (params.has('password') || params.has('user')) return { token: params.get('password') ?? '', how: 'params' };
  return { token: undefined, how: 'none' };
}

function authenticate(ctx: Context, params: URLSearchParams, auth: Auth): void {
  const { token, how } = credentials(ctx, params);
  if (token === undefined) {
    throw new SqlError(194, 'REQUIRED_PASSWORD', 'The SQL endpoint needs the admin key (SVC_API_KEY): as the password of Basic auth (any user name), X-ClickHouse-Key, the password URL parameter, or Authorization: Bearer', 401);
  }
  let kind: string;
  try {
    kind = auth.authenticate(token === '' ? 'Bearer' : `Bearer ${token}`).kind;
  } catch (err) {
    if (err instanceof AppError && err.code === 'unauthorized') {
      throw new SqlError(516, 'AUTHENTICATION_FAILED', how === 'malformed' ? 'Malformed Authorization header: expected Basic or Bearer' : 'Authentication failed: the password is not a valid key', 401);
    }
    throw err;
  }
  if (kind !== 'admin') {
    throw new SqlError(497, 'ACCESS_DENIED', 'The SQL endpoint needs the admin key (SVC_API_KEY): it reads every tenant\'s rows, so tenant keys and sandbox tokens are refused', 403);
  }
}

async function readBody(ctx: Context): Promise<string> {
  if (ctx.method !== 'POST') return '';
  const chunks: Buffer[] = [];
  let size = 0;
  const limit = MAX_QUERY_BYTES;
  for await (const chunk of ctx.req) {
    size += (chunk as Buffer).length;
    if (size > limit * 4) throw new SqlError(62, 'SYNTAX_ERROR', `Max query size exceeded: the body is larger than ${limit} bytes`, 413);
    chunks.push(chunk as Buffer);
  }
  let body = Buffer.concat(chunks);
  const encoding = (ctx.get('Content-Encoding') || '').trim().toLowerCase();
  if (encoding && encoding !== 'identity') {
    const inflate = { gzip: promisify(zlib.gunzip), 'x-gzip': promisify(zlib.gunzip), deflate: promisify(zlib.inflate), br: promisify(zlib.brotliDecompress) }[encoding];
    if (!inflate) throw new SqlError(48, 'NOT_IMPLEMENTED', `Content-Encoding ${encoding} is not supported: use gzip, deflate or br`, 415);
    try {
      body = await inflate(body, { maxOutputLength: limit + 1 } as never);
    } catch (err) {
      throw new SqlError(62, 'SYNTAX_ERROR', `Cannot decompress the ${encoding} body: ${(err as Error).message}`, 400);
    }
  }
  if (body.length > limit) throw new SqlError(62, 'SYNTAX_ERROR', `Max query size exceeded: the query is larger than ${limit} bytes`, 413);
  return body.toString('utf8');
}

/** The first encoding of Accept-Encoding this endpoint can produce. */
function responseEncoding(accept: string): 'gzip' | 'deflate' | 'br' | null {
  for (const part of accept.split(',')) {
    const name = part.split(';')[0].trim().toLowerCase();
    if (name === 'gzip' || name === 'deflate' || name === 'br') return name;
  }
  return null;
}

function positiveNumber(name: string, raw: string): number {
  if (!/^\d+(\.\d+)?$/.test(raw.trim())) throw new SqlError(27, 'CANNOT_PARSE_INPUT_ASSERTION_FAILED', `Cannot parse ${JSON.stringify(raw)} as a number for setting ${name}`, 400);
  return Number(raw);
}

export function sqlEndpoint(kernel: Kernel, auth: Auth) {
  const { config, logger, store } = kernel;
  let inFlight = 0;
  // The engine's setting names and table functions, read once (the engine knows what it has).
  let catalog: Promise<ReadonlySet<string>> | undefined;
  const knownSettings = (): Promise<ReadonlySet<string>> => {
    catalog ??= (async () => {
      const [settings, functions] = await Promise.all([
        store.query<{ name: string }>('SELECT name FROM system.settings'),
        store.query<{ name: string }>('SELECT name FROM system.table_functions').catch(() => []),
      ]);
      denyTableFunctions(functions.map((f) => f.name));
      return new Set(settings.map((s) => s.name));
    })();
    catalog.catch(() => (catalog = undefined));
    return catalog;
  };
  const displayName = hostname();

  return async (ctx: Context, next: Next) => {
    if (ctx.path !== SQL_PATH && !ctx.path.startsWith(`${SQL_PATH}/`)) return next();
    const sub = ctx.path.slice(SQL_PATH.length).replace(/^\/+/, '');
    const params = new URLSearchParams(ctx.querystring);
    const queryId = params.get('query_id') || randomUUID();
    (ctx as { _matchedRoute?: string })._matchedRoute = sub === 'ping' ? `${SQL_PATH}/ping` : SQL_PATH;
    try {
      if (sub === 'ping') {
        // As ClickHouse's /ping: no auth, for load balancers and clients' ping().
        if (ctx.method !== 'GET' && ctx.method !== 'HEAD') throw new SqlError(1, 'UNSUPPORTED_METHOD', `${ctx.method} is not allowed on /ping`, 405);
        ctx.type = 'text/plain; charset=UTF-8';
        ctx.body = 'Ok.\n';
        return;
      }
      if (sub !== '') throw new SqlError(1, 'UNSUPPORTED_METHOD', `There is no handle /${sub} here: queries go to ${SQL_PATH}/ (GET ?query= or POST) and ${SQL_PATH}/ping answers Ok.`, 404);
      if (ctx.method !== 'GET' && ctx.method !== 'POST') throw new SqlError(1, 'UNSUPPORTED_METHOD', `${ctx.method} is not allowed: send the query with GET ?query= or POST`, 405);
      authenticate(ctx, params, auth);
      if (!hasRawQuery(store)) throw new SqlError(48, 'NOT_IMPLEMENTED', 'This store does not serve SQL queries', 501);

      const body = await readBody(ctx);
      const urlQuery = params.get('query') ?? '';
      const sql = urlQuery && body ? `${urlQuery}\n${body}` : urlQuery || body;
      if (Buffer.byteLength(sql) > MAX_QUERY_BYTES) throw new SqlError(62, 'SYNTAX_ERROR', `Max query size exceeded: the query is larger than ${MAX_QUERY_BYTES} bytes`, 413);
      if (sql.includes('\0')) throw new SqlError(62, 'SYNTAX_ERROR', 'The query contains a NUL byte', 400);
      const checked = checkQuery(sql);

      for (const flag of ['compress', 'decompress']) {
        if (params.has(flag) && params.get(flag) !== '0') {
          throw new SqlError(48, 'NOT_IMPLEMENTED', `${flag}=1 (ClickHouse's native block compression) is not supported here: use HTTP compression (enable_http_compression=1 with Accept-Encoding: gzip)`, 400);
        }
      }
      const defaultFormat = params.get('default_format') || 'TabSeparated';
      if (!/^[A-Za-z0-9_]+$/.test(defaultFormat)) throw new SqlError(73, 'UNKNOWN_FORMAT', `Unknown format ${JSON.stringify(defaultFormat)}`);
      const revisionParam = params.get('client_protocol_version') ?? '0';
      if (!/^\d{1,9}$/.test(revisionParam)) throw new SqlError(27, 'CANNOT_PARSE_INPUT_ASSERTION_FAILED', `Cannot parse client_protocol_version ${JSON.stringify(revisionParam)} as a number`);
      const revision = Number(revisionParam);
      const database = params.get('database') || undefined;

      // Settings and query parameters.
      const known = await knownSettings();
      const settings: Array<[string, string]> = [];
      const queryParams: Record<string, string> = {};
      let maxExecutionTime = config.sqlMaxExecutionTime / 1000;
      let maxMemory = config.sqlMaxMemory;
      let maxResultBytes = config.sqlMaxResultBytes;
      for (const [name, value] of params) {
        if (name.startsWith('param_')) {
          const param = name.slice('param_'.length);
          if (!SETTING_NAME.test(param)) throw new SqlError(457, 'BAD_QUERY_PARAMETER', `Bad query parameter name ${JSON.stringify(param)}`);
          queryParams[param] = value;
          continue;
        }
        if (RESERVED.has(name)) continue;
        if (/_(format|structure|types)$/.test(name) && !known.has(name)) {
          throw new SqlError(48, 'NOT_IMPLEMENTED', `External tables (${name}) are not supported here`, 400);
        }
        if (!SETTING_NAME.test(name) || !known.has(name)) {
          throw new SqlError(115, 'UNKNOWN_SETTING', `Unknown setting '${name}': URL parameters other than ClickHouse's own (query, database, default_format, query_id, param_<name>, ...) must be settings`);
        }
        if (/[\0\r\n]/.test(value) || value.length > 4096) throw new SqlError(27, 'CANNOT_PARSE_INPUT_ASSERTION_FAILED', `Bad value for setting ${name}`);
        if (name === 'readonly') {
          if (value.trim() === '1' || value.trim() === '2') continue; // the query runs with readonly=1 anyway
          throw new SqlError(164, 'READONLY', "Cannot modify 'readonly' setting in readonly mode");
        }
        if (name === 'max_execution_time') {
          const asked = positiveNumber(name, value);
          if (asked > 0) maxExecutionTime = Math.min(asked, maxExecutionTime);
          continue;
        }
        if (name === 'max_memory_usage') {
          const asked = positiveNumber(name, value);
          if (asked > 0) maxMemory = Math.min(asked, maxMemory);
          continue;
        }
        if (name === 'max_result_bytes') {
          const asked = positiveNumber(name, value);
          if (asked > 0) maxResultBytes = Math.min(asked, maxResultBytes);
          continue;
        }
        if (DENIED_SETTINGS.test(name)) throw new SqlError(164, 'READONLY', `Cannot modify '${name}' setting in readonly mode`);
        settings.push([name, value]);
      }
      // Enforced last: the last occurrence of a setting wins.
      settings.push(['readonly', '1'], ['max_execution_time', String(maxExecutionTime)], ['max_memory_usage', String(maxMemory)], ['max_result_bytes', String(maxResultBytes)]);

      if (inFlight >= MAX_CONCURRENT) {
        throw new SqlError(202, 'TOO_MANY_SIMULTANEOUS_QUERIES', `Too many simultaneous queries: at most ${MAX_CONCURRENT} SQL queries run at once; retry shortly`, 429);
      }
      inFlight++;
      let result;
      try {
        result = await store.rawQuery({ sql, format: defaultFormat, settings, params: queryParams, database, queryId });
      } catch (err) {
        if (err instanceof StoreQueryError) throw fromEngineError(err.clickhouseCode, err.message);
        throw err;
      } finally {
        inFlight--;
      }

      const format = checked.format ?? defaultFormat;
      let bytes: Uint8Array = result.bytes;
      if (/^Native$/i.test(format) && revision > 0) bytes = nativeForRevision(bytes, revision);
      ctx.status = 200;
      ctx.set('X-ClickHouse-Query-Id', queryId);
      ctx.set('X-ClickHouse-Format', format);
      ctx.set('X-ClickHouse-Timezone', 'UTC');
      ctx.set('X-ClickHouse-Server-Display-Name', displayName);
      ctx.set(
        'X-ClickHouse-Summary',
        JSON.stringify({
          read_rows: String(result.rowsRead),
          read_bytes: String(result.bytesRead),
          written_rows: '0',
          written_bytes: '0',
          total_rows_to_read: String(result.rowsRead),
          result_rows: '0',
          result_bytes: String(bytes.length),
          elapsed_ns: String(Math.round(result.elapsedMs * 1e6)),
        }),
      );
      ctx.type = contentType(format);
      const encoding = params.get('enable_http_compression') === '1' ? responseEncoding(ctx.get('Accept-Encoding')) : null;
      if (encoding) {
        const compress = { gzip: promisify(zlib.gzip), deflate: promisify(zlib.deflate), br: promisify(zlib.brotliCompress) }[encoding];
        bytes = await compress(bytes);
        ctx.set('Content-Encoding', encoding);
      }
      ctx.body = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    } catch (err) {
      if (err instanceof SqlError) {
        renderSqlError(ctx, err, queryId);
        return;
      }
      if (err instanceof AppError && err.code !== 'internal') {
        const code = err.code === 'unavailable' ? 210 : 1001;
        renderSqlError(ctx, new SqlError(code, err.code === 'unavailable' ? 'NETWORK_ERROR' : 'STD_EXCEPTION', err.message, err.status), queryId);
        return;
      }
      logger.error({ err, request_id: ctx.state.requestId, path: ctx.path }, 'SQL query failed');
      renderSqlError(ctx, new SqlError(1001, 'STD_EXCEPTION', `Internal error (request ${ctx.state.requestId})`, 500), queryId);
    }
  };
}
