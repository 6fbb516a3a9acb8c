/**
 * Event -> row mappings of the alert tables (kernel/store/migrations/0011_alerts.sql). What a
 * row shows of a webhook URL is its origin: the rest of it may be a secret (an incoming-webhook
 * URL carries its token in the path).
 */
import type { AlertChanged, AlertFired } from '../domain/events/alert-events.ts';
import type { LogRecord } from '../kernel/log/event-log.ts';
import { clickhouseTimeMs } from './rows.ts';

function origin(url: string | null): string {
  if (url === null) return '';
  try {
    return new URL(url).origin;
  } catch {
    return '';
  }
}

export function alertRuleRow(a: AlertChanged, record: LogRecord): Record<string, unknown> {
  return {
    TenantId: a.tenant,
    AlertId: a.alert_id,
    Name: a.name,
    EvalId: a.eval_id ?? '',
    Condition: a.condition,
    AlertWindow: a.window ?? '',
    Notify: a.notify,
    SlackChannel: a.slack_channel ?? '',
    WebhookOrigin: origin(a.webhook_url),
    EmailTo: a.email_to,
    CreatedAt: clickhouseTimeMs(a.created_at),
    Deleted: a.deleted ? 1 : 0,
    UpdatedAt: clickhouseTimeMs(a.ts),
    LogPartition: record.partition,
    LogOffset: record.offset,
  };
}

export function alertFiringRow(f: AlertFired, record: LogRecord): Record<string, unknown> {
  return {
    TenantId: f.tenant,
    FiringId: f.firing_id,
    RuleId: f.rule_id,
    RuleName: f.rule_name,
    RuleSource: f.rule_source,
    EvalId: f.eval_id ?? '',
    ExperimentId: f.experiment_id,
    ExperimentName: f.experiment_name,
    SpecId: f.spec_id,
    Condition: f.condition,
    AlertWindow: f.window ?? '',
    Metric: f.metric,
    HasValue: f.metric_value === null ? 0 : 1,
    MetricValue: f.metric_value ?? 0,
    HasThreshold: f.threshold === null ? 0 : 1,
    Threshold: f.threshold ?? 0,
    Reason: f.reason,
    Details: f.details,
    FiredAt: clickhouseTimeMs(f.fired_at),
    TriggeredBy: f.trigger,
    Status: f.status,
    DuplicateOf: f.duplicate_of ?? '',
    Notify: f.notify,
    Target: f.target,
    Notifications: f.notifications,
    Interruptions: f.interruptions,
    UpdatedAt: clickhouseTimeMs(f.ts),
    LogPartition: record.partition,
    LogOffset: record.offset,
  };
}
