-- Spans for analysts and Grafana: `otel_traces`, one row per span, with the column names and
-- types of the OpenTelemetry ClickHouse exporter's table of that name (so Grafana's ClickHouse
-- plugin and queries written for the exporter work unchanged), over trace_events. Our own columns
-- follow StatusMessage and the Events/Links columns. docs/analysts.md documents both views.
--
-- A span is one SpanId of a trace (docs/traces.md, "Spans"): its `start` and `end` events
-- combined, or its single `complete` or `invoked` event. A `start` without an `end` is in
-- progress (InProgress = 1, Duration 0, StatusCode 'Unset'); an `end` without a start is not a
-- row. Timestamp is the span's start: the start event's ts, or the single event's ts (its end is
-- Timestamp + Duration). Duration is in nanoseconds: the end event's for a pair, else the event's.
--
-- Grouped by (TenantId, TraceId, SpanId), TraceId being the stored one: a filter on TraceId (what
-- Grafana's trace view sends) or TenantId is pushed below the GROUP BY and served by the sort key
-- and the TraceId bloom-filter index, so a trace lookup does not aggregate the whole table. The
-- API's query-time joining of traces split across ingest requests (docs/traces.md, "Trace ids")
-- is not applied here: a span is under the trace id it was stored with, and an `end` event stored
-- under another trace id than its start (a JSON-API child span whose end came in a later request
-- without its parent chain) leaves the span in progress here. OTLP spans and events with an
-- explicit trace_id are always whole.
--
-- Duplicates of a replayed event (ReplacingMergeTree not yet merged) do not matter: every
-- aggregate below gives the same value for two copies of one event.
--
-- Events and Links: span events and links are not stored (docs/traces.md), so they are empty.
-- Views only: nothing is stored twice, nothing to keep in sync, and the views read the same rows
-- the API reads.
CREATE VIEW IF NOT EXISTS otel_traces AS
SELECT
    s.1 AS Timestamp,
    TraceId,
    SpanId,
    s.2 AS ParentSpanId,
    '' AS TraceState,
    CAST(s.3, 'LowCardinality(String)') AS SpanName,
    CAST(s.4, 'LowCardinality(String)') AS SpanKind,
    CAST(s.5, 'LowCardinality(String)') AS ServiceName,
    CAST(s.6, 'Map(LowCardinality(String), String)') AS ResourceAttributes,
    '' AS ScopeName,
    '' AS ScopeVersion,
    CAST(mapUpdate(s.7, e.5), 'Map(LowCardinality(String), String)') AS SpanAttributes,
    toUInt64(if(s.9 = 'start', e.2, s.8)) AS Duration,
    CAST(if(s.9 = 'start', if(ends = 0, 'Unset', e.3), s.10), 'LowCardinality(String)') AS StatusCode,
    '' AS StatusMessage,
    CAST([], 'Array(DateTime64(9))') AS `Events.Timestamp`,
    CAST([], 'Array(LowCardinality(String))') AS `Events.Name`,
    CAST([], 'Array(Map(LowCardinality(String), String))') AS `Events.Attributes`,
    CAST([], 'Array(String)') AS `Links.TraceId`,
    CAST([], 'Array(String)') AS `Links.SpanId`,
    CAST([], 'Array(String)') AS `Links.TraceState`,
    CAST([], 'Array(Map(LowCardinality(String), String))') AS `Links.Attributes`,
    TenantId,
    CAST(s.11, 'LowCardinality(String)') AS EventType,
    CAST(s.9, 'LowCardinality(String)') AS Phase,
    toUInt8(s.9 = 'start' AND ends = 0) AS InProgress,
    s.12 AS SandboxId,
    s.13 AS ExperimentId,
    s.14 AS AgentSnapshotId,
    s.15 AS Input,
    if(e.4 != '', e.4, s.16) AS Output,
    if(e.6 = 1, e.7, s.17) AS CostModel,
    if(e.6 = 1, e.8, s.18) AS InputTokens,
    if(e.6 = 1, e.9, s.19) AS OutputTokens,
    if(e.6 = 1, e.10, s.20) AS EstimatedUsd
FROM
(
    SELECT
        TenantId,
        TraceId,
        SpanId,
        -- The span's first event (start, complete or invoked) and its end event, if any.
        argMinIf((Timestamp, ParentSpanId, SpanName, SpanKind, ServiceName, ResourceAttributes, SpanAttributes, Duration, Phase, StatusCode,
                  EventType, SandboxId, ExperimentId, AgentSnapshotId, Input, Output, CostModel, InputTokens, OutputTokens, EstimatedUsd),
                 Timestamp, Phase != 'end') AS s,
        argMinIf((Timestamp, Duration, StatusCode, Output, SpanAttributes, HasCost, CostModel, InputTokens, OutputTokens, EstimatedUsd),
                 Timestamp, Phase = 'end') AS e,
        countIf(Phase = 'end') AS ends
    FROM trace_events
    GROUP BY TenantId, TraceId, SpanId
    HAVING countIf(Phase != 'end') > 0
);

-- The exporter's companion `otel_traces_trace_id_ts`: per trace, the second of its first span's
-- start and of its last span's end (DateTime, as the exporter's), which Grafana's trace view reads
-- to narrow its otel_traces lookup to the trace's time range. Grouped by (TenantId, TraceId) over
-- the stored trace id, like otel_traces, so a TraceId filter is pushed down.
CREATE VIEW IF NOT EXISTS otel_traces_trace_id_ts AS
SELECT TraceId, toDateTime(first, 'UTC') AS Start, toDateTime(last, 'UTC') AS End, TenantId
FROM
(
    SELECT TenantId, TraceId, min(Timestamp) AS first, max(if(Phase = 'end', Timestamp, Timestamp + toIntervalNanosecond(Duration))) AS last
    FROM trace_events
    GROUP BY TenantId, TraceId
);
