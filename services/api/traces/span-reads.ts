/**
 * Spans from trace events (docs/decisions.md): a span is one span_id, its `start` and `end` events
 * combined, or its single `complete` or `invoked` event. Pages are keyset-paginated on the
 * span's first event (Timestamp, SpanId), read in primary-key order: the `end` events of a page
 * are fetched in a second, narrow query, so a span whose end arrives later keeps its place.
 * Every query filters by tenant first. docs/traces.md ("Queries") describes the rules.
 */
import type { Store } from '../../kernel/store/store.ts';
import { badRequest } from '../../kernel/errors.ts';
import { EVENT_TYPES, formatTimestampUs } from './validate-events.ts';
import { traceEventFromRow, traceEventsPage, type TraceRow } from './trace-event-reads.ts';

/** Rounds of trace id resolution across ingest requests (each finds one more level of chains split between requests). */
const RESOLVE_ROUNDS = 4;
/** Most span ids looked at per round; a bigger trace is resolved on its first 10,000 spans. */
const RESOLVE_SPANS = 10_000;

/** The first and last event time of some traces, µs since the epoch. */
export interface TraceBounds {
  from: number;
  to: number;
}

/**
 * The stored trace ids that belong to trace `id`, and their events' time bounds (null when none
 * is stored). Ingest resolves a trace id within one request; when a parent chain leaves the
 * request, the event's trace id is the last parent named, a span of the real trace: so a stored
 * trace id equal to a span id of the trace joins it. The bounds let the reads that follow take
 * the primary key's time range instead of every granule of the tenant (over 10M events a trace
 * page read 18 ms unbounded, 10 ms bounded).
 */
export async function resolveTrace(store: Store, tenant: string, id: string): Promise<{ members: string[]; bounds: TraceBounds | null }> {
  const members = new Set([id]);
  let bounds = null as TraceBounds | null;
  let frontier = [id];
  for (let round = 0; round < RESOLVE_ROUNDS && frontier.length > 0; round++) {
    const [found] = await store.query<{ spans: string[]; from: string; to: string; n: string }>(
      `SELECT groupUniqArray(${RESOLVE_SPANS})(SpanId) AS spans, toUnixTimestamp64Micro(min(Timestamp)) AS from, toUnixTimestamp64Micro(max(Timestamp)) AS to, count() AS n
       FROM trace_events WHERE TenantId = {tenant:String} AND TraceId IN {traces:Array(String)}`,
      { tenant, traces: frontier },
    );
    if (!found || found.n === '0') break;
    const [from, to] = [Number(found.from), Number(found.to)];
    bounds = bounds === null ? { from, to } : { from: Math.min(bounds.from, from), to: Math.max(bounds.to, to) };
    const candidates = found.spans.filter((s) => !members.has(s));
    if (candidates.length === 0) break;
    const joined = await store.query<{ TraceId: string }>(
      `SELECT DISTINCT TraceId FROM trace_events WHERE TenantId = {tenant:String} AND TraceId IN {candidates:Array(String)}`,
      { tenant, candidates },
    );
    frontier = joined.map((f) => f.TraceId).filter((t) => !members.has(t));
    for (const t of frontier) members.add(t);
  }
  return { members: [...members], bounds };
}

/** The trace rooted at span `root`: the trace ids of that parentless span (no SpanId index: scans the tenant's SpanId column). */
async function tracesOfRoot(store: Store, tenant: string, root: string): Promise<{ canonical: string; members: string[]; bounds: TraceBounds | null } | null> {
  const rows = await store.query<{ TraceId: string }>(
    `SELECT TraceId FROM trace_events WHERE TenantId = {tenant:String} AND SpanId = {root:String} AND ParentSpanId = '' LIMIT 1`,
    { tenant, root },
  );
  if (rows.length === 0) return null;
  return { canonical: rows[0].TraceId, ...(await resolveTrace(store, tenant, rows[0].TraceId)) };
}

export interface SpanQuery {
  /** Stored trace id -> the trace id items report (resolution joins split traces); null: no trace restriction. */
  traces: Map<string, string> | null;
  /** The time bounds of those traces' events (null: no trace restriction, or nothing stored). */
  bounds: TraceBounds | null;
  where: string[];
  params: Record<string, unknown>;
}

/** The span query of the traces `traces` (stored id -> reported id), read within their time `bounds`. */
export function traceSpanQuery(traces: Map<string, string>, bounds: TraceBounds | null, where: string[] = [], params: Record<string, unknown> = {}): SpanQuery {
  const within = bounds ? ['Timestamp >= fromUnixTimestamp64Micro({trace_from:Int64})', 'Timestamp <= fromUnixTimestamp64Micro({trace_to:Int64})'] : [];
  return {
    traces,
    bounds,
    where: [...where, 'TraceId IN {traces:Array(String)}', ...within],
    params: { ...params, traces: [...traces.keys()], ...(bounds ? { trace_from: bounds.from, trace_to: bounds.to } : {}) },
  };
}

export const SPAN_FILTERS = ['trace_id', 'span_id', 'parent_span_id', 'root_span_id', 'root_span', 'tool', 'event_type'] as const;

/** The values of GET /v1/spans' filters (query parameters checked against SPAN_FILTERS): an empty value or an unknown event type is a 400. */
export function spanFilters(q: Readonly<Record<string, string | undefined>>): Partial<Record<(typeof SPAN_FILTERS)[number], string>> {
  const filters: Partial<Record<(typeof SPAN_FILTERS)[number], string>> = {};
  for (const name of SPAN_FILTERS) {
    if (q[name] === undefined) continue;
    if (q[name] === '') throw badRequest(name, 'must not be empty');
    filters[name] = q[name];
  }
  if (filters.event_type !== undefined && !(EVENT_TYPES as readonly string[]).includes(filters.event_type)) {
    throw badRequest('event_type', `must be one of ${EVENT_TYPES.join(', ')}`);
  }
  return filters;
}

/** Builds the span query from validated filter values (spanFilters). */
export async function spanQuery(store: Store, tenant: string, q: Partial<Record<(typeof SPAN_FILTERS)[number], string>>): Promise<SpanQuery> {
  const where: string[] = [];
  const params: Record<string, unknown> = {};
  const equals = (value: string | undefined, name: string, column: string) => {
    if (value === undefined) return;
    where.push(`${column} = {${name}:String}`);
    params[name] = value;
  };
  equals(q.span_id, 'span_id', 'SpanId');
  equals(q.parent_span_id, 'parent_span_id', 'ParentSpanId');
  equals(q.tool, 'tool', 'SpanName');
  equals(q.event_type, 'event_type', 'EventType');
  if (q.root_span_id !== undefined && q.root_span !== undefined && q.root_span_id !== q.root_span) {
    throw badRequest('root_span', 'is another name of root_span_id; give one, or the same value');
  }
  const root = q.root_span_id ?? q.root_span;
  let traces: Map<string, string> | null = null;
  let bounds: TraceBounds | null = null;
  if (q.trace_id !== undefined) {
    const resolved = await resolveTrace(store, tenant, q.trace_id);
    traces = new Map(resolved.members.map((t) => [t, q.trace_id!]));
    bounds = resolved.bounds;
  }
  if (root !== undefined) {
    const rooted = await tracesOfRoot(store, tenant, root);
    const byRoot = new Map((rooted?.members ?? []).map((t) => [t, rooted!.canonical]));
    // Either set's bounds cover the traces both have.
    bounds = traces === null ? (rooted?.bounds ?? null) : bounds;
    traces = traces === null ? byRoot : new Map([...traces].filter(([t]) => byRoot.has(t)));
  }
  return traces === null ? { traces, bounds: null, where, params } : traceSpanQuery(traces, bounds, where, params);
}

/** The columns of an end event that complete its span. */
type EndRow = Pick<
  TraceRow,
  | 'SpanId'
  | 'ts_us'
  | 'DurationMs'
  | 'StatusCode'
  | 'Output'
  | 'HasCost'
  | 'InputTokens'
  | 'OutputTokens'
  | 'CacheReadTokens'
  | 'ReasoningTokens'
  | 'CostModel'
  | 'EstimatedUsd'
  | 'SpanAttributes'
>;

export type SpanItem = ReturnType<typeof spanItem>;

function spanItem(start: TraceRow, end: EndRow | undefined, traceId: string, rootSpanId: string) {
  const e = traceEventFromRow(start);
  const single = start.Phase !== 'start';
  const endEvent = end ? traceEventFromRow({ ...start, ...end, Input: '', Phase: 'end' }) : null;
  const startUs = Number(start.ts_us);
  const durationMs = single ? e.duration_ms : endEvent ? endEvent.duration_ms : null;
  const output = endEvent?.output ?? e.output;
  const cost = endEvent?.cost ?? e.cost;
  return {
    span_id: e.span_id,
    trace_id: traceId,
    parent_span_id: e.parent_span_id,
    root_span_id: rootSpanId,
    event_type: e.event_type,
    tool: e.tool,
    // The single event's phase (`complete`, `invoked`), or `start` for a start/end pair.
    phase: e.phase,
    status: single ? e.status : endEvent ? endEvent.status : 'in_progress',
    start: e.ts,
    // A complete or invoked event's ts is its start; its end is start + duration.
    end: single ? formatTimestampUs(startUs + e.duration_ms * 1000) : endEvent ? endEvent.ts : null,
    duration_ms: durationMs,
    ...(e.input !== undefined ? { input: e.input } : {}),
    ...(output !== undefined ? { output } : {}),
    ...(cost !== undefined ? { cost } : {}),
    metadata: { ...e.metadata, ...(endEvent?.metadata ?? {}) },
    sandbox_id: e.sandbox_id,
    experiment_id: e.experiment_id,
    scenario_id: e.scenario_id,
    run_id: e.run_id,
    agent: e.agent,
    agent_snapshot_id: e.agent_snapshot_id,
  };
}

/**
 * One page of spans after `after` ([ts_us, span_id] of the last span of the previous page),
 * oldest first. Returns up to `pageSize` items and the key of the last one when more follow.
 */
export async function spansPage(
  store: Store,
  tenant: string,
  query: SpanQuery,
  after: string[] | null,
  pageSize: number,
): Promise<{ items: SpanItem[]; next: string[] | null }> {
  // A span is listed by its first event; its end is joined below.
  const { rows: page, next } = await traceEventsPage(store, {
    tenant,
    where: ["Phase != 'end'", ...query.where],
    params: query.params,
    after,
    pageSize,
    id: 'SpanId',
  });
  if (page.length === 0) return { items: [], next: null };
  const traceOf = (r: TraceRow) => query.traces?.get(r.TraceId) ?? r.TraceId;
  const started = page.filter((r) => r.Phase === 'start');
  const [ends, roots] = await Promise.all([
    started.length === 0
      ? Promise.resolve([] as EndRow[])
      : store.query<EndRow>(
          // An end event's stored trace id is its start's, its parent's (chain left its request) or,
          // for a root, its own span id: all bloom-filter lookups, after the page's first start.
          `SELECT SpanId, toUnixTimestamp64Micro(Timestamp) AS ts_us, intDiv(Duration, 1000000) AS DurationMs, StatusCode, Output,
                  HasCost, InputTokens, OutputTokens, CacheReadTokens, ReasoningTokens, CostModel, EstimatedUsd, SpanAttributes
           FROM trace_events
           WHERE TenantId = {tenant:String} AND Timestamp >= fromUnixTimestamp64Micro({from:Int64}) AND Phase = 'end'
             ${query.bounds ? 'AND Timestamp <= fromUnixTimestamp64Micro({to:Int64})' : ''}
             AND SpanId IN {spans:Array(String)} AND TraceId IN {traces:Array(String)}
           ORDER BY Timestamp LIMIT 1 BY SpanId`,
          {
            tenant,
            from: Number(started[0].ts_us),
            ...(query.bounds ? { to: query.bounds.to } : {}),
            spans: started.map((r) => r.SpanId),
            traces: [...new Set(started.flatMap((r) => [r.TraceId, r.SpanId, r.ParentSpanId, ...(query.traces?.keys() ?? [])]))],
          },
        ),
    // A trace's root is its first parentless span; a trace without one (its root not stored) is rooted at its id.
    store.query<{ TraceId: string; root: string }>(
      `SELECT TraceId, argMin(SpanId, Timestamp) AS root FROM trace_events
       WHERE TenantId = {tenant:String} AND TraceId IN {traces:Array(String)} AND ParentSpanId = ''
         ${query.bounds ? 'AND Timestamp >= fromUnixTimestamp64Micro({from:Int64}) AND Timestamp <= fromUnixTimestamp64Micro({to:Int64})' : ''}
       GROUP BY TraceId`,
      { tenant, traces: [...new Set([...page.map((r) => r.TraceId), ...(query.traces?.keys() ?? [])])], ...(query.bounds ?? {}) },
    ),
  ]);
  const endOf = new Map(ends.map((e) => [e.SpanId, e]));
  // Keyed by the reported trace id; a trace's own parentless span wins over one of a joined trace.
  const rootOf = new Map<string, string>();
  for (const r of roots) {
    const trace = query.traces?.get(r.TraceId) ?? r.TraceId;
    if (!rootOf.has(trace) || trace === r.TraceId) rootOf.set(trace, r.root);
  }
  const items = page.map((r) => spanItem(r, endOf.get(r.SpanId), traceOf(r), rootOf.get(traceOf(r)) ?? traceOf(r)));
  return { items, next };
}

/** Events tagged with an agent: its name, or one of its snapshots. */
function agentEventsWhere(agent: string, snapshotIds: string[], byVersion: boolean): { where: string; params: Record<string, unknown> } {
  return byVersion
    ? { where: 'AgentSnapshotId IN {snapshots:Array(String)}', params: { snapshots: snapshotIds } }
    : { where: '(ServiceName = {agent:String} OR AgentSnapshotId IN {snapshots:Array(String)})', params: { agent, snapshots: snapshotIds } };
}

/**
 * GET /v1/agents/:name/traces: a page of the events tagged with an agent (its name, or one of
 * `snapshotIds`; only those when `byVersion`), and the metrics over all of them.
 */
export async function agentTrace(
  store: Store,
  tenant: string,
  agent: { name: string; snapshotIds: string[]; byVersion: boolean },
  after: string[] | null,
  pageSize: number,
) {
  const { where, params } = agentEventsWhere(agent.name, agent.snapshotIds, agent.byVersion);
  const [{ rows, next }, metrics] = await Promise.all([
    traceEventsPage(store, { tenant, where: [where], params, after, pageSize, id: 'EventId' }),
    agentMetrics(store, tenant, where, params),
  ]);
  return { items: rows.map(traceEventFromRow), next, metrics };
}

/** Metrics over an agent's tool events (tool_use, tool_call; a start/end span counts once, by its end). */
async function agentMetrics(store: Store, tenant: string, where: string, params: Record<string, unknown>) {
  const groups = await store.query<{ tool: string; is_total: number; n: string; errors: string; p50_ms: number; p95_ms: number }>(
    `SELECT SpanName AS tool, toUInt8(grouping(SpanName)) AS is_total, count() AS n, countIf(StatusCode = 'Error') AS errors,
            quantile(0.5)(Duration) / 1e6 AS p50_ms, quantile(0.95)(Duration) / 1e6 AS p95_ms
     FROM (SELECT SpanName, StatusCode, Duration FROM trace_events
           WHERE TenantId = {tenant:String} AND ${where} AND EventType IN ('tool_use', 'tool_call') AND Phase != 'start' LIMIT 1 BY EventId)
     GROUP BY GROUPING SETS ((SpanName), ()) ORDER BY is_total, tool`,
    { ...params, tenant },
  );
  const breakdown: Record<string, { count: number; success_rate: number; p50_ms: number; p95_ms: number }> = {};
  for (const t of groups.filter((g) => !g.is_total)) {
    const n = Number(t.n);
    breakdown[t.tool] = { count: n, success_rate: (n - Number(t.errors)) / n, p50_ms: t.p50_ms, p95_ms: t.p95_ms };
  }
  const totals = groups.find((g) => g.is_total);
  const total = Number(totals?.n ?? 0);
  return {
    total_tool_calls: total,
    tool_success_rate: total === 0 ? 1 : (total - Number(totals!.errors)) / total,
    p50_duration_ms: total === 0 ? 0 : totals!.p50_ms,
    p95_duration_ms: total === 0 ? 0 : totals!.p95_ms,
    tool_breakdown: breakdown,
  };
}
