-- Experiments (svc.experiments) as versioned rows: the latest row per experiment is its state
-- (ReplacingMergeTree by UpdatedAt, the event's ts: every writer makes it strictly increase per
-- experiment). Lists and eval history read here, with FINAL; live reads come from the api's view.
-- CreatedAt never changes, so it may sit in the key: a tenant's experiments in creation order are
-- one range (the list, newest first, and the history of a spec, oldest first). The sealed request
-- secrets are not materialised.
CREATE TABLE IF NOT EXISTS experiments
(
    TenantId LowCardinality(String),
    ExperimentId String,
    Name String,
    SpecId String,
    SpecVersion UInt32,
    Status LowCardinality(String),
    CreatedAt DateTime64(3, 'UTC'),
    QueuedAt Nullable(DateTime64(3, 'UTC')),
    StartedAt Nullable(DateTime64(3, 'UTC')),
    CompletedAt Nullable(DateTime64(3, 'UTC')),
    TotalRuns UInt32,
    ScoredRuns UInt32,
    Concurrency UInt32,
    Options String,
    Yaml String CODEC(ZSTD(3)),
    Agent String,
    Error String,
    Metrics String,
    UpdatedAt DateTime64(3, 'UTC'),
    LogPartition UInt32,
    LogOffset UInt64,

    INDEX idx_spec_id SpecId TYPE bloom_filter(0.01) GRANULARITY 1
)
ENGINE = ReplacingMergeTree(UpdatedAt)
ORDER BY (TenantId, CreatedAt, ExperimentId);

-- The scorer's verdict of every run (svc.run-scores). A run scored again (a later attempt, or
-- offline re-scoring) replaces its row: ReplacingMergeTree by ScoredAt, one row per run in the key,
-- read with FINAL. Not partitioned, so a re-score months later still replaces the first row.
-- Invariants and Violations are the JSON of RunScore; Outcome the runner's RunOutcome, kept so
-- a run can be re-graded without running it again.
CREATE TABLE IF NOT EXISTS run_scores
(
    TenantId LowCardinality(String),
    ExperimentId String,
    ScenarioId String,
    ScenarioIndex UInt32,
    RunId String,
    Replica UInt32,
    Attempt UInt32,
    Params String,
    Seed Int64,
    Verdict LowCardinality(String),
    Composite Nullable(Float64),
    Invariants String,
    Violations String,
    Error Nullable(String),
    WallMs UInt64,
    Outcome String CODEC(ZSTD(3)),
    SandboxId Nullable(String),
    AgentSnapshotId Nullable(String),
    ScoredAt DateTime64(3, 'UTC'),
    LogPartition UInt32,
    LogOffset UInt64
)
ENGINE = ReplacingMergeTree(ScoredAt)
ORDER BY (TenantId, ExperimentId, RunId);
