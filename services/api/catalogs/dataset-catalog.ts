/**
 * Datasets as the api sees them (docs/datasets.md): an EntityView of the compacted svc.datasets
 * topic by dataset id, indexed by tenant and name, and the writes of svc.dataset-records, whose
 * rows are read back from ClickHouse (datasets/record-reads.ts).
 *
 * Names are chosen by callers and scoped per tenant (another tenant's name is not found; two live
 * datasets of one tenant never share one); `ds_` ids are global (another tenant's is a 403).
 *
 * An add of records takes the dataset's next version in turn with the other adds of that dataset
 * (a KeyedQueue): its records go to the log first and are awaited in the table, and only then
 * does the dataset's new version appear, so a reader never sees a version whose records are not
 * all readable. An add that dies in between leaves records past the dataset's count, which no
 * read includes and the next add writes over (same key, same place).
 */
import { publish, type Kernel, type OutgoingEvent } from '../../kernel/actor.ts';
import type { Principal } from '../../kernel/auth.ts';
import { EntityCatalog } from '../../kernel/entity-view.ts';
import { AppError } from '../../kernel/errors.ts';
import { eventIds, newDatasetId, newEventId, newRecordId } from '../../kernel/ids.ts';
import { KeyedQueue } from '../../kernel/keyed-queue.ts';
import type { RecordPosition } from '../../kernel/log/event-log.ts';
import { TOPICS } from '../../kernel/topics.ts';
import { type NewRecord, nextVersion, recordsAt } from '../../domain/datasets.ts';
import type { DatasetChanged, DatasetRecordAdded } from '../../domain/events/dataset-events.ts';
import type { CreateDataset } from '../datasets/dataset-request.ts';
import { storedRecordKeys } from '../datasets/record-reads.ts';

/** Bytes of records per append: well under the log's largest record batch (16 MiB on Kafka). */
const APPEND_BYTES = 4 * 1024 * 1024;

export interface AddResult {
  dataset_id: string;
  added: number;
  version: number;
  records: number;
}

const recordKey = (datasetId: string, seq: number) => `${datasetId}/${seq}`;

export class DatasetCatalog extends EntityCatalog<DatasetChanged> {
  /** tenant -> name -> the live dataset of that name. */
  private readonly byName = new Map<string, Map<string, DatasetChanged>>();
  /** Creations of one tenant (names, the per-tenant limit) and writes of one dataset take turns. */
  private readonly queue = new KeyedQueue();

  constructor(kernel: Kernel) {
    super(kernel, TOPICS.datasets);
  }

  protected override changed(previous: DatasetChanged | undefined, next: DatasetChanged | null): void {
    const row = next ?? previous;
    if (!row) return;
    const names = this.byName.get(row.tenant) ?? new Map<string, DatasetChanged>();
    this.byName.set(row.tenant, names);
    if (previous && names.get(previous.name)?.dataset_id === previous.dataset_id) names.delete(previous.name);
    if (next && !next.deleted) names.set(next.name, next);
  }

  /** A live dataset of the caller's tenant: 404 when unknown or deleted, 403 when another tenant's. */
  owned(principal: Principal, id: string): DatasetChanged {
    return this.ofTenant(principal.tenant, id);
  }

  /** A live dataset of `tenant`: 404 when unknown or deleted, 403 when another tenant's. */
  ofTenant(tenant: string, id: string): DatasetChanged {
    return this.ownedBy(tenant, id, 'dataset', (d) => d.deleted);
  }

  /** The tenant's live dataset of that name, if any. */
  named(tenant: string, name: string): DatasetChanged | undefined {
    return this.byName.get(tenant)?.get(name);
  }

  /** The tenant's live datasets by name. */
  list(tenant: string): DatasetChanged[] {
    return [...(this.byName.get(tenant)?.values() ?? [])].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  }

  /**
   * Creates a dataset at version 1; on return the next read sees it. With an idempotent request's
   * `seed`, its id derives from it: a retry after a crash that came after it was stored answers
   * with it.
   */
  async create(tenant: string, request: CreateDataset, seed: string | null): Promise<DatasetChanged> {
    return this.queue.run(`tenant:${tenant}`, async () => {
      const id = newDatasetId(seed);
      const made = seed === null ? undefined : this.view.entities.get(id);
      if (made) return made;
      const { datasetsPerTenant } = this.kernel.config;
      const taken = this.named(tenant, request.name);
      if (taken) throw new AppError('conflict', `name: a dataset named ${JSON.stringify(request.name)} already exists (${taken.dataset_id})`);
      const live = this.byName.get(tenant)?.size ?? 0;
      if (live >= datasetsPerTenant)
        throw new AppError('conflict', `the tenant has ${live} datasets, the limit (SVC_DATASETS_PER_TENANT = ${datasetsPerTenant}); delete one first`);
      const now = Date.now();
      const dataset: DatasetChanged = {
        tenant,
        event_id: newEventId(),
        ts: now,
        dataset_id: id,
        name: request.name,
        description: request.description,
        version: 1,
        versions: [{ version: 1, records: 0, added: 0, created_at: now, add_id: eventIds(seed)('dataset created') }],
        created_at: now,
        deleted: false,
      };
      await this.put(dataset);
      return dataset;
    });
  }

  /**
   * Adds records as the dataset's next version; on return a read of that version sees them all.
   * A 409 names the limit an add would cross (versions, records). With an idempotent request's
   * `seed`, the records' ids and the add's id derive from it: a retry after a crash that came
   * after the version was made answers with that version instead of adding another.
   */
  async addRecords(principal: Principal, id: string, records: NewRecord[], seed: string | null): Promise<AddResult> {
    return this.queue.run(`dataset:${id}`, async () => {
      const dataset = this.owned(principal, id);
      const addId = eventIds(seed)('dataset add');
      const done = seed === null ? undefined : dataset.versions.find((v) => v.add_id === addId);
      if (done) return { dataset_id: id, added: done.added, version: done.version, records: done.records };
      this.checkLimits(dataset, records.length);
      const now = Date.now();
      const version = nextVersion(dataset, records.length, addId, now);
      const base = recordsAt(dataset, dataset.version);
      const ids = eventIds(seed);
      const events = records.map(
        (r, i): DatasetRecordAdded => ({
          tenant: dataset.tenant,
          event_id: ids(`record ${i}`),
          ts: now,
          dataset_id: id,
          record_id: newRecordId(seed, i),
          version: version.version,
          seq: base + i + 1,
          input: JSON.stringify(r.input),
          expected: r.expected === undefined ? null : JSON.stringify(r.expected),
          metadata: r.metadata === undefined ? null : JSON.stringify(r.metadata),
          tags: r.tags,
          created_at: now,
          deleted: false,
        }),
      );
      await this.appendRecords(events);
      await this.put({
        ...dataset,
        event_id: newEventId(),
        ts: Math.max(now, dataset.ts + 1),
        version: version.version,
        versions: [...dataset.versions, version],
      });
      return { dataset_id: id, added: records.length, version: version.version, records: version.records };
    });
  }

  /** Deletes a dataset and all its records: each record is marked (its content emptied), then the dataset. */
  async delete(principal: Principal, id: string): Promise<void> {
    await this.queue.run(`dataset:${id}`, async () => {
      const dataset = this.owned(principal, id);
      const now = Date.now();
      const stored = await storedRecordKeys(this.kernel.store, dataset.tenant, id);
      const markers = stored.map(
        (r): DatasetRecordAdded => ({
          tenant: dataset.tenant,
          event_id: newEventId(),
          ts: now,
          dataset_id: id,
          record_id: r.id,
          version: r.version,
          seq: r.seq,
          input: '',
          expected: null,
          metadata: null,
          tags: [],
          created_at: now,
          deleted: true,
        }),
      );
      await this.appendRecords(markers);
      await this.put({ ...dataset, event_id: newEventId(), ts: Math.max(now, dataset.ts + 1), deleted: true });
    });
  }

  private checkLimits(dataset: DatasetChanged, adding: number): void {
    const { datasetMaxVersions, datasetMaxRecords } = this.kernel.config;
    if (dataset.version >= datasetMaxVersions) {
      throw new AppError(
        'conflict',
        `dataset ${dataset.dataset_id} has ${dataset.version} versions, the limit (SVC_DATASET_MAX_VERSIONS = ${datasetMaxVersions}); an add of records would make another`,
      );
    }
    const have = recordsAt(dataset, dataset.version);
    if (have + adding > datasetMaxRecords) {
      throw new AppError(
        'conflict',
        `dataset ${dataset.dataset_id} has ${have} records; ${adding} more would pass the limit of ${datasetMaxRecords} records per dataset (SVC_DATASET_MAX_RECORDS)`,
      );
    }
  }

  /** Appends records in batches of at most APPEND_BYTES, and waits until the records table holds them all. */
  private async appendRecords(records: DatasetRecordAdded[]): Promise<void> {
    const positions: RecordPosition[] = [];
    let batch: OutgoingEvent[] = [];
    let bytes = 0;
    const flush = async () => {
      if (batch.length > 0) positions.push(...(await publish(this.kernel, TOPICS.datasetRecords, batch)));
      batch = [];
      bytes = 0;
    };
    for (const r of records) {
      const size = r.input.length + (r.expected?.length ?? 0) + (r.metadata?.length ?? 0) + 256;
      if (bytes + size > APPEND_BYTES) await flush();
      batch.push({ key: recordKey(r.dataset_id, r.seq), tenant: r.tenant, value: r });
      bytes += size;
    }
    await flush();
    if (positions.length > 0) await this.kernel.visibility.waitFor(positions, this.kernel.config.replyTimeout);
  }

  private async put(dataset: DatasetChanged): Promise<void> {
    await this.append([{ key: dataset.dataset_id, tenant: dataset.tenant, value: dataset }]);
  }
}
