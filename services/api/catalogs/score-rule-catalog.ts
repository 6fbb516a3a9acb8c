/**
 * What the api knows of score rules: a view of the compacted svc.score-rules topic by rule id
 * (a tombstone deletes). Lists and ownership are served from it; a write answers once the view
 * shows it, so the next read in this process sees it.
 */
import { publish, type Kernel } from '../../kernel/actor.ts';
import type { Principal } from '../../kernel/auth.ts';
import { EntityView } from '../../kernel/entity-view.ts';
import { AppError, notFound } from '../../kernel/errors.ts';
import type { ScoreRuleChanged } from '../../domain/events/score-events.ts';
import { TOPICS } from '../../kernel/topics.ts';

export class ScoreRuleCatalog {
  private readonly view = new EntityView<ScoreRuleChanged>(TOPICS.scoreRules);

  constructor(private readonly kernel: Kernel) {}

  start(): Promise<void> {
    return this.view.start(this.kernel);
  }

  stop(): Promise<void> {
    return this.view.stop();
  }

  get(id: string): ScoreRuleChanged | undefined {
    return this.view.entities.get(id);
  }

  /** The tenant's rules, oldest first. */
  list(tenant: string): ScoreRuleChanged[] {
    return [...this.view.entities.values()].filter((r) => r.tenant === tenant).sort((a, b) => a.created_at - b.created_at || a.rule_id.localeCompare(b.rule_id));
  }

  /** A rule of the caller's tenant: 404 when unknown, 403 when another tenant's (rule_ ids are global). */
  owned(principal: Principal, id: string): ScoreRuleChanged {
    const rule = this.view.entities.get(id);
    if (!rule) throw notFound('score rule', id);
    if (rule.tenant !== principal.tenant) throw new AppError('forbidden', `score rule ${id} belongs to another tenant`);
    return rule;
  }

  async put(rule: ScoreRuleChanged): Promise<void> {
    await this.append(rule.rule_id, rule.tenant, rule);
  }

  async delete(rule: ScoreRuleChanged): Promise<void> {
    await this.append(rule.rule_id, rule.tenant, null);
  }

  private async append(id: string, tenant: string, value: ScoreRuleChanged | null): Promise<void> {
    const positions = await publish(this.kernel, TOPICS.scoreRules, [{ key: id, tenant, value }]);
    await this.view.waitFor(positions, this.kernel.config.replyTimeout);
  }
}
