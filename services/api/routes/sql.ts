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
 * It is mounted in app.ts before the auth, the per-key limits and the JSON body parser, which do
 * not apply to it (it is an operator's endpoint, like /v1/admin/*), and it renders its own errors,
 * so the JSON error renderer never sees one. The handler reads the request and renders; the query
 * runs in sql/analyst-queries.ts.
 */
import { randomUUID } from 'node:crypto';
import type { Context, Next } from 'koa';
import type { Kernel } from '../../kernel/actor.ts';
import type { Auth } from '../../kernel/auth.ts';
import { AnalystQueries } from '../sql/analyst-queries.ts';
import { authenticate } from '../sql/credentials.ts';
import { readQueryBody } from '../sql/query-text.ts';
import { renderSqlError, SqlError, sqlErrorOf } from '../sql/sql-errors.ts';
import { renderSqlResult } from '../sql/sql-response.ts';

const SQL_PATH = '/v1/admin/sql';

/** Refuses a handle or a method this endpoint does not have; `/ping` is answered before. */
function checkHandle(handle: string, method: string): void {
  if (handle !== '')
    throw new SqlError(
      1,
      'UNSUPPORTED_METHOD',
      `There is no handle /${handle} here: queries go to ${SQL_PATH}/ (GET ?query= or POST) and ${SQL_PATH}/ping answers Ok.`,
      404,
    );
  if (method !== 'GET' && method !== 'POST')
    throw new SqlError(1, 'UNSUPPORTED_METHOD', `${method} is not allowed: send the query with GET ?query= or POST`, 405);
}

/** As ClickHouse's /ping: no auth, for load balancers and clients' ping(). */
function ping(ctx: Context): void {
  if (ctx.method !== 'GET' && ctx.method !== 'HEAD') throw new SqlError(1, 'UNSUPPORTED_METHOD', `${ctx.method} is not allowed on /ping`, 405);
  ctx.type = 'text/plain; charset=UTF-8';
  ctx.body = 'Ok.\n';
}

export function sqlEndpoint(kernel: Kernel, auth: Auth) {
  const { logger } = kernel;
  const queries = new AnalystQueries(kernel.store, kernel.config);

  return async (ctx: Context, next: Next) => {
    if (ctx.path !== SQL_PATH && !ctx.path.startsWith(`${SQL_PATH}/`)) return next();
    const handle = ctx.path.slice(SQL_PATH.length).replace(/^\/+/, '');
    const params = new URLSearchParams(ctx.querystring);
    const queryId = params.get('query_id') || randomUUID();
    (ctx as { _matchedRoute?: string })._matchedRoute = handle === 'ping' ? `${SQL_PATH}/ping` : SQL_PATH;
    try {
      if (handle === 'ping') return ping(ctx);
      checkHandle(handle, ctx.method);
      authenticate((name) => ctx.get(name), params, auth);
      queries.engine();
      const body = ctx.method === 'POST' ? await readQueryBody(ctx.req as AsyncIterable<Buffer>, ctx.get('Content-Encoding')) : '';
      const result = await queries.run({ params, body, queryId });
      await renderSqlResult(ctx, result, queryId, params.get('enable_http_compression') === '1');
    } catch (err) {
      const sqlError = sqlErrorOf(err);
      if (!sqlError) logger.error({ err, request_id: ctx.state.requestId, path: ctx.path }, 'SQL query failed');
      renderSqlError(ctx, sqlError ?? new SqlError(1001, 'STD_EXCEPTION', `Internal error (request ${ctx.state.requestId})`, 500), queryId);
    }
  };
}
