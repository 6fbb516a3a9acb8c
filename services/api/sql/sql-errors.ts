/**
 * ClickHouse-style errors of the SQL endpoint: the body is `Code: N. DB::Exception: <message>.
 * (NAME)` as text, the status follows ClickHouse's own mapping of error codes to HTTP statuses
 * (src/Server/HTTP/exceptionCodeToHTTPStatus.cpp) where it has one, and an engine error that it
 * leaves at 500 is a 400 here: it comes from the analyst's query (a timeout, the memory limit, a
 * type error), not from the service. The code also goes in `X-ClickHouse-Exception-Code`.
 */
import type { Context } from 'koa';
import { AppError } from '../../kernel/errors.ts';

export class SqlError extends Error {
  constructor(
    readonly code: number,
    readonly codeName: string,
    message: string,
    readonly status: number = statusOf(code),
  ) {
    super(message);
    this.name = 'SqlError';
  }

  /** The body text, as ClickHouse writes it. */
  text(): string {
    return `Code: ${this.code}. DB::Exception: ${this.message}. (${this.codeName})\n`;
  }
}

const STATUS: Record<number, number> = {
  194: 401, // REQUIRED_PASSWORD
  192: 401, // UNKNOWN_USER
  193: 401, // WRONG_PASSWORD
  516: 401, // AUTHENTICATION_FAILED
  497: 403, // ACCESS_DENIED
  164: 403, // READONLY
  // Unknown things
  60: 404, // UNKNOWN_TABLE
  46: 404, // UNKNOWN_FUNCTION
  47: 404, // UNKNOWN_IDENTIFIER
  50: 404, // UNKNOWN_TYPE
  56: 404, // UNKNOWN_STORAGE
  81: 404, // UNKNOWN_DATABASE
  115: 404, // UNKNOWN_SETTING
  73: 404, // UNKNOWN_FORMAT
  202: 429, // TOO_MANY_SIMULTANEOUS_QUERIES
};

function statusOf(code: number): number {
  return STATUS[code] ?? 400;
}

/**
 * An engine error as a SqlError: its code, and its message with the nesting chDB adds
 * (`Code: 73. DB::Exception: Code: 73. DB::Exception: ... (version 26.7.2.1)`) taken off.
 */
export function fromEngineError(code: number, raw: string): SqlError {
  const name =
    /\(([A-Z][A-Z0-9_]+)\)\s*$/.exec(raw.replace(/\s*\(version [^)]*\)\.?\s*$/, ''))?.[1] ?? /\(([A-Z][A-Z0-9_]+)\)/.exec(raw)?.[1] ?? 'UNKNOWN_EXCEPTION';
  let message = raw;
  for (;;) {
    const m = /^Code: \d+\. DB::Exception: /.exec(message);
    if (!m) break;
    message = message.slice(m[0].length);
  }
  const version = message.indexOf(' (version ');
  if (version >= 0) message = message.slice(0, version);
  message = message.replace(/\s*\([A-Z][A-Z0-9_]+\)\s*$/, '').replace(/\.\s*$/, '');
  return new SqlError(code, name, message);
}

/** Renders the error the way a ClickHouse server does. */
export function renderSqlError(ctx: Context, err: SqlError, queryId: string): void {
  ctx.status = err.status;
  ctx.set('X-ClickHouse-Exception-Code', String(err.code));
  ctx.set('X-ClickHouse-Query-Id', queryId);
  ctx.set('X-ClickHouse-Server-Display-Name', SERVER_DISPLAY_NAME);
  if (err.status === 401) ctx.set('WWW-Authenticate', 'Basic realm="svc SQL endpoint", charset="UTF-8"');
  if (err.status === 429) ctx.set('Retry-After', '1');
  ctx.type = 'text/plain; charset=UTF-8';
  ctx.body = err.text();
}

const SERVER_DISPLAY_NAME = 'svc';

/**
 * Any failure of a query as a SqlError: itself, or an AppError of the service (unavailable as
 * NETWORK_ERROR, the others as STD_EXCEPTION); null for an unexpected error (a bug: the caller
 * logs it and answers 500).
 */
export function sqlErrorOf(err: unknown): SqlError | null {
  if (err instanceof SqlError) return err;
  if (err instanceof AppError && err.code !== 'internal') {
    const code = err.code === 'unavailable' ? 210 : 1001;
    return new SqlError(code, err.code === 'unavailable' ? 'NETWORK_ERROR' : 'STD_EXCEPTION', err.message, err.status);
  }
  return null;
}
