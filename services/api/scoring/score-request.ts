/**
 * POST /v1/experiments/:id/score (docs/scoring.md): which score rules apply to a completed
 * experiment's stored runs, enqueued as one `svc.score-requests` event for the scorer; the call
 * answers 202 at once.
 */
import type { ExperimentChanged } from '../../domain/events/experiment-events.ts';
import type { ScoreRequested, ScoreRuleChanged } from '../../domain/events/score-events.ts';
import { ruleFromEvent } from '../../domain/score-rules.ts';
import { publish, type Kernel } from '../../kernel/actor.ts';
import { AppError, badRequest } from '../../kernel/errors.ts';
import { newEventId } from '../../kernel/ids.ts';
import { TOPICS } from '../../kernel/topics.ts';
import type { ScoreRuleCatalog } from '../catalogs/score-rule-catalog.ts';

const RULE_IDS_MAX = 100;

/** The body's `rule_ids`: undefined for every rule that applies. */
export function parseRuleIds(b: Record<string, unknown>): string[] | undefined {
  for (const field of Object.keys(b)) if (field !== 'rule_ids') throw badRequest(field, 'unknown field; accepted: rule_ids');
  const ids = b.rule_ids;
  if (ids !== undefined && (!Array.isArray(ids) || ids.length === 0 || ids.length > RULE_IDS_MAX || !ids.every((id) => typeof id === 'string' && id !== ''))) {
    throw badRequest(
      'rule_ids',
      `must be a list of 1 to ${RULE_IDS_MAX} score rule ids (rule_...); leave it out to apply every rule of the experiment's spec and every global rule`,
    );
  }
  return ids as string[] | undefined;
}

/** The rules to apply: the ones named (each the tenant's and applying), else every global rule and every rule of the experiment's spec. */
function chooseRules(rules: ScoreRuleCatalog, tenant: string, experiment: ExperimentChanged, ids: string[] | undefined): ScoreRuleChanged[] {
  const applies = (r: ScoreRuleChanged) => r.eval_id === null || r.eval_id === experiment.spec_id;
  if (ids === undefined) {
    const chosen = rules.list(tenant).filter(applies);
    if (chosen.length === 0)
      throw badRequest(
        'rule_ids',
        `no score rule applies to experiment ${experiment.experiment_id} (none is global or scoped to spec "${experiment.spec_id}"); create one with POST /v1/score-rules`,
      );
    return chosen;
  }
  return [...new Set(ids)].map((id, i) => {
    const rule = rules.get(id);
    if (!rule) throw badRequest(`rule_ids[${i}]`, `no score rule ${id} exists`);
    if (rule.tenant !== tenant) throw new AppError('forbidden', `rule_ids[${i}]: score rule ${id} belongs to another tenant`);
    if (!applies(rule))
      throw badRequest(
        `rule_ids[${i}]`,
        `score rule ${id} is scoped to spec "${rule.eval_id}", and experiment ${experiment.experiment_id} runs spec "${experiment.spec_id}"`,
      );
    return rule;
  });
}

/** Enqueues the scoring of a completed experiment (409 otherwise) and answers what was queued. */
export async function requestScoring(kernel: Kernel, rules: ScoreRuleCatalog, experiment: ExperimentChanged, ids: string[] | undefined, requestId: string) {
  if (experiment.status !== 'completed') {
    throw new AppError('conflict', `experiment ${experiment.experiment_id} is ${experiment.status}; only a completed experiment's runs are scored offline`);
  }
  const chosen = chooseRules(rules, experiment.tenant, experiment, ids);
  const request: ScoreRequested = {
    tenant: experiment.tenant,
    event_id: newEventId(),
    ts: Date.now(),
    request_id: requestId,
    experiment_id: experiment.experiment_id,
    rules: JSON.stringify(chosen.map(ruleFromEvent)),
    run: null,
  };
  await publish(kernel, TOPICS.scoreRequests, [{ key: experiment.experiment_id, tenant: experiment.tenant, value: request }]);
  return {
    request_id: request.request_id,
    experiment_id: experiment.experiment_id,
    rule_ids: chosen.map((r) => r.rule_id),
    runs: experiment.total_runs,
    status: 'queued',
  };
}
