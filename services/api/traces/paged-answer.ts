/**
 * How the trace and span reads, and a sandbox's audit log, answer (pagination.ts has the
 * shapes): one keyset page with its `next_cursor`, or, for NDJSON, every page after the cursor
 * streamed. Their cursors are the key of a page's last item, `arity` strings: (ts in µs, id) for
 * traces and spans, (ts in ms, log partition, log offset) for audit records.
 */
import type { Context } from 'koa';
import type { Config } from '../../kernel/config.ts';
import { decodeCursor, encodeCursor, ndjsonStream, pageOf, parseLimit, wantsNdjson } from '../pagination.ts';

/** One page of items after the key `after`, and the key of its last item when more follow. */
export type FetchPage<T> = (after: string[] | null, pageSize: number) => Promise<{ items: T[]; next: string[] | null }>;

/**
 * Answers the request's page (`limit`, `cursor`) or, for NDJSON, every item after the cursor
 * (at most `limit` when given). `empty` runs when a first page has no items (e.g. a 404).
 */
export async function answerPages<T>(ctx: Context, config: Config, fetch: FetchPage<T>, empty: () => void = () => {}, arity = 2): Promise<void> {
  const limit = parseLimit(ctx.query.limit, config);
  const initial = decodeCursor(ctx.query.cursor, arity);
  if (wantsNdjson(ctx)) {
    let first = true;
    ctx.type = 'application/x-ndjson';
    ctx.body = ndjsonStream(
      async (cursor) => {
        const page = await fetch(first ? initial : decodeCursor(cursor ?? undefined, arity), config.maxPageSize);
        first = false;
        return { items: page.items, next: page.next ? encodeCursor(page.next) : null };
      },
      ctx.query.limit === undefined ? null : limit,
    );
    return;
  }
  const page = await fetch(initial, limit);
  if (page.items.length === 0 && initial === null) empty();
  ctx.body = pageOf(page.items, page.next && encodeCursor(page.next));
}
