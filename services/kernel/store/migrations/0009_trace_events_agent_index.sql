-- GET /v1/traces?agent=X and GET /v1/agents/:name/traces filter on ServiceName, which had no
-- skip index: over 10 million events before background merges, the agent filter's first page
-- read every granule of the tenant until the agent's first event (p95 159 ms against < 100 ms
-- for the others). A set index fits a LowCardinality column with few agents per granule (the
-- sort key keeps a granule to one tenant and a short time window); measured on chDB over the
-- bench's 10 million events: 1,230 -> 334 granules read, 72 -> 35 ms for that page.
-- Parts written before this migration have no index and are read as before until merged.
ALTER TABLE trace_events ADD INDEX IF NOT EXISTS idx_service_name ServiceName TYPE set(100) GRANULARITY 1;
