/**
 * `{name:Type}` parameters put into the SQL text for chDB, as ClickHouse's own substitution does
 * (it replaces each placeholder by `_CAST(<value>, 'Type')`): the library's bound queries run
 * one at a time in the whole process (chdb 3.4 chains every parameterized call on one promise:
 * the bundled engine's parameter state is not per connection), so bound reads on two sessions
 * never overlapped. Values go in as quoted text the cast parses, the way the engine parses a
 * parameter's text: a value that is not of the type is the engine's error, not a silent
 * conversion (`_CAST('-1', 'UInt32')` fails where `_CAST(-1, 'UInt32')` wraps).
 *
 * The SQL text is the service's own (analysts' SQL goes through rawQuery with the engine's
 * binding); placeholders are looked for outside string literals, quoted identifiers and comments.
 */
import { AppError } from '../errors.ts';
import { normalizeParams } from './encoding.ts';
import { StoreQueryError, type QueryParams } from './store.ts';

/** A placeholder at a `{`: its name and its type (which may hold quoted text: `DateTime64(9, 'UTC')`). */
const PLACEHOLDER = /\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*:\s*((?:[^{}'"`]|'(?:[^'\\]|\\.)*')+?)\s*\}/y;

/** Escapes of a ClickHouse string literal: the backslash and quote, and control characters. */
const ESCAPES: Record<string, string> = { '\\': '\\\\', "'": "\\'", '\0': '\\0', '\b': '\\b', '\f': '\\f', '\n': '\\n', '\r': '\\r', '\t': '\\t' };

/** `text` as a single-quoted ClickHouse string literal. */
export function quoteString(text: string): string {
  return `'${text.replace(/[\\'\0\b\f\n\r\t]/g, (c) => ESCAPES[c]!)}'`;
}

/** A normalized parameter's value (encoding.ts: Dates and bigints already text) as the SQL the cast reads: quoted text, arrays of it, or NULL. */
function valueSql(value: unknown, name: string): string {
  if (value === null || value === undefined) return 'NULL';
  if (Array.isArray(value)) return `[${value.map((v) => valueSql(v, name)).join(',')}]`;
  switch (typeof value) {
    case 'string':
      return quoteString(value);
    case 'boolean':
      return quoteString(String(value));
    case 'number':
      if (!Number.isFinite(value)) throw new AppError('internal', `store: parameter ${name} is ${value}`);
      return quoteString(String(value));
    default:
      throw new AppError('internal', `store: parameter ${name} has a value of type ${typeof value}, which no placeholder takes`);
  }
}

/** `sql` with every `{name:Type}` outside literals, quoted names and comments replaced by its value. */
export function inlineParams(sql: string, raw: QueryParams | undefined): string {
  if (!sql.includes('{')) return sql;
  const params = normalizeParams(raw);
  let out = '';
  let copied = 0;
  for (let i = 0; i < sql.length; i++) {
    const c = sql[i];
    if (c === "'" || c === '"' || c === '`') {
      i = closing(sql, i, c);
    } else if (c === '-' && sql[i + 1] === '-') {
      i = sql.indexOf('\n', i);
      if (i < 0) break;
    } else if (c === '/' && sql[i + 1] === '*') {
      i = sql.indexOf('*/', i + 2);
      if (i < 0) break;
      i++;
    } else if (c === '{') {
      PLACEHOLDER.lastIndex = i;
      const match = PLACEHOLDER.exec(sql);
      if (!match) continue;
      const [whole, name, type] = match;
      if (!params || !Object.hasOwn(params, name)) {
        throw new StoreQueryError(456, `Code: 456. DB::Exception: Substitution \`${name}\` is not set. (UNKNOWN_QUERY_PARAMETER)`);
      }
      out += `${sql.slice(copied, i)}_CAST(${valueSql(params[name], name)}, ${quoteString(type)})`;
      i += whole.length - 1;
      copied = i + 1;
    }
  }
  return copied === 0 ? sql : out + sql.slice(copied);
}

/** The index of the quote that closes the one at `start` (a backslash escapes; a doubled quote is one), or the end. */
function closing(sql: string, start: number, quote: string): number {
  for (let i = start + 1; i < sql.length; i++) {
    if (sql[i] === '\\') i++;
    else if (sql[i] === quote) {
      if (sql[i + 1] !== quote) return i;
      i++;
    }
  }
  return sql.length;
}
