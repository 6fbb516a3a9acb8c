/**
 * Paginated responses: `{items, next_cursor?, count}`, with opaque keyset cursors (the sort key
 * of the last item, base64url JSON) that stay stable while new data arrives. `next_cursor` is
 * absent on the last page; `count` is the number of items in this page. The NDJSON variant
 * (`Accept: application/x-ndjson` or `format=ndjson`) streams every matching item, one JSON
 * object a line, paging through the store underneath.
 */
import { Readable } from 'node:stream';
import type { Context } from 'koa';
import type { Config } from '../kernel/config.ts';
import { badRequest } from '../kernel/errors.ts';

export interface Page<T> {
  items: T[];
  next_cursor?: string;
  count: number;
}

/** The page the API answers for `items` and the cursor of the next page (none: the last page). */
export function pageOf<T>(items: T[], nextCursor: string | null | undefined): Page<T> {
  return { items, ...(nextCursor ? { next_cursor: nextCursor } : {}), count: items.length };
}

export function parseLimit(raw: unknown, config: Config): number {
  if (raw === undefined) return config.defaultPageSize;
  if (typeof raw !== 'string' || !/^\d+$/.test(raw) || Number(raw) < 1) throw badRequest('limit', 'must be a positive integer');
  const limit = Number(raw);
  if (limit > config.maxPageSize) throw badRequest('limit', `must be at most ${config.maxPageSize}`);
  return limit;
}

export function encodeCursor(key: unknown[]): string {
  return Buffer.from(JSON.stringify(key)).toString('base64url');
}

/** Decodes a cursor made by `encodeCursor`, checking it has the expected arity of strings. */
export function decodeCursor(raw: unknown, arity: number): string[] | null {
  if (raw === undefined) return null;
  try {
    if (typeof raw !== 'string') throw new Error();
    const key = JSON.parse(Buffer.from(raw, 'base64url').toString('utf8'));
    if (!Array.isArray(key) || key.length !== arity || !key.every((k) => typeof k === 'string')) throw new Error();
    return key;
  } catch {
    throw badRequest('cursor', 'is not a cursor returned by this endpoint');
  }
}

export function wantsNdjson(ctx: Context): boolean {
  return ctx.query.format === 'ndjson' || (ctx.get('Accept').includes('application/x-ndjson') && !ctx.get('Accept').includes('application/json'));
}

/** Rejects query parameters the endpoint does not know, so a typo is not silently ignored. */
export function checkQueryParams(ctx: Context, allowed: readonly string[]): void {
  for (const name of Object.keys(ctx.query)) {
    if (!allowed.includes(name) && name !== 'limit' && name !== 'cursor' && name !== 'format') {
      throw badRequest(name, `unknown query parameter; accepted: ${[...allowed, 'limit', 'cursor', 'format'].join(', ')}`);
    }
    if (Array.isArray(ctx.query[name])) throw badRequest(name, 'given more than once');
  }
}

/**
 * Streams pages as NDJSON. `fetchPage(cursor)` returns up to a page of items and the cursor
 * after them (null at the end); `max` caps the total when the caller gave `limit`.
 */
export function ndjsonStream<T>(fetchPage: (cursor: string | null) => Promise<{ items: T[]; next: string | null }>, max: number | null): Readable {
  let cursor: string | null = null;
  let sent = 0;
  let done = false;
  return new Readable({
    async read() {
      try {
        if (done) return;
        const page = await fetchPage(cursor);
        const items = max === null ? page.items : page.items.slice(0, max - sent);
        sent += items.length;
        cursor = page.next;
        done = cursor === null || (max !== null && sent >= max);
        if (items.length > 0) this.push(items.map((item) => JSON.stringify(item)).join('\n') + '\n');
        if (done) this.push(null);
      } catch (err) {
        this.destroy(err as Error);
      }
    },
  });
}
