/**
 * What the api knows of score rules: a view of the compacted svc.score-rules topic by rule id
 * (a tombstone deletes). Lists and ownership are served from it; a write answers once the view
 * shows it, so the next read in this process sees it.
 */
import type { Kernel } from '../../kernel/actor.ts';
import type { Principal } from '../../kernel/auth.ts';
import { EntityCatalog } from '../../kernel/entity-view.ts';
import type { ScoreRuleChanged } from '../../domain/events/score-events.ts';
import { TOPICS } from '../../kernel/topics.ts';

export class ScoreRuleCatalog extends EntityCatalog<ScoreRuleChanged> {
  constructor(kernel: Kernel) {
    super(kernel, TOPICS.scoreRules);
  }

  get(id: string): ScoreRuleChanged | undefined {
    return this.view.entities.get(id);
  }

  /** The tenant's rules, oldest first. */
  list(tenant: string): ScoreRuleChanged[] {
    return [...this.view.entities.values()]
      .filter((r) => r.tenant === tenant)
      .sort((a, b) => a.created_at - b.created_at || a.rule_id.localeCompare(b.rule_id));
  }

  /** A rule of the caller's tenant: 404 when unknown, 403 when another tenant's (rule_ ids are global). */
  owned(principal: Principal, id: string): ScoreRuleChanged {
    return this.ownedBy(principal.tenant, id, 'score rule');
  }

  async put(rule: ScoreRuleChanged): Promise<void> {
    await this.append([{ key: rule.rule_id, tenant: rule.tenant, value: rule }]);
  }

  async delete(rule: ScoreRuleChanged): Promise<void> {
    await this.append([{ key: rule.rule_id, tenant: rule.tenant, value: null }]);
  }
}
