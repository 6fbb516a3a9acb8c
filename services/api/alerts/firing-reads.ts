/**
 * Alert firings as the API shows them (GET /v1/alert-firings, GET /v1/alerts/:id/firings, GET
 * /v1/alert-firings/:id), read from ClickHouse (`alert_firings`, the latest state of each
 * firing), newest first, a page at a time. A read first waits until the table holds what was on
 * svc.alert-firings when it began. docs/alerts.md documents the record.
 */
import type { Kernel } from '../../kernel/actor.ts';
import type { Config } from '../../kernel/config.ts';
import { AppError, badRequest, notFound } from '../../kernel/errors.ts';
import { decodeCursor, encodeCursor, parseLimit } from '../pagination.ts';

const TABLE = 'alert_firings';
const STATUSES = ['pending', 'delivering', 'delivered', 'failed', 'deduplicated'];

interface FiringRow {
  TenantId: string;
  FiringId: string;
  RuleId: string;
  RuleName: string;
  RuleSource: string;
  EvalId: string;
  ExperimentId: string;
  ExperimentName: string;
  SpecId: string;
  Condition: string;
  AlertWindow: string;
  Metric: string;
  HasValue: number;
  MetricValue: number;
  HasThreshold: number;
  Threshold: number;
  Reason: string;
  Details: string;
  fired_ms: string;
  TriggeredBy: string;
  Status: string;
  DuplicateOf: string;
  Notify: string;
  Target: string;
  Notifications: string;
  Interruptions: number;
  updated_ms: string;
}

const COLUMNS = `TenantId, FiringId, RuleId, RuleName, RuleSource, EvalId, ExperimentId, ExperimentName, SpecId, Condition, AlertWindow, Metric,
  HasValue, MetricValue, HasThreshold, Threshold, Reason, Details, toUnixTimestamp64Milli(FiredAt) AS fired_ms, TriggeredBy, Status, DuplicateOf,
  Notify, Target, Notifications, Interruptions, toUnixTimestamp64Milli(UpdatedAt) AS updated_ms`;

const iso = (ms: string) => new Date(Number(ms)).toISOString();

function firingView(r: FiringRow) {
  return {
    id: r.FiringId,
    rule_id: r.RuleId,
    rule_name: r.RuleName,
    rule_source: r.RuleSource,
    eval_id: r.EvalId === '' ? null : r.EvalId,
    experiment_id: r.ExperimentId,
    experiment_name: r.ExperimentName,
    spec_id: r.SpecId,
    condition: r.Condition,
    window: r.AlertWindow === '' ? null : r.AlertWindow,
    metric: r.Metric,
    metric_value: r.HasValue === 1 ? r.MetricValue : null,
    threshold: r.HasThreshold === 1 ? r.Threshold : null,
    reason: r.Reason,
    details: JSON.parse(r.Details) as unknown,
    fired_at: iso(r.fired_ms),
    trigger: r.TriggeredBy,
    status: r.Status,
    duplicate_of: r.DuplicateOf === '' ? null : r.DuplicateOf,
    notify: r.Notify,
    target: r.Target,
    notifications: JSON.parse(r.Notifications) as unknown,
    interruptions: Number(r.Interruptions),
    updated_at: iso(r.updated_ms),
  };
}

export type FiringView = ReturnType<typeof firingView>;

export interface FiringQuery {
  ruleId: string | null;
  experimentId: string | null;
  status: string | null;
  cursor: string[] | null;
  limit: number;
}

/** The query parameters rule_id, experiment_id, status, limit and cursor. */
export function parseFiringQuery(q: Record<string, unknown>, config: Config): FiringQuery {
  const text = (name: string) => {
    const v = q[name] as string | undefined;
    if (v === '') throw badRequest(name, 'must not be empty');
    return v ?? null;
  };
  const status = text('status');
  if (status !== null && !STATUSES.includes(status)) throw badRequest('status', `must be one of ${STATUSES.join(', ')}`);
  const cursor = decodeCursor(q.cursor, 2);
  if (cursor && !/^\d+$/.test(cursor[0]!)) throw badRequest('cursor', 'is not a cursor returned by this endpoint');
  return { ruleId: text('rule_id'), experimentId: text('experiment_id'), status, cursor, limit: parseLimit(q.limit, config) };
}

/** One page of the tenant's firings, newest first, and the cursor after it. */
export async function firingPage(kernel: Kernel, tenant: string, query: FiringQuery): Promise<{ items: FiringView[]; next: string | null }> {
  await kernel.visibility.waitForTable(TABLE, null, kernel.config.replyTimeout);
  const { ruleId, experimentId, status, cursor, limit } = query;
  const rows = await kernel.store.query<FiringRow>(
    `SELECT ${COLUMNS} FROM ${TABLE} FINAL
     WHERE TenantId = {tenant:String}
       ${ruleId === null ? '' : 'AND RuleId = {rule:String}'}
       ${experimentId === null ? '' : 'AND ExperimentId = {experiment:String}'}
       ${status === null ? '' : 'AND Status = {status:String}'}
       ${cursor === null ? '' : 'AND (FiredAt, FiringId) < (fromUnixTimestamp64Milli({after_ms:Int64}), {after_id:String})'}
     ORDER BY FiredAt DESC, FiringId DESC
     LIMIT {limit:UInt32}`,
    {
      tenant,
      limit: limit + 1,
      ...(ruleId === null ? {} : { rule: ruleId }),
      ...(experimentId === null ? {} : { experiment: experimentId }),
      ...(status === null ? {} : { status }),
      ...(cursor === null ? {} : { after_ms: Number(cursor[0]), after_id: cursor[1] }),
    },
  );
  const items = rows.slice(0, limit).map(firingView);
  const last = rows.length > limit ? rows[limit - 1]! : null;
  return { items, next: last ? encodeCursor([last.fired_ms, last.FiringId]) : null };
}

/** One firing of the caller's tenant: 404 when unknown, 403 when another tenant's (firing ids are global). */
export async function firingById(kernel: Kernel, tenant: string, id: string): Promise<FiringView> {
  await kernel.visibility.waitForTable(TABLE, null, kernel.config.replyTimeout);
  const [row] = await kernel.store.query<FiringRow>(`SELECT ${COLUMNS} FROM ${TABLE} FINAL WHERE FiringId = {id:String} LIMIT 1`, { id });
  if (!row) throw notFound('alert firing', id);
  if (row.TenantId !== tenant) throw new AppError('forbidden', `alert firing ${id} belongs to another tenant`);
  return firingView(row);
}
