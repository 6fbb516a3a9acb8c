/**
 * The experiments table read a page at a time, for the list and an eval's history: keyset
 * pagination on (created_at, experiment id), whose cursor is that key of the page's last row.
 */
import { badRequest } from '../../kernel/errors.ts';
import type { Store } from '../../kernel/store/store.ts';
import { decodeCursor, encodeCursor } from '../pagination.ts';

export interface ExperimentRow {
  ExperimentId: string;
  Name: string;
  SpecId: string;
  SpecVersion: number;
  Status: string;
  created_ms: string;
  queued_ms: string | null;
  started_ms: string | null;
  completed_ms: string | null;
  TotalRuns: number;
  ScoredRuns: number;
  Error: string;
}

const EXPERIMENT_COLUMNS = `ExperimentId, Name, SpecId, SpecVersion, Status, toUnixTimestamp64Milli(CreatedAt) AS created_ms,
  toUnixTimestamp64Milli(QueuedAt) AS queued_ms, toUnixTimestamp64Milli(StartedAt) AS started_ms,
  toUnixTimestamp64Milli(CompletedAt) AS completed_ms, TotalRuns, ScoredRuns, Error`;

/** The key after which a page starts, from the `cursor` query parameter; null for the first page. */
export function createdCursor(raw: unknown): [number, string] | null {
  const key = decodeCursor(raw, 2);
  if (!key) return null;
  if (!/^\d+$/.test(key[0])) throw badRequest('cursor', 'is not a cursor returned by this endpoint');
  return [Number(key[0]), key[1]];
}

export interface RowsQuery {
  /** Conditions ANDed with the keyset one, and the parameters they name. */
  where: string[];
  params: Record<string, unknown>;
  /** Columns read besides the summary's (`, Metrics, Yaml`). */
  extraColumns?: string;
  newestFirst: boolean;
}

/** One page of rows after `after` in (created_at, id) order, and the cursor after it (null on the last page). */
export async function experimentRows<R extends ExperimentRow>(
  store: Store,
  query: RowsQuery,
  after: [number, string] | null,
  limit: number,
): Promise<{ rows: R[]; next: string | null }> {
  const conditions = [...query.where];
  const params: Record<string, unknown> = { ...query.params, page: limit + 1 };
  if (after) {
    conditions.push(`(CreatedAt, ExperimentId) ${query.newestFirst ? '<' : '>'} (fromUnixTimestamp64Milli({after_ts:Int64}), {after_id:String})`);
    params.after_ts = after[0];
    params.after_id = after[1];
  }
  const rows = await store.query<R>(
    `SELECT ${EXPERIMENT_COLUMNS}${query.extraColumns ?? ''} FROM experiments FINAL WHERE ${conditions.join(' AND ')}
     ORDER BY ${query.newestFirst ? 'CreatedAt DESC, ExperimentId DESC' : 'CreatedAt, ExperimentId'} LIMIT {page:UInt32}`,
    params,
  );
  const page = rows.slice(0, limit);
  const last = rows.length > limit ? page[page.length - 1] : null;
  return { rows: page, next: last ? encodeCursor([last.created_ms, last.ExperimentId]) : null };
}
