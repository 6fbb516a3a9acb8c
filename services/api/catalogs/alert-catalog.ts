/**
 * What the api knows of alert rules: a view of the compacted svc.alerts topic by alert id (a
 * rule marked deleted is gone). Lists and ownership are served from it; a write answers once the
 * view shows it, so the next read in this process sees it. Creations of one tenant are
 * serialised, so concurrent ones never pass the per-tenant limit together.
 */
import type { Kernel } from '../../kernel/actor.ts';
import type { Principal } from '../../kernel/auth.ts';
import { EntityCatalog } from '../../kernel/entity-view.ts';
import { AppError } from '../../kernel/errors.ts';
import { KeyedQueue } from '../../kernel/keyed-queue.ts';
import type { AlertChanged } from '../../domain/events/alert-events.ts';
import { newEventId } from '../../kernel/ids.ts';
import { TOPICS } from '../../kernel/topics.ts';

export class AlertCatalog extends EntityCatalog<AlertChanged> {
  private readonly queue = new KeyedQueue();

  constructor(kernel: Kernel) {
    super(kernel, TOPICS.alerts);
  }

  /** A live rule, or undefined (unknown or deleted). */
  get(id: string): AlertChanged | undefined {
    const rule = this.view.entities.get(id);
    return rule && !rule.deleted ? rule : undefined;
  }

  /** The tenant's live rules, oldest first. */
  list(tenant: string): AlertChanged[] {
    return [...this.view.entities.values()]
      .filter((r) => r.tenant === tenant && !r.deleted)
      .sort((a, b) => a.created_at - b.created_at || a.alert_id.localeCompare(b.alert_id));
  }

  /** A rule of the caller's tenant: 404 when unknown or deleted, 403 when another tenant's (alert_ ids are global). */
  owned(principal: Principal, id: string): AlertChanged {
    return this.ownedBy(principal.tenant, id, 'alert', (r) => r.deleted);
  }

  /**
   * Stores a new rule, unless the one of that id exists already (an idempotent retry: returned as
   * it is); a 409 when the tenant has `limit` rules.
   */
  create(rule: AlertChanged, limit: number): Promise<AlertChanged> {
    return this.queue.run(rule.tenant, async () => {
      const made = this.view.entities.get(rule.alert_id);
      if (made) return made;
      const count = this.list(rule.tenant).length;
      if (count >= limit) {
        throw new AppError(
          'conflict',
          `alerts: you have ${count} alert rules, the most allowed (${limit}, SVC_ALERTS_PER_TENANT); delete one with DELETE /v1/alerts/:id first`,
        );
      }
      await this.append([{ key: rule.alert_id, tenant: rule.tenant, value: rule }]);
      return rule;
    });
  }

  async delete(rule: AlertChanged): Promise<void> {
    const gone: AlertChanged = { ...rule, event_id: newEventId(), ts: Math.max(Date.now(), rule.ts + 1), deleted: true };
    await this.append([{ key: rule.alert_id, tenant: rule.tenant, value: gone }]);
  }
}
