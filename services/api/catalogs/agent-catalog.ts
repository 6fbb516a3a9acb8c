/**
 * Agent snapshots as the api sees them: an EntityView of the compacted svc.agents topic, indexed
 * by tenant and name, and the BundleStore the bundles live in.
 *
 * Names are chosen by callers and scoped per tenant (another tenant's name is not found); snapshot
 * ids are global, `snap_<hex>` derived from tenant, name, version and digest, so a spec's
 * `snapshot_id` pins one row and so one content (docs/decisions.md, "Agent snapshot ids"). A
 * deleted row stays on the topic, flagged, so a version number or id is never handed out twice;
 * its blob is freed when no live row of any tenant uses the same bytes.
 */
import type { Kernel } from '../../kernel/actor.ts';
import { BundleStore, type ReceivedBundle } from '../../kernel/bundles.ts';
import { EntityCatalog } from '../../kernel/entity-view.ts';
import type { ResolvedAgent } from '../../domain/agent-auth.ts';
import { AppError, badRequest, notFound } from '../../kernel/errors.ts';
import type { SpecDocument } from '../../domain/spec.ts';
import type { AgentSnapshotChanged } from '../../domain/events/agent-events.ts';
import { eventIds, newEventId, sha256Hex } from '../../kernel/ids.ts';
import { KeyedQueue } from '../../kernel/keyed-queue.ts';
import { TOPICS } from '../../kernel/topics.ts';
import type { AgentMetadata } from '../agent-metadata.ts';

const RETENTION_SWEEP_MS = 60 * 60_000;

/** The AgentSnapshot resource of the spec. */
export interface AgentSnapshot {
  id: string;
  name: string;
  version: number;
  tag?: string;
  digest: string;
  size_bytes: number;
  storage_path: string;
  runtime?: string;
  entrypoint: string[];
  auth?: AgentMetadata['auth'];
  created_at: string;
}

export function snapshotView(row: AgentSnapshotChanged): AgentSnapshot {
  return {
    id: row.id,
    name: row.name,
    version: row.version,
    ...(row.tag !== null ? { tag: row.tag } : {}),
    digest: row.digest,
    size_bytes: row.size_bytes,
    storage_path: row.storage_path,
    ...(row.runtime !== null ? { runtime: row.runtime } : {}),
    entrypoint: row.entrypoint,
    ...(row.auth !== null ? { auth: JSON.parse(row.auth) as AgentMetadata['auth'] } : {}),
    created_at: new Date(row.created_at).toISOString(),
  };
}

export class AgentCatalog extends EntityCatalog<AgentSnapshotChanged> {
  readonly bundles: BundleStore;
  /** tenant -> name -> every row of that name (deleted ones too), ascending by version. */
  private readonly byTenant = new Map<string, Map<string, AgentSnapshotChanged[]>>();
  /** Uploads of one name take versions in turn; blob writes and frees of one digest never overlap. */
  private readonly queue = new KeyedQueue();
  private sweepTimer: NodeJS.Timeout | null = null;

  constructor(kernel: Kernel) {
    super(kernel, TOPICS.agents);
    this.bundles = new BundleStore(kernel.config.blobDir);
  }

  override async start(): Promise<void> {
    await this.bundles.sweepTemporary();
    await super.start();
    if (this.kernel.config.snapshotRetention !== null) {
      const every = Math.min(RETENTION_SWEEP_MS, this.kernel.config.snapshotRetention);
      this.sweepTimer = setInterval(() => void this.expire().catch((err) => this.kernel.logger.warn({ err }, 'snapshot retention sweep failed')), every);
      this.sweepTimer.unref();
    }
  }

  override async stop(): Promise<void> {
    if (this.sweepTimer) clearInterval(this.sweepTimer);
    await super.stop();
  }

  protected override changed(previous: AgentSnapshotChanged | undefined, next: AgentSnapshotChanged | null): void {
    const row = next ?? previous;
    if (!row) return;
    const names = this.byTenant.get(row.tenant) ?? new Map<string, AgentSnapshotChanged[]>();
    this.byTenant.set(row.tenant, names);
    const rows = (names.get(row.name) ?? []).filter((r) => r.id !== row.id);
    if (next) rows.push(next);
    rows.sort((a, b) => a.version - b.version);
    if (rows.length > 0) names.set(row.name, rows);
    else names.delete(row.name);
  }

  /**
   * Stores a received bundle as the next version of `metadata.name`; the row is readable on return.
   * With an idempotent request's `seed`, the row's event id derives from it: a retry after a crash
   * that came after the row was stored answers with that version instead of adding another.
   */
  async create(tenant: string, metadata: AgentMetadata, received: ReceivedBundle, seed: string | null = null): Promise<AgentSnapshot> {
    return this.queue.run(`name:${tenant}/${metadata.name}`, async () => {
      const rows = this.rows(tenant, metadata.name);
      const eventId = eventIds(seed)('agent snapshot');
      const already = rows.find((r) => r.event_id === eventId);
      if (already) {
        await this.bundles.discard(received);
        return snapshotView(already);
      }
      const live = rows.filter((r) => !r.deleted);
      if (live.length >= this.kernel.config.agentMaxVersions) {
        await this.bundles.discard(received);
        throw new AppError(
          'conflict',
          `agent ${metadata.name} already has ${live.length} versions, the limit (agents.max_versions); delete old ones with DELETE /v1/snapshots/:id`,
        );
      }
      const version = (rows[rows.length - 1]?.version ?? 0) + 1;
      const now = Date.now();
      return this.queue.run(`digest:${received.digest}`, async () => {
        const storagePath = await this.bundles.commit(received);
        const row: AgentSnapshotChanged = {
          tenant,
          event_id: eventId,
          ts: now,
          id: `snap_${sha256Hex(`${tenant}\n${metadata.name}\n${version}\n${received.digest}`).slice(0, 32)}`,
          name: metadata.name,
          version,
          tag: metadata.tag ?? null,
          digest: received.digest,
          size_bytes: received.sizeBytes,
          storage_path: storagePath,
          runtime: metadata.runtime ?? null,
          entrypoint: metadata.entrypoint,
          auth: metadata.auth ? JSON.stringify(metadata.auth) : null,
          created_at: now,
          deleted: false,
        };
        await this.put(row);
        return snapshotView(row);
      });
    });
  }

  /** Every row of a name, deleted ones included (they hold their version numbers). */
  private rows(tenant: string, name: string): AgentSnapshotChanged[] {
    return this.byTenant.get(tenant)?.get(name) ?? [];
  }

  /** Live versions of one agent, ascending; 404 when it has none. */
  versions(tenant: string, name: string): AgentSnapshotChanged[] {
    const live = this.rows(tenant, name).filter((r) => !r.deleted);
    if (live.length === 0) throw notFound('agent', name);
    return live;
  }

  latest(tenant: string, name: string): AgentSnapshotChanged {
    const live = this.versions(tenant, name);
    return live[live.length - 1];
  }

  /** The newest version carrying `tag`; `latest` is every agent's newest version. */
  byTag(tenant: string, name: string, tag: string): AgentSnapshotChanged {
    if (tag === 'latest') return this.latest(tenant, name);
    const tagged = this.versions(tenant, name).filter((r) => r.tag === tag);
    if (tagged.length === 0) throw notFound('agent tag', `${name}:${tag}`);
    return tagged[tagged.length - 1];
  }

  byVersion(tenant: string, name: string, version: number): AgentSnapshotChanged {
    const row = this.versions(tenant, name).find((r) => r.version === version);
    if (!row) throw notFound('agent version', `${name}@${version}`);
    return row;
  }

  /** A row by its global id: 404 when unknown or deleted, 403 when another tenant's. */
  byId(tenant: string, id: string): AgentSnapshotChanged {
    return this.ownedBy(tenant, id, 'snapshot', (row) => row.deleted);
  }

  /** Whether `id` is a live snapshot of this tenant (a spec's `snapshot_id` check). */
  exists(tenant: string, id: string): boolean {
    const row = this.view.entities.get(id);
    return row !== undefined && !row.deleted && row.tenant === tenant;
  }

  /** The newest version of each agent of a tenant, by name. */
  agents(tenant: string): AgentSnapshotChanged[] {
    const names = this.byTenant.get(tenant);
    if (!names) return [];
    return [...names.values()]
      .map((rows) => rows.filter((r) => !r.deleted).at(-1))
      .filter((r): r is AgentSnapshotChanged => r !== undefined)
      .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  }

  /**
   * The snapshot a sandbox of this spec boots with: `snapshot_id` pins a row, `snapshot` takes the
   * name's newest version. A 400 naming the spec's field when it no longer resolves.
   */
  resolveForSpec(tenant: string, doc: SpecDocument): ResolvedAgent | null {
    const agent = doc.agent;
    if (agent?.type !== 'snapshot') return null;
    let row: AgentSnapshotChanged;
    if (agent.snapshot_id !== undefined) {
      if (!this.exists(tenant, agent.snapshot_id))
        throw badRequest('agent.snapshot_id', `spec "${doc.id}" pins snapshot ${agent.snapshot_id}, which no longer exists`);
      row = this.view.entities.get(agent.snapshot_id)!;
    } else {
      const live = this.rows(tenant, agent.snapshot!).filter((r) => !r.deleted);
      if (live.length === 0)
        throw badRequest('agent.snapshot', `spec "${doc.id}" names agent "${agent.snapshot}", which has no stored snapshot (POST /v1/agents)`);
      row = live[live.length - 1];
    }
    return {
      snapshot_id: row.id,
      name: row.name,
      version: row.version,
      digest: row.digest,
      entrypoint: agent.entrypoint ?? row.entrypoint,
      auth: row.auth === null ? null : (JSON.parse(row.auth) as ResolvedAgent['auth']),
    };
  }

  /** Removes a row; the blob goes with the last live row that uses it. */
  async delete(tenant: string, id: string): Promise<void> {
    const row = this.byId(tenant, id);
    await this.queue.run(`digest:${row.digest}`, async () => {
      await this.put({ ...row, event_id: newEventId(), ts: Date.now(), deleted: true });
      const stillUsed = [...this.view.entities.values()].some((r) => r.digest === row.digest && !r.deleted);
      if (!stillUsed) await this.bundles.remove(row.digest);
    });
  }

  /** `retention.snapshots`: deletes rows older than the retention, never an agent's newest version. */
  async expire(now = Date.now()): Promise<number> {
    const retention = this.kernel.config.snapshotRetention;
    if (retention === null) return 0;
    const expired = [...this.byTenant.values()].flatMap((names) =>
      [...names.values()].flatMap((rows) => {
        const live = rows.filter((r) => !r.deleted);
        return live.slice(0, -1).filter((r) => r.created_at + retention < now);
      }),
    );
    for (const row of expired) await this.delete(row.tenant, row.id);
    return expired.length;
  }

  private async put(row: AgentSnapshotChanged): Promise<void> {
    await this.append([{ key: row.id, tenant: row.tenant, value: row }]);
  }
}
