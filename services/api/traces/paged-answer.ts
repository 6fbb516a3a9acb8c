/**
 * How the trace and span reads answer (pagination.ts has the shapes): one keyset page with its
 * `next_cursor`, or, for NDJSON, every page after the cursor streamed. Their cursors are the
 * (ts in µs, id) key of a page's last item.
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
export async function answerPages<T>(ctx: Context, config: Config, fetch: FetchPage<T>, empty: () => void = () => {}): Promise<void> {
  const limit = parseLimit(ctx.query.limit, config);
  const initial = decodeCursor(ctx.query.cursor, 2);
  if (wantsNdjson(ctx)) {
    let first = true;
    ctx.type = 'application/x-ndjson';
    ctx.body = ndjsonStream(
      async (cursor) => {
        const page = await fetch(first ? initial : decodeCursor(cursor ?? undefined, 2), config.maxPageSize);
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
