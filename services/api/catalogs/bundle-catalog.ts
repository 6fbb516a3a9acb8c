/**
 * Task-file bundles (POST /v1/bundles): what the agent works on and what grades it, uploaded
 * like an agent's bundle and stored once per content under SVC_BLOB_DIR/task-files. The view of
 * the compacted svc.bundles topic says which tenant uploaded which digest: a spec names a bundle
 * by its digest, and only its own tenant's uploads count (the same bytes uploaded by another
 * tenant are not found for you, so a digest never tells whether someone else has that content).
 */
import path from 'node:path';
import type { Kernel } from '../../kernel/actor.ts';
import { BundleStore, TASK_FILES_SUBDIR, type ReceivedBundle } from '../../kernel/bundles.ts';
import { EntityCatalog } from '../../kernel/entity-view.ts';
import { notFound } from '../../kernel/errors.ts';
import { eventIds } from '../../kernel/ids.ts';
import { KeyedQueue } from '../../kernel/keyed-queue.ts';
import { TOPICS } from '../../kernel/topics.ts';
import type { BundleStored } from '../../domain/events/agent-events.ts';

export interface BundleView {
  digest: string;
  size_bytes: number;
  entries: number;
  created_at: string;
}

const key = (tenant: string, digest: string) => `${tenant}/${digest}`;

export function bundleView(row: BundleStored): BundleView {
  return { digest: row.digest, size_bytes: row.size_bytes, entries: row.entries, created_at: new Date(row.created_at).toISOString() };
}

export class BundleCatalog extends EntityCatalog<BundleStored> {
  readonly store: BundleStore;
  /** Uploads of one content take turns: one blob write, one row per tenant. */
  private readonly queue = new KeyedQueue();

  constructor(kernel: Kernel) {
    super(kernel, TOPICS.bundles);
    this.store = new BundleStore(path.join(kernel.config.blobDir, TASK_FILES_SUBDIR));
  }

  override async start(): Promise<void> {
    await this.store.sweepTemporary();
    await super.start();
  }

  /** Stores a received bundle for `tenant`; `created` false when the tenant had uploaded the same bytes already. */
  async put(tenant: string, received: ReceivedBundle, seed: string | null): Promise<{ bundle: BundleView; created: boolean }> {
    return this.queue.run(received.digest, async () => {
      const already = this.view.entities.get(key(tenant, received.digest));
      if (already) {
        await this.store.discard(received);
        return { bundle: bundleView(already), created: false };
      }
      const storagePath = await this.store.commit(received);
      const now = Date.now();
      const row: BundleStored = {
        tenant,
        event_id: eventIds(seed)('bundle'),
        ts: now,
        digest: received.digest,
        size_bytes: received.sizeBytes,
        entries: received.entries,
        storage_path: storagePath,
        created_at: now,
      };
      await this.append([{ key: key(tenant, row.digest), tenant, value: row }]);
      return { bundle: bundleView(row), created: true };
    });
  }

  has(tenant: string, digest: string): boolean {
    return this.view.entities.has(key(tenant, digest));
  }

  /** The tenant's bundle; 404 for a digest it never uploaded (whoever else did). */
  get(tenant: string, digest: string): BundleView {
    const row = this.view.entities.get(key(tenant, digest));
    if (!row) throw notFound('bundle', digest);
    return bundleView(row);
  }

  /** The tenant's bundles by digest. */
  list(tenant: string): BundleStored[] {
    return [...this.view.entities.values()].filter((r) => r.tenant === tenant).sort((a, b) => a.digest.localeCompare(b.digest));
  }
}
