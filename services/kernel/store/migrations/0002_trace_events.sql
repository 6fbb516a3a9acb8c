-- One row per ingested trace event: an immutable fact, appended once by the sink.
--
-- Column names follow the OpenTelemetry ClickHouse exporter's `otel_traces` where they apply
-- (SpanName is the event's `tool`, ServiceName the agent name or '', SpanAttributes the event's
-- metadata with values stringified), so analysts and Grafana can query the table directly; the
-- columns after StatusMessage are ours.
--
-- Sort key (TenantId, Timestamp, EventId):
--   * every query filters by tenant first (DESIGN: tenancy), so it leads;
--   * the main read, "a tenant's events in time order, keyset-paginated on (Timestamp, EventId)",
--     is then a contiguous, already-ordered range: the pagination predicate is a key-range
--     condition and ORDER BY Timestamp, EventId reads in order (no sort, stops after LIMIT);
--   * EventId last makes the key unique per event, which is what ReplacingMergeTree needs to
--     collapse a replayed row (second line of defence: the sink first skips offsets at or below
--     max(LogOffset) per LogPartition, read from this table; no separate offsets table).
--   The duplicate of a replayed event always lands in the same partition, as the partition is a
--   function of Timestamp, which is in the key. Filters by sandbox, experiment, event type and tool
--   are served by the skip indexes below rather than by the key: putting any of them before
--   Timestamp would break the in-order read for the unfiltered list.
--   Queries that must not see a not-yet-merged duplicate use FINAL or `LIMIT 1 BY EventId`.
--   Write the keyset predicate as `Timestamp >= {ts:DateTime64(9)} AND (Timestamp, EventId) >
--   ({ts:DateTime64(9)}, {id:String})`: the tuple comparison alone is not used by the primary key
--   or partition pruning (checked with EXPLAIN indexes=1 on chDB 26.7), the redundant bound is.
--
-- Skip indexes: each one costs CPU on every insert and merge, the bottleneck of ingest here.
-- Kept: TraceId, SandboxId, ExperimentId, SpanName, EventType, the span attribute maps (what
-- the list filters and analysts use) and Duration. Left out: SpanId and the resource attribute
-- maps (together about a tenth of the insert CPU; span lookups go through the trace).
--
-- Compression: ClickHouse's default LZ4 rather than otel_traces' ZSTD(1): on this ingest path
-- the CPU of inserts and background merges is the bottleneck, not disk (measured: ZSTD merges
-- took about a third more CPU). Delta on the monotonic-ish time and offset columns.
--
-- No version column: facts never change, so which copy of a duplicate survives does not matter.
-- Retention: no TTL here on purpose; it is a setting, applied at start with
-- `ALTER TABLE trace_events MODIFY TTL toDateTime(Timestamp) + INTERVAL n DAY` (with
-- ttl_only_drop_parts = 1, whole daily partitions are dropped).
-- Caveat for writers: one INSERT may touch at most max_partitions_per_insert_block (100) days,
-- so the ingest path must clamp or reject timestamps far from now.
CREATE TABLE IF NOT EXISTS trace_events
(
    Timestamp DateTime64(9, 'UTC') CODEC(Delta, LZ4),
    TraceId String,
    SpanId String,
    ParentSpanId String,
    SpanName LowCardinality(String),
    SpanKind LowCardinality(String),
    ServiceName LowCardinality(String),
    ResourceAttributes Map(LowCardinality(String), String),
    SpanAttributes Map(LowCardinality(String), String),
    Duration UInt64,
    StatusCode LowCardinality(String),
    StatusMessage String,

    TenantId LowCardinality(String),
    EventId String,
    SandboxId Nullable(String),
    ExperimentId String,
    AgentSnapshotId String,
    EventType LowCardinality(String),
    Phase LowCardinality(String),
    Input String,
    Output String,
    CostModel LowCardinality(String),
    InputTokens UInt64,
    OutputTokens UInt64,
    CacheReadTokens UInt64,
    ReasoningTokens UInt64,
    EstimatedUsd Float64,
    HasCost UInt8,
    IngestedAt DateTime64(3, 'UTC') CODEC(Delta, LZ4),
    LogPartition UInt32,
    LogOffset UInt64 CODEC(Delta, LZ4),

    INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_sandbox_id SandboxId TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_experiment_id ExperimentId TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_event_type EventType TYPE set(100) GRANULARITY 1,
    INDEX idx_span_name SpanName TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_key mapKeys(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_span_attr_value mapValues(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_duration Duration TYPE minmax GRANULARITY 1
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(Timestamp)
ORDER BY (TenantId, Timestamp, EventId)
SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1,
    -- Wider, rarer merges: halves the CPU of background merges under a steady ingest
    -- (measured: 4.7 s -> 1.9 s of merge time per 250k events on 2 cores). Raised to 60 in 0012.
    merge_selector_base = 20,
    merge_selector_enable_heuristic_to_lower_max_parts_to_merge_at_once = 0;
