/**
 * Event shapes of svc.alerts (alert rules, entity), svc.alert-firings (each state of a firing,
 * entity) and the evaluation request/reply pair (svc.alert-evaluations, svc.alert-replies):
 * docs/alerts.md. The .avsc files in schemas/ are the source of truth; these types follow them.
 */

export type AlertChannel = 'slack' | 'webhook' | 'email';

/** A value of svc.alerts (schemas/alert-changed.avsc), keyed by alert id; `deleted` marks a removed rule (its id is never reused). */
export interface AlertChanged {
  tenant: string;
  event_id: string;
  ts: number;
  alert_id: string;
  name: string;
  /** The spec id the rule is scoped to; null: every experiment of the tenant. */
  eval_id: string | null;
  /** As written: `<metric> <operator> <number>` or `<metric> regressed`. */
  condition: string;
  window: string | null;
  notify: AlertChannel;
  slack_channel: string | null;
  webhook_url: string | null;
  email_to: string[];
  created_at: number;
  deleted: boolean;
}

/** Where a firing is: recorded, being delivered, done either way, or suppressed as a duplicate. */
export type FiringStatus = 'pending' | 'delivering' | 'delivered' | 'failed' | 'deduplicated';

/** A value of svc.alert-firings (schemas/alert-fired.avsc), keyed by firing id: the latest is the firing's state. */
export interface AlertFired {
  tenant: string;
  event_id: string;
  ts: number;
  firing_id: string;
  rule_id: string;
  rule_name: string;
  /** `api` (POST /v1/alerts) or `spec` (the spec's `alerts` block). */
  rule_source: 'api' | 'spec';
  eval_id: string | null;
  experiment_id: string;
  experiment_name: string;
  spec_id: string;
  condition: string;
  window: string | null;
  metric: string;
  metric_value: number | null;
  threshold: number | null;
  reason: string;
  /** What the evaluation saw (FiringDetails JSON: the window's experiments, the comparison of a regression). */
  details: string;
  fired_at: number;
  /** `completion` (an experiment completed) or `request` (POST /v1/alerts/:id/evaluate). */
  trigger: 'completion' | 'request';
  status: FiringStatus;
  /** The firing this one repeats within the dedup window (status `deduplicated`). */
  duplicate_of: string | null;
  notify: AlertChannel;
  /** The destination as shown: the channel, the addresses, or a webhook URL's origin (its path may carry a secret). */
  target: string;
  /** The destination as the notifier needs it (a webhook URL, a channel, addresses as JSON); never shown. */
  destination: string;
  /** NotificationOutcome[] JSON. */
  notifications: string;
  /** How often the alerter stopped while delivering it. */
  interruptions: number;
}

/** A value of svc.alert-evaluations (schemas/alert-evaluation-requested.avsc): the api asks the alerter to evaluate a rule now. */
export interface AlertEvaluationRequested {
  tenant: string;
  event_id: string;
  ts: number;
  correlation_id: string;
  alert_id: string;
  experiment_id: string;
  /** Evaluate and answer, record and notify nothing. */
  dry_run: boolean;
  /** Derives the firing id (an idempotent request's seed, else the correlation id). */
  seed: string;
}

/** A value of svc.alert-replies (schemas/alert-evaluation-replied.avsc). */
export interface AlertEvaluationReplied {
  tenant: string;
  event_id: string;
  ts: number;
  correlation_id: string;
  /** EvaluationAnswer JSON, or null with `error`. */
  answer: string | null;
  /** `<code>: <message>` of an AppError (e.g. `not_found: ...`). */
  error: string | null;
}
