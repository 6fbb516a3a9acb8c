/**
 * The SQL endpoint's auth: the admin key, as ClickHouse clients send a password (Basic auth with
 * any user, X-ClickHouse-User/X-ClickHouse-Key, `user`/`password` URL parameters) or as a Bearer
 * token. Anything else is refused with ClickHouse's codes.
 */
import type { Auth } from '../../kernel/auth.ts';
import { AppError } from '../../kernel/errors.ts';
import { SqlError } from './sql-errors.ts';

/** A request header's value, '' when absent. */
export type Header = (name: string) => string;

interface Credentials {
  token: string | undefined;
  how: string;
}

/** The key as a ClickHouse client sends a password, or a Bearer token. */
function credentials(header: Header, params: URLSearchParams): Credentials {
  const authorization = header('Authorization');
  const bearer = /^Bearer\s+(\S+)\s*$/i.exec(authorization)?.[1];
  if (bearer !== undefined) return { token: bearer, how: 'bearer' };
  const basic = /^Basic\s+([A-Za-z0-9+/=]+)\s*$/i.exec(authorization)?.[1];
  if (basic !== undefined) {
    const decoded = Buffer.from(basic, 'base64').toString('utf8');
    const colon = decoded.indexOf(':');
    return { token: colon >= 0 ? decoded.slice(colon + 1) : '', how: 'basic' };
  }
  if (authorization) return { token: '', how: 'malformed' };
  const key = header('X-ClickHouse-Key');
  if (key || header('X-ClickHouse-User')) return { token: key, how: 'headers' };
  if (params.has('password') || params.has('user')) return { token: params.get('password') ?? '', how: 'params' };
  return { token: undefined, how: 'none' };
}

/** Passes the admin key; a missing, wrong or other key is a SqlError (401 or 403). */
export function authenticate(header: Header, params: URLSearchParams, auth: Auth): void {
  const { token, how } = credentials(header, params);
  if (token === undefined) {
    throw new SqlError(
      194,
      'REQUIRED_PASSWORD',
      'The SQL endpoint needs the admin key (SVC_API_KEY): as the password of Basic auth (any user name), X-ClickHouse-Key, the password URL parameter, or Authorization: Bearer',
      401,
    );
  }
  let kind: string;
  try {
    kind = auth.authenticate(token === '' ? 'Bearer' : `Bearer ${token}`).kind;
  } catch (err) {
    if (err instanceof AppError && err.code === 'unauthorized') {
      throw new SqlError(
        516,
        'AUTHENTICATION_FAILED',
        how === 'malformed' ? 'Malformed Authorization header: expected Basic or Bearer' : 'Authentication failed: the password is not a valid key',
        401,
      );
    }
    throw err;
  }
  if (kind !== 'admin') {
    throw new SqlError(
      497,
      'ACCESS_DENIED',
      "The SQL endpoint needs the admin key (SVC_API_KEY): it reads every tenant's rows, so tenant keys and sandbox tokens are refused",
      403,
    );
  }
}
