/**
 * Reads of stored trace events (trace_events), in the API's shape: a keyset page of rows, a
 * sandbox's whole trace with its tool metrics, and the conditions of GET /v1/traces' filters.
 * Span reads (span-reads.ts) page on the same rows.
 */
import type { Store } from '../../kernel/store/store.ts';
import { badRequest } from '../../kernel/errors.ts';
import { EVENT_TYPES, formatTimestampUs, parseTimestampUs } from './validate-events.ts';

/**
 * GET /v1/sandboxes/:id/trace: every trace event of a sandbox (oldest first, up to 10,000) and
 * the spec's metrics over its tool events (tool_use and tool_call; a span's start and end count
 * once, by its end).
 */
export async function sandboxTrace(store: Store, tenant: string, sandboxId: string) {
  const params = { tenant, sandbox: sandboxId };
  const where = 'TenantId = {tenant:String} AND SandboxId = {sandbox:String}';
  // One scan: a row per tool, and the total row (is_total) with the overall p95.
  const [rows, groups] = await Promise.all([
    store.query<TraceRow>(
      `SELECT ${SELECT_TRACE_EVENT} FROM trace_events WHERE ${where} ORDER BY Timestamp, EventId LIMIT 1 BY Timestamp, EventId LIMIT 10000`,
      params,
    ),
    store.query<{ tool: string; is_total: number; n: string; mean_ms: number; errors: string; p95_ms: number }>(
      `SELECT SpanName AS tool, toUInt8(grouping(SpanName)) AS is_total, count() AS n, avg(Duration) / 1e6 AS mean_ms,
              countIf(StatusCode = 'Error') AS errors, quantile(0.95)(Duration) / 1e6 AS p95_ms
       FROM (SELECT * FROM trace_events WHERE ${where} AND EventType IN ('tool_use', 'tool_call') AND Phase != 'start' LIMIT 1 BY EventId)
       GROUP BY GROUPING SETS ((SpanName), ()) ORDER BY is_total, tool`,
      params,
    ),
  ]);
  const breakdown: Record<string, { count: number; mean_ms: number; error_rate: number }> = {};
  for (const t of groups.filter((g) => !g.is_total)) {
    const n = Number(t.n);
    breakdown[t.tool] = { count: n, mean_ms: t.mean_ms, error_rate: Number(t.errors) / n };
  }
  const totals = groups.find((g) => g.is_total);
  const total = Number(totals?.n ?? 0);
  return {
    events: rows.map(traceEventFromRow),
    metrics: {
      total_tool_calls: total,
      tool_success_rate: total === 0 ? 1 : (total - Number(totals!.errors)) / total,
      mean_duration_ms: total === 0 ? 0 : totals!.mean_ms,
      p95_duration_ms: total === 0 ? 0 : totals!.p95_ms,
      tool_breakdown: breakdown,
    },
  };
}

export interface TraceRow {
  ts_us: string;
  AgentSnapshotId: string;
  ScenarioId: string;
  RunId: string;
  EventId: string;
  EventType: string;
  SpanName: string;
  Phase: string;
  TraceId: string;
  SpanId: string;
  ParentSpanId: string;
  DurationMs: string;
  StatusCode: string;
  Input: string;
  Output: string;
  HasCost: number;
  InputTokens: string;
  OutputTokens: string;
  CacheReadTokens: string;
  ReasoningTokens: string;
  CostModel: string;
  EstimatedUsd: number;
  SpanAttributes: Record<string, string>;
  SandboxId: string | null;
  ExperimentId: string;
  ServiceName: string;
  TenantId: string;
}

/** The API shape of a stored trace event. */
export function traceEventFromRow(row: TraceRow) {
  return {
    event_id: row.EventId,
    ts: formatTimestampUs(Number(row.ts_us)),
    event_type: row.EventType,
    tool: row.SpanName,
    phase: row.Phase,
    trace_id: row.TraceId,
    span_id: row.SpanId,
    parent_span_id: row.ParentSpanId === '' ? null : row.ParentSpanId,
    duration_ms: Number(row.DurationMs),
    status: row.StatusCode === 'Error' ? 'error' : 'ok',
    ...(row.HasCost
      ? {
          cost: {
            input_tokens: Number(row.InputTokens),
            output_tokens: Number(row.OutputTokens),
            cache_read_tokens: Number(row.CacheReadTokens),
            reasoning_tokens: Number(row.ReasoningTokens),
            model: row.CostModel,
            estimated_usd: row.EstimatedUsd,
          },
        }
      : {}),
    ...(row.Input !== '' ? { input: row.Input } : {}),
    ...(row.Output !== '' ? { output: row.Output } : {}),
    metadata: row.SpanAttributes,
    tenant: row.TenantId,
    sandbox_id: row.SandboxId,
    experiment_id: row.ExperimentId === '' ? null : row.ExperimentId,
    scenario_id: row.ScenarioId === '' ? null : row.ScenarioId,
    run_id: row.RunId === '' ? null : row.RunId,
    agent: row.ServiceName === '' ? null : row.ServiceName,
    agent_snapshot_id: row.AgentSnapshotId === '' ? null : row.AgentSnapshotId,
  };
}

const SELECT_TRACE_EVENT = `
  toUnixTimestamp64Micro(Timestamp) AS ts_us, EventId, EventType, SpanName, Phase, TraceId, SpanId, ParentSpanId,
  intDiv(Duration, 1000000) AS DurationMs, StatusCode, Input, Output, HasCost, InputTokens, OutputTokens,
  CacheReadTokens, ReasoningTokens, CostModel, EstimatedUsd, SpanAttributes, SandboxId, ExperimentId, ServiceName, TenantId,
  AgentSnapshotId, ResourceAttributes['svc.scenario_id'] AS ScenarioId, ResourceAttributes['svc.run_id'] AS RunId`;

/**
 * One keyset page of trace_events rows in (Timestamp, `id`) order, after the key `after`
 * ([ts in µs, id]); `next` is the key of the page's last row when more follow.
 */
export async function traceEventsPage(
  store: Store,
  page: { tenant: string; where: string[]; params: Record<string, unknown>; after: string[] | null; pageSize: number; id: 'EventId' | 'SpanId' },
): Promise<{ rows: TraceRow[]; next: string[] | null }> {
  if (page.after && !/^\d+$/.test(page.after[0])) throw badRequest('cursor', 'is not a cursor returned by this endpoint');
  // No `LIMIT 1 BY` in the SQL: with it ClickHouse reads and sorts every matching row instead of
  // reading in key order and stopping after the page (measured over 10M events: 0.7-2 s for a
  // first page, vs 20-50 ms). A replayed duplicate that the ReplacingMergeTree has not merged yet
  // has the same (Timestamp, id), so it comes right after its twin and is dropped here; when
  // duplicates made the page short, the read goes on after the last key.
  const want = page.pageSize + 1;
  const rows: TraceRow[] = [];
  let after = page.after;
  for (;;) {
    const limit = want - rows.length;
    const conditions = ['TenantId = {tenant:String}', ...page.where];
    const params: Record<string, unknown> = { ...page.params, tenant: page.tenant, page: limit };
    if (after) {
      // The redundant lower bound lets the primary key and partition pruning serve the tuple comparison.
      conditions.push('Timestamp >= fromUnixTimestamp64Micro({after_ts:Int64})');
      conditions.push(`(Timestamp, ${page.id}) > (fromUnixTimestamp64Micro({after_ts:Int64}), {after_id:String})`);
      params.after_ts = Number(after[0]);
      params.after_id = after[1];
    }
    const batch = await store.query<TraceRow>(
      `SELECT ${SELECT_TRACE_EVENT} FROM trace_events WHERE ${conditions.join(' AND ')}
       ORDER BY Timestamp, ${page.id} LIMIT {page:UInt32}`,
      params,
    );
    for (const row of batch) {
      const previous = rows.at(-1);
      if (previous && previous.ts_us === row.ts_us && previous[page.id] === row[page.id]) continue;
      rows.push(row);
    }
    if (batch.length < limit || rows.length >= want) break;
    after = [batch[batch.length - 1].ts_us, batch[batch.length - 1][page.id]];
  }
  const last = rows.length > page.pageSize ? rows[page.pageSize - 1] : null;
  return { rows: rows.slice(0, page.pageSize), next: last ? [last.ts_us, last[page.id]] : null };
}

/** A page of GET /v1/traces: the tenant's events that match `filters` (traceFilters), after the key `after`. */
export async function traceEventItems(
  store: Store,
  tenant: string,
  filters: { where: string[]; params: Record<string, unknown> },
  after: string[] | null,
  pageSize: number,
) {
  const { rows, next } = await traceEventsPage(store, { tenant, where: filters.where, params: filters.params, after, pageSize, id: 'EventId' });
  return { items: rows.map(traceEventFromRow), next };
}

/** The filters GET /v1/traces accepts, besides limit, cursor and format. */
export const TRACE_FILTERS = ['experiment_id', 'sandbox_id', 'agent', 'event_type', 'tool', 'since'] as const;

/** The conditions of GET /v1/traces' filters (query parameters checked against TRACE_FILTERS); a bad value is a 400. */
export function traceFilters(q: Readonly<Record<string, string | undefined>>): { where: string[]; params: Record<string, unknown> } {
  const where: string[] = [];
  const params: Record<string, unknown> = {};
  const equals = (param: string, column: string) => {
    const value = q[param];
    if (value === undefined) return;
    if (value === '') throw badRequest(param, 'must not be empty');
    where.push(`${column} = {${param}:String}`);
    params[param] = value;
  };
  equals('experiment_id', 'ExperimentId');
  equals('sandbox_id', 'SandboxId');
  equals('agent', 'ServiceName');
  equals('tool', 'SpanName');
  if (q.event_type !== undefined && !(EVENT_TYPES as readonly string[]).includes(q.event_type)) {
    throw badRequest('event_type', `must be one of ${EVENT_TYPES.join(', ')}`);
  }
  equals('event_type', 'EventType');
  if (q.since !== undefined) {
    const since = parseTimestampUs(q.since);
    if (since === null) throw badRequest('since', 'must be an ISO 8601 timestamp with a zone');
    where.push('Timestamp >= fromUnixTimestamp64Micro({since:Int64})');
    params.since = since;
  }
  return { where, params };
}
