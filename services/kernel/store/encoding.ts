/**
 * What both store adapters share on the wire, so that chDB and a ClickHouse server see the same
 * bytes and give back the same shapes:
 *
 * - rows go in as JSONEachRow (one JSON object per line), with `bigint` as a decimal string and a
 *   `Date` as `YYYY-MM-DD hh:mm:ss[.sss]` in UTC (see formatDateTime; ISO 8601 with `T`/`Z` is
 *   not parsed without `date_time_input_format=best_effort`, which 18.16 lacks);
 * - rows come back as JSONEachRow with `output_format_json_quote_64bit_integers=1`, so (U)Int64
 *   and wider are strings, (U)Int8..32 and floats are numbers, DateTime64 is a string
 *   `YYYY-MM-DD hh:mm:ss.nnnnnnnnn`, Map is an object, Nullable null is `null`;
 * - bound parameters use ClickHouse's `{name:Type}` syntax; a `Date` becomes the same UTC text,
 *   a `bigint` a decimal string, everything else goes to the library as it is.
 */

import { AppError } from '../errors.ts';
import type { QueryParams } from './store.ts';

/** A table name the adapters accept in `insert` (it is put in SQL text, so it is checked). */
const IDENTIFIER = /^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$/;

export function assertTableName(table: string): void {
  if (!IDENTIFIER.test(table)) throw new AppError('internal', `store: invalid table name ${JSON.stringify(table)}`);
}

/**
 * `2024-01-02 03:04:05.678` in UTC, or `2024-01-02 03:04:05` for a whole second: the plain text
 * form DateTime64 parses, and DateTime too when there is no fraction (a `{t:DateTime}` param and an
 * 18.16 server refuse one).
 */
export function formatDateTime(date: Date): string {
  if (Number.isNaN(date.getTime())) throw new AppError('internal', 'store: invalid Date value');
  const text = date.toISOString().replace('T', ' ').replace('Z', '');
  return text.endsWith('.000') ? text.slice(0, -4) : text;
}

function normalizeValue(value: unknown): unknown {
  if (value instanceof Date) return formatDateTime(value);
  if (typeof value === 'bigint') return value.toString();
  if (Array.isArray(value)) return value.map(normalizeValue);
  return value;
}

/** Params as handed to either library; `undefined` when there are none (so nothing is sent). */
export function normalizeParams(params: QueryParams | undefined): Record<string, unknown> | undefined {
  if (params === undefined) return undefined;
  const keys = Object.keys(params);
  if (keys.length === 0) return undefined;
  const out: Record<string, unknown> = {};
  for (const key of keys) out[key] = normalizeValue(params[key]);
  return out;
}

function jsonReplacer(_key: string, value: unknown): unknown {
  return typeof value === 'bigint' ? value.toString() : value;
}

/**
 * One row as a JSON line (without the newline). `JSON.stringify` turns a Date into ISO 8601 via
 * `toJSON` before a replacer sees it, so top-level Dates are formatted here first (nested Dates in
 * arrays or maps are rare enough to ask callers to format them themselves).
 */
export function encodeRow(row: Record<string, unknown>): string {
  let copy: Record<string, unknown> | undefined;
  let bigints = false;
  for (const key in row) {
    const value = row[key];
    if (value instanceof Date) {
      copy ??= { ...row };
      copy[key] = formatDateTime(value);
    } else if (typeof value === 'bigint') bigints = true;
  }
  // The replacer costs a call per value: only pay it when a bigint needs it (nested ones throw
  // in the fast path and take the slow one).
  if (!bigints) {
    try {
      return JSON.stringify(copy ?? row);
    } catch {
      // fall through
    }
  }
  return JSON.stringify(copy ?? row, jsonReplacer);
}

/** Rows as a JSONEachRow payload. */
export function toJsonEachRow(rows: ReadonlyArray<Record<string, unknown>>): string {
  let out = '';
  for (const row of rows) out += encodeRow(row) + '\n';
  return out;
}

/**
 * One row as a JSONCompactEachRow line: its values in `columns` order. Without the key names
 * the payload is about 40% smaller for trace rows, and ClickHouse parses it faster.
 */
function encodeCompactRow(row: Record<string, unknown>, columns: readonly string[]): string {
  const values = new Array<unknown>(columns.length);
  let bigints = false;
  for (let i = 0; i < columns.length; i++) {
    const value = row[columns[i]];
    if (value instanceof Date) values[i] = formatDateTime(value);
    else {
      if (typeof value === 'bigint') bigints = true;
      values[i] = value;
    }
  }
  if (!bigints) {
    try {
      return JSON.stringify(values);
    } catch {
      // a nested bigint: take the replacer
    }
  }
  return JSON.stringify(values, jsonReplacer);
}

/** Rows encoded per yield: about 2-5 ms of JSON.stringify for trace-sized rows. */
const ROWS_PER_SLICE = 500;

/**
 * The JSONEachRow payload as bytes, encoded in slices with a yield to the event loop between
 * them: serialising a 20k-row batch in one go holds the loop for 100-150 ms on these machines.
 */
export async function encodeJsonEachRow(rows: ReadonlyArray<Record<string, unknown>>): Promise<Buffer> {
  return encodeInSlices(rows, toJsonEachRow);
}

/**
 * The JSONCompactEachRow payload of rows that all have the keys of the first row (`columns`,
 * in that order), encoded in slices like encodeJsonEachRow.
 */
export async function encodeJsonCompactEachRow(
  rows: ReadonlyArray<Record<string, unknown>>,
  nullable: ReadonlySet<string> = new Set(),
): Promise<{ columns: string[]; payload: Buffer }> {
  // A column that is empty in every row of the batch is left out: ClickHouse fills the
  // column's default (the same empty value) without parsing it row by row. A Nullable
  // column's default is NULL, so there only an all-null column is left out.
  const columns = Object.keys(rows[0] ?? {}).filter((c) => !rows.every((row) => (nullable.has(c) ? row[c] === null : isEmptyValue(row[c]))));
  const payload = await encodeInSlices(rows, (slice) => {
    let out = '';
    for (const row of slice) out += encodeCompactRow(row, columns) + '\n';
    return out;
  });
  return { columns, payload };
}

/** '' , 0, false, null and {} / [] equal the default of their ClickHouse column types. */
function isEmptyValue(value: unknown): boolean {
  if (value === '' || value === 0 || value === null || value === false) return true;
  if (typeof value === 'object' && value !== null && !(value instanceof Date)) {
    if (Array.isArray(value)) return value.length === 0;
    for (const _ in value) return false;
    return true;
  }
  return false;
}

async function encodeInSlices(
  rows: ReadonlyArray<Record<string, unknown>>,
  encode: (slice: ReadonlyArray<Record<string, unknown>>) => string,
): Promise<Buffer> {
  if (rows.length <= ROWS_PER_SLICE) return Buffer.from(encode(rows));
  const parts: Buffer[] = [];
  for (let i = 0; i < rows.length; i += ROWS_PER_SLICE) {
    if (i > 0) await new Promise<void>((resolve) => setImmediate(resolve));
    parts.push(Buffer.from(encode(rows.slice(i, i + ROWS_PER_SLICE))));
  }
  return Buffer.concat(parts);
}

/** Parses a JSONEachRow result text into objects. */
export function parseJsonEachRow<T>(text: string): T[] {
  const rows: T[] = [];
  let start = 0;
  while (start < text.length) {
    let end = text.indexOf('\n', start);
    if (end === -1) end = text.length;
    if (end > start) rows.push(JSON.parse(text.slice(start, end)) as T);
    start = end + 1;
  }
  return rows;
}
