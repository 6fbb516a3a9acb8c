/**
 * Datasets (docs/datasets.md): versioned collections of input/expected records, and the
 * scenarios an experiment makes of them. Pure: the api stores and reads them.
 *
 *   create            version 1, no records
 *   add N records     version + 1; each record gets an id, that version and the next places (seq)
 *   read version V    every record whose version is at most V (so old versions stay readable),
 *                     optionally only those carrying any of some tags
 *   experiment        one scenario per selected record and matrix entry, record-major
 */
import type { DatasetChanged, DatasetVersion } from './events/dataset-events.ts';
import { type Params, type ScenarioRecord, withRecord } from './params.ts';

/** A dataset's name: 1 to 200 characters, no control characters, no space at either end. */
export const DATASET_NAME = /^(?=\S)[^\x00-\x1f\x7f]{1,200}(?<=\S)$/;
/** A tag: 1 to 100 characters, no space at either end, neither commas (the read filter separates tags with them) nor control characters. */
export const TAG = /^(?=\S)[^,\x00-\x1f\x7f]{1,100}(?<=\S)$/;
export const DESCRIPTION_MAX = 2000;
export const TAGS_PER_RECORD_MAX = 50;
/** The most scenarios (records x matrix entries) one experiment over a dataset may have. */
export const DATASET_SCENARIOS_MAX = 10_000;

/** The Dataset resource of the spec, with its record count and when it last changed. */
export interface Dataset {
  id: string;
  /** The tenant (billing owner) of the key that created it. */
  user_id: string;
  name: string;
  description: string;
  version: number;
  /** Records of the newest version. */
  records: number;
  created_at: string;
  updated_at: string;
}

/** One dataset with the history of its versions (GET /v1/datasets/:id). */
export type DatasetDetail = Dataset & { versions: Array<{ version: number; records: number; added: number; created_at: string }> };

/** The DatasetRecord resource: a scenario's record (`expected` and `metadata` absent when it has none) and when it was added. */
export type DatasetRecord = Omit<ScenarioRecord, 'dataset_id'> & { created_at: string };

/** What an add of records is made of, before the store gives it ids and places. */
export interface NewRecord {
  input: unknown;
  expected?: unknown;
  metadata?: unknown;
  tags: string[];
}

const iso = (ms: number) => new Date(ms).toISOString();

export function datasetView(d: DatasetChanged): Dataset {
  return {
    id: d.dataset_id,
    user_id: d.tenant,
    name: d.name,
    description: d.description ?? '',
    version: d.version,
    records: recordsAt(d, d.version),
    created_at: iso(d.created_at),
    updated_at: iso(d.versions.at(-1)?.created_at ?? d.created_at),
  };
}

export function datasetDetail(d: DatasetChanged): DatasetDetail {
  return { ...datasetView(d), versions: d.versions.map((v) => ({ version: v.version, records: v.records, added: v.added, created_at: iso(v.created_at) })) };
}

/** How many records version `version` has (every record added up to it). */
export function recordsAt(d: DatasetChanged, version: number): number {
  return d.versions[version - 1]?.records ?? 0;
}

/** The version an add makes of `d`: one more, with `added` more records. */
export function nextVersion(d: DatasetChanged, added: number, addId: string, now: number): DatasetVersion {
  return { version: d.version + 1, records: recordsAt(d, d.version) + added, added, created_at: now, add_id: addId };
}

/**
 * The bytes a record counts against the record size limit: its JSON as the API shows it, without
 * the server-set fields (id, version, created_at).
 */
export function recordBytes(record: NewRecord): number {
  return Buffer.byteLength(JSON.stringify({ input: record.input, expected: record.expected, metadata: record.metadata, tags: record.tags }));
}

/** The scenario record of a stored record, as a scenario's params carry it. */
export function scenarioRecordOf(datasetId: string, record: DatasetRecord): ScenarioRecord {
  return {
    dataset_id: datasetId,
    id: record.id,
    version: record.version,
    input: record.input,
    ...(record.expected !== undefined && { expected: record.expected }),
    ...(record.metadata !== undefined && { metadata: record.metadata }),
    tags: record.tags,
  };
}

/**
 * The scenarios of an experiment over a dataset, record-major: record r with matrix entry m is
 * scenario r x matrix.length + m. `first` is the index of the first of these records.
 */
export function datasetScenarios(records: ScenarioRecord[], matrix: Params[], first = 0): Array<{ index: number; params: Params }> {
  return records.flatMap((record, r) => matrix.map((entry, m) => ({ index: (first + r) * matrix.length + m, params: withRecord(entry, record) })));
}

/** An experiment's scenarios: its matrix entries, times its dataset's selected records when it runs one. */
export function scenarioCount(matrixEntries: number, dataset: { records: number } | undefined): number {
  return matrixEntries * (dataset?.records ?? 1);
}
