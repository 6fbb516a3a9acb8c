/**
 * The stored specs of every tenant, versioned, as the api sees them: an EntityView of the
 * compacted svc.specs topic, indexed by tenant and spec id. Spec ids are names chosen by callers,
 * so they are scoped per tenant (docs/decisions.md, "Names and ids"): another tenant's spec of
 * the same id is simply not found.
 */
import type { Delivered, Kernel } from '../../kernel/actor.ts';
import { EntityCatalog } from '../../kernel/entity-view.ts';
import { AppError, notFound } from '../../kernel/errors.ts';
import type { SpecStored } from '../../domain/events/spec-events.ts';
import { eventIds, newEventId } from '../../kernel/ids.ts';
import { parseSpec, specBundles, specDurations, type SpecDocument } from '../../domain/spec.ts';
import { lifetimeProblem } from '../../domain/sandbox-lifetime.ts';
import { refusedSource } from '../../kernel/secret-sources.ts';
import { TOPICS } from '../../kernel/topics.ts';
import type { AgentCatalog } from './agent-catalog.ts';
import type { BundleCatalog } from './bundle-catalog.ts';
import { KeyedQueue } from '../../kernel/keyed-queue.ts';

export interface SpecRecord {
  id: string;
  version: number;
  created_at: string;
  spec: Record<string, unknown>;
  yaml: string;
}

const key = (tenant: string, id: string, version: number) => `${tenant}/${id}/${version}`;

export class SpecCatalog extends EntityCatalog<SpecStored> {
  /** tenant -> spec id -> versions in ascending order. */
  private readonly byTenant = new Map<string, Map<string, SpecStored[]>>();
  /**
   * Each stored version's document, parsed once and kept as long as the version is: a tenant's
   * list reads every spec, which a cache bounded by size would churn through (domain/spec-cache.ts
   * serves the texts read from elsewhere: pinned experiments, history).
   */
  private readonly parsed = new WeakMap<SpecStored, SpecDocument>();
  private readonly queue = new KeyedQueue();

  constructor(
    kernel: Kernel,
    private readonly agents: AgentCatalog,
    private readonly bundles: BundleCatalog,
  ) {
    super(kernel, TOPICS.specs);
  }

  /** Entities by `tenant/id/version`; a deletion marker drops every version of its spec. */
  protected override fold(entities: Map<string, SpecStored>, { record, value }: Delivered<SpecStored>): void {
    if (record.key === null) return;
    const [tenant, id] = record.key.split('/');
    const specs = this.byTenant.get(tenant) ?? new Map<string, SpecStored[]>();
    this.byTenant.set(tenant, specs);
    if (value === null || value.deleted) {
      entities.delete(record.key);
      if (value?.deleted) specs.delete(id);
      else {
        const rest = (specs.get(id) ?? []).filter((v) => key(tenant, id, v.version) !== record.key);
        if (rest.length > 0) specs.set(id, rest);
        else specs.delete(id);
      }
      return;
    }
    entities.set(record.key, value);
    specs.set(
      id,
      [...(specs.get(id) ?? []).filter((v) => v.version !== value.version), value].sort((a, b) => a.version - b.version),
    );
  }

  /**
   * Validates and stores a new version of a spec; it is readable when this returns. With an
   * idempotent request's `seed`, the version's event id derives from it: a retry after a crash
   * that came after the version was stored answers with that version instead of adding another.
   */
  async put(tenant: string, yaml: string, seed: string | null = null): Promise<SpecRecord> {
    const doc = parseSpec(yaml);
    const refused = Object.entries(doc.secrets).flatMap(([name, source]) => {
      const why = refusedSource(name, source, this.kernel.config);
      return why ? [`secrets.${name}${name in doc.brokered ? '.source' : ''}: ${why}`] : [];
    });
    for (const { path, ms } of specDurations(doc)) {
      const problem = lifetimeProblem(ms, this.kernel.config.sandboxMaxLifetime);
      if (problem) refused.push(`${path}: ${problem}`);
    }
    if (doc.agent?.type === 'snapshot' && doc.agent.snapshot_id !== undefined && !this.agents.exists(tenant, doc.agent.snapshot_id)) {
      refused.push(`agent.snapshot_id: no agent snapshot ${doc.agent.snapshot_id} exists (GET /v1/agents/:name/versions lists them)`);
    }
    for (const { path, digest } of specBundles(doc)) {
      if (!this.bundles.has(tenant, digest)) refused.push(`${path}: no bundle ${digest} was uploaded (POST /v1/bundles)`);
    }
    if (refused.length > 0) throw new AppError('bad_request', `spec: ${refused.join('; ')}`);
    return this.queue.run(`${tenant}/${doc.id}`, async () => {
      const versions = this.byTenant.get(tenant)?.get(doc.id) ?? [];
      const eventId = eventIds(seed)('spec version');
      const already = versions.find((v) => v.event_id === eventId);
      if (already) return this.record(already, this.document(already));
      const version = (versions[versions.length - 1]?.version ?? 0) + 1;
      const stored: SpecStored = { tenant, event_id: eventId, ts: Date.now(), spec_id: doc.id, version, yaml, deleted: false };
      await this.append([{ key: key(tenant, doc.id, version), tenant, value: stored }]);
      this.parsed.set(
        this.byTenant
          .get(tenant)
          ?.get(doc.id)
          ?.find((v) => v.version === version) ?? stored,
        doc,
      );
      return this.record(stored, doc);
    });
  }

  /** The latest version, or version `version`; 404 when absent. */
  get(tenant: string, id: string, version?: number): { stored: SpecStored; doc: SpecDocument; record: SpecRecord } {
    const versions = this.byTenant.get(tenant)?.get(id);
    const stored = version === undefined ? versions?.[versions.length - 1] : versions?.find((v) => v.version === version);
    if (!stored) throw version === undefined || !versions ? notFound('spec', id) : notFound('spec version', `${id}@${version}`);
    const doc = this.document(stored);
    return { stored, doc, record: this.record(stored, doc) };
  }

  list(tenant: string): SpecRecord[] {
    const specs = this.byTenant.get(tenant);
    if (!specs) return [];
    return [...specs.values()]
      .map((versions) => versions[versions.length - 1])
      .sort((a, b) => a.spec_id.localeCompare(b.spec_id))
      .map((stored) => this.record(stored, this.document(stored)));
  }

  /** Deletes every version: a deletion marker, then tombstones so compaction frees them. */
  async delete(tenant: string, id: string): Promise<void> {
    const versions = this.byTenant.get(tenant)?.get(id);
    if (!versions || versions.length === 0) throw notFound('spec', id);
    const marker: SpecStored = { tenant, event_id: newEventId(), ts: Date.now(), spec_id: id, version: 0, yaml: '', deleted: true };
    await this.append([
      { key: `${tenant}/${id}/deleted`, tenant, value: marker },
      ...versions.map((v) => ({ key: key(tenant, id, v.version), tenant, value: null })),
    ]);
  }

  private document(stored: SpecStored): SpecDocument {
    let doc = this.parsed.get(stored);
    if (!doc) {
      doc = parseSpec(stored.yaml);
      this.parsed.set(stored, doc);
    }
    return doc;
  }

  private record(stored: SpecStored, doc: SpecDocument): SpecRecord {
    return { id: stored.spec_id, version: stored.version, created_at: new Date(stored.ts).toISOString(), spec: doc.raw, yaml: stored.yaml };
  }
}
