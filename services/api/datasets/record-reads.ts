/**
 * Dataset records read from ClickHouse (dataset_records, docs/datasets.md): a version's records in
 * their dataset's order, optionally of some tags or ids, a page at a time on a keyset cursor (the
 * record's seq), or all of them as NDJSON. Version V is the records of seq 1 to
 * versions[V - 1].records, which also leaves out what an add that crashed before its version was
 * made left behind (the next add writes over it).
 */
import type { DatasetRecord } from '../../domain/datasets.ts';
import type { Store } from '../../kernel/store/store.ts';
import { encodeCursor } from '../pagination.ts';

interface RecordRow {
  RecordId: string;
  Seq: number;
  Version: number;
  Input: string;
  Expected: string | null;
  Metadata: string | null;
  Tags: string[];
  created_ms: string;
}

/** Which records: those of seq `after` + 1 to `last` (a version's count), of any of `tags`, of `ids`. */
export interface RecordSelection {
  tenant: string;
  datasetId: string;
  version: number;
  last: number;
  tags: string[] | null;
  ids?: string[] | null;
}

function recordOf(row: RecordRow): DatasetRecord {
  return {
    id: row.RecordId,
    version: Number(row.Version),
    input: JSON.parse(row.Input),
    ...(row.Expected !== null && { expected: JSON.parse(row.Expected) }),
    ...(row.Metadata !== null && { metadata: JSON.parse(row.Metadata) }),
    tags: row.Tags,
    created_at: new Date(Number(row.created_ms)).toISOString(),
  };
}

function where(s: RecordSelection): string {
  return `TenantId = {tenant:String} AND DatasetId = {dataset:String} AND Seq > {after:UInt32} AND Seq <= {last:UInt32}
    AND Version <= {version:UInt32} AND Deleted = 0${s.tags ? ' AND hasAny(Tags, {tags:Array(String)})' : ''}${s.ids ? ' AND RecordId IN {ids:Array(String)}' : ''}`;
}

function params(s: RecordSelection, after: number): Record<string, unknown> {
  return { tenant: s.tenant, dataset: s.datasetId, after, last: s.last, version: s.version, ...(s.tags && { tags: s.tags }), ...(s.ids && { ids: s.ids }) };
}

/** Up to `limit` records after seq `after`, and the cursor of the next page (null: the last page). */
export async function recordPage(
  store: Store,
  s: RecordSelection,
  after: number,
  limit: number,
): Promise<{ items: DatasetRecord[]; next: string | null; lastSeq: number }> {
  const rows = await store.query<RecordRow>(
    `SELECT RecordId, Seq, Version, Input, Expected, Metadata, Tags, toUnixTimestamp64Milli(CreatedAt) AS created_ms
     FROM dataset_records FINAL WHERE ${where(s)} ORDER BY Seq LIMIT {limit:UInt32}`,
    { ...params(s, after), limit: limit + 1 },
  );
  const page = rows.slice(0, limit);
  const lastSeq = page.length > 0 ? Number(page[page.length - 1].Seq) : after;
  return { items: page.map(recordOf), next: rows.length > limit ? encodeCursor([String(lastSeq)]) : null, lastSeq };
}

/** How many records the selection holds. */
export async function countRecords(store: Store, s: RecordSelection): Promise<number> {
  const [row] = await store.query<{ n: string }>(`SELECT count() AS n FROM dataset_records FINAL WHERE ${where(s)}`, params(s, 0));
  return Number(row?.n ?? 0);
}

/** Every record of the selection, a page at a time, in order. */
export async function* allRecords(store: Store, s: RecordSelection, pageSize = 1000): AsyncGenerator<DatasetRecord[]> {
  let after = 0;
  for (;;) {
    const page = await recordPage(store, s, after, pageSize);
    if (page.items.length > 0) yield page.items;
    if (page.next === null) return;
    after = page.lastSeq;
  }
}

/** Every stored row of a dataset still holding content (any version, an unfinished add's too): what its deletion marks. */
export async function storedRecordKeys(store: Store, tenant: string, datasetId: string): Promise<Array<{ id: string; seq: number; version: number }>> {
  const rows = await store.query<{ RecordId: string; Seq: number; Version: number }>(
    'SELECT RecordId, Seq, Version FROM dataset_records FINAL WHERE TenantId = {tenant:String} AND DatasetId = {dataset:String} AND Deleted = 0 ORDER BY Seq',
    { tenant, dataset: datasetId },
  );
  return rows.map((r) => ({ id: r.RecordId, seq: Number(r.Seq), version: Number(r.Version) }));
}
