/**
 * The token of an ingest answered before its events were queryable (`Prefer: respond-async`):
 * where its records are on svc.traces, which GET /v1/traces/visibility waits on. Opaque to
 * clients: `v1.` and the base64url of `partition:offset` pairs (the last record per partition).
 */
import { badRequest } from '../../kernel/errors.ts';
import type { RecordPosition } from '../../kernel/log/event-log.ts';
import { TOPICS } from '../../kernel/topics.ts';

const PREFIX = 'v1.';
/** Partitions a token may name (svc.traces has far fewer). */
const MAX_PAIRS = 1024;

export function encodeVisibilityToken(positions: RecordPosition[]): string {
  const last = new Map<number, number>();
  for (const p of positions) last.set(p.partition, Math.max(p.offset, last.get(p.partition) ?? -1));
  return PREFIX + Buffer.from([...last].map(([partition, offset]) => `${partition}:${offset}`).join(',')).toString('base64url');
}

/** The positions a token names; a 400 naming `field` for anything that is not one. */
export function decodeVisibilityToken(token: unknown, field = 'token'): RecordPosition[] {
  const bad = () => badRequest(field, 'is not a visibility token (the SVC-Visibility-Token header of a respond-async ingest answer)');
  if (typeof token !== 'string' || !token.startsWith(PREFIX) || token.length > 64 * 1024) throw bad();
  const text = Buffer.from(token.slice(PREFIX.length), 'base64url').toString('utf8');
  const pairs = text === '' ? [] : text.split(',');
  if (pairs.length === 0 || pairs.length > MAX_PAIRS) throw bad();
  return pairs.map((pair) => {
    const m = /^(\d{1,9}):(\d{1,15})$/.exec(pair);
    if (!m) throw bad();
    return { topic: TOPICS.traces, partition: Number(m[1]), offset: Number(m[2]) };
  });
}
