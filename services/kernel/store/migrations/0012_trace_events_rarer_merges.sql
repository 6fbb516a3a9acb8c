-- Rarer, wider merges of trace_events: merge_selector_base 20 -> 60. The sink's inserts under
-- load hold 3,000-5,000 rows (a closed loop of clients waiting for visibility keeps only so
-- many events in flight), so the table gets many small parts, and merging them again and again
-- was the largest single CPU cost of ingest on two cores (8-12 µs per event of 30-45). Measured
-- with test/load/ingest-profile.ts (300,000 events, alternated): merges 5.1-5.2 µs per event
-- against 8.4-9.0, and 58-60k events/s against 46-54k, in three of four pairs. Over 3 million
-- events filled in 3,300-row blocks, 104 parts as filled against 89, every list query's p95
-- no slower (docs/operations.md, 2026-12-03).
ALTER TABLE trace_events MODIFY SETTING merge_selector_base = 60;
