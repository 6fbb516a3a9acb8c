/**
 * Event shapes of svc.datasets (the dataset entity) and svc.dataset-records (its records),
 * docs/datasets.md. The .avsc files in schemas/ are the source of truth; these types follow them.
 *
 * A dataset's version is 1 at creation (no records) and one more per add of records; version N is
 * every record whose own `version` is at most N. Records are immutable once added. Deleting a
 * dataset marks each record and then the dataset `deleted` (their content emptied), so compaction
 * keeps nothing of them but the marker, and the tables' latest rows are the markers too.
 */

/** One version of a dataset: the add that made it. */
export interface DatasetVersion {
  version: number;
  /** Records of this version and every earlier one. */
  records: number;
  /** Records this version's add added (0 for version 1). */
  added: number;
  created_at: number;
  /** The add's own id (derived from an idempotent request's key): a retry after a crash finds its version. */
  add_id: string;
}

/** A value of svc.datasets (schemas/dataset-changed.avsc), compacted by dataset id. */
export interface DatasetChanged {
  tenant: string;
  event_id: string;
  ts: number;
  dataset_id: string;
  name: string;
  description: string | null;
  /** The newest version; versions[version - 1] is it. */
  version: number;
  versions: DatasetVersion[];
  created_at: number;
  deleted: boolean;
}

/** A value of svc.dataset-records (schemas/dataset-record-added.avsc), compacted by `<dataset id>/<seq>`. */
export interface DatasetRecordAdded {
  tenant: string;
  event_id: string;
  ts: number;
  dataset_id: string;
  record_id: string;
  /** The version of the add that created it. */
  version: number;
  /** Its place in the dataset, from 1: records of version N are those with seq <= versions[N - 1].records. */
  seq: number;
  /** JSON text of each field; null when the record has none (input always has one). */
  input: string;
  expected: string | null;
  metadata: string | null;
  tags: string[];
  created_at: number;
  deleted: boolean;
}
