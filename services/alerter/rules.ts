/**
 * The rules that apply to a completed experiment, ready to evaluate: the tenant's API rules whose
 * eval_id is the experiment's spec or null (and that existed when it completed), and the rules
 * of the `alerts` block of the spec version it ran. And the firing a rule that holds records.
 */
import { createHash } from 'node:crypto';
import {
  parseAlertCondition,
  parseAlertWindow,
  type CompletedExperiment,
  type EvaluableRule,
  type Evaluation,
  type NotificationOutcome,
} from '../domain/alerts.ts';
import type { AlertChannel, AlertChanged, AlertFired } from '../domain/events/alert-events.ts';
import type { SpecAlert } from '../domain/spec.ts';
import { newAlertId, newEventId } from '../kernel/ids.ts';
import { isSlackWebhook } from './notifiers.ts';

/** A rule with where it notifies. */
export interface ApplicableRule extends EvaluableRule {
  conditionText: string;
  notify: AlertChannel;
  /** A webhook URL, a channel, or the addresses as JSON. */
  destination: string;
}

/** An API rule as evaluable, or why it cannot be (a rule stored by an older grammar). */
export function fromApiRule(r: AlertChanged, maxWindowMs: number): ApplicableRule | string {
  const parsed = parseAlertCondition(r.condition);
  if ('problems' in parsed) return parsed.problems.join('; ');
  let window: EvaluableRule['window'];
  try {
    window = parseAlertWindow(r.window, maxWindowMs);
  } catch (err) {
    return (err as Error).message;
  }
  const destination = r.notify === 'webhook' ? r.webhook_url! : r.notify === 'slack' ? r.slack_channel! : JSON.stringify(r.email_to);
  return {
    id: r.alert_id,
    name: r.name,
    source: 'api',
    eval_id: r.eval_id,
    condition: parsed.condition,
    window,
    windowText: r.window,
    conditionText: r.condition,
    notify: r.notify,
    destination,
  };
}

/** The id of a spec's rule: stable across the spec's versions while its name is (its firings and dedup follow it). */
export function specRuleId(tenant: string, specId: string, name: string): string {
  return newAlertId(`spec rule\n${tenant}\n${specId}\n${name}`);
}

/** A rule of a spec's `alerts` block as evaluable, or why it cannot be. */
export function fromSpecAlert(tenant: string, specId: string, a: SpecAlert, maxWindowMs: number): ApplicableRule | string {
  const parsed = parseAlertCondition(a.condition.text);
  if ('problems' in parsed) return parsed.problems.join('; ');
  let window: EvaluableRule['window'];
  try {
    window = parseAlertWindow(a.window ?? null, maxWindowMs);
  } catch (err) {
    return (err as Error).message;
  }
  const destination = a.notify === 'webhook' ? a.webhook_url! : a.notify === 'slack' ? a.slack_channel! : JSON.stringify(a.email_to ?? []);
  return {
    id: specRuleId(tenant, specId, a.name),
    name: a.name,
    source: 'spec',
    eval_id: specId,
    condition: parsed.condition,
    window,
    windowText: a.window ?? null,
    conditionText: a.condition.text,
    notify: a.notify,
    destination,
  };
}

/** The firing id of a rule's evaluation: one per rule, experiment and trigger, so evaluating again finds it. */
export function firingIdOf(tenant: string, ruleId: string, experimentId: string, trigger: string): string {
  return `firing_${createHash('sha256').update(`${tenant}\n${ruleId}\n${experimentId}\n${trigger}`).digest('hex').slice(0, 16)}`;
}

/** What a firing shows of its destination: a webhook URL's origin only (the path may carry a token). */
function targetOf(rule: ApplicableRule): string {
  if (rule.notify === 'webhook') {
    try {
      return new URL(rule.destination).origin;
    } catch {
      return 'webhook';
    }
  }
  return rule.notify === 'email' ? (JSON.parse(rule.destination) as string[]).join(', ') : rule.destination;
}

export interface FiringFacts {
  firingId: string;
  trigger: 'completion' | 'request';
  firedAt: number;
  /** The firing this one repeats within the dedup window: recorded `deduplicated`, nothing sent. */
  duplicateOf: string | null;
  slackWebhookHosts: readonly string[];
}

/** The firing's first state: pending (to deliver) or deduplicated. */
export function newFiring(rule: ApplicableRule, experiment: CompletedExperiment, ev: Evaluation, facts: FiringFacts): AlertFired {
  const target = targetOf(rule);
  const notification: NotificationOutcome = {
    channel: rule.notify,
    ...(rule.notify === 'webhook' && { format: isSlackWebhook(rule.destination, facts.slackWebhookHosts) ? ('slack_card' as const) : ('json' as const) }),
    target,
    status: 'pending',
    attempts: [],
  };
  return {
    tenant: experiment.tenant,
    event_id: newEventId(),
    ts: facts.firedAt,
    firing_id: facts.firingId,
    rule_id: rule.id,
    rule_name: rule.name,
    rule_source: rule.source,
    eval_id: rule.eval_id,
    experiment_id: experiment.experiment_id,
    experiment_name: experiment.name,
    spec_id: experiment.spec_id,
    condition: rule.conditionText,
    window: rule.windowText,
    metric: rule.condition.metric,
    metric_value: ev.metric_value,
    threshold: ev.threshold,
    reason: ev.reason,
    details: JSON.stringify(ev.details),
    fired_at: facts.firedAt,
    trigger: facts.trigger,
    status: facts.duplicateOf === null ? 'pending' : 'deduplicated',
    duplicate_of: facts.duplicateOf,
    notify: rule.notify,
    target,
    destination: rule.destination,
    notifications: JSON.stringify(facts.duplicateOf === null ? [notification] : []),
    interruptions: 0,
  };
}
