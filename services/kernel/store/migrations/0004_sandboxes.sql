-- Sandboxes as versioned rows (ReplacingMergeTree by Version = the event time): the latest row
-- per sandbox is its state. Lists and history read here; live reads come from the runner's view.
CREATE TABLE IF NOT EXISTS sandboxes
(
    TenantId LowCardinality(String),
    SandboxId String,
    SpecId String,
    SpecVersion UInt32,
    State LowCardinality(String),
    Path String,
    CreatedAt DateTime64(3, 'UTC'),
    ExpiresAt DateTime64(3, 'UTC'),
    Metadata Map(String, String),
    RunnerId LowCardinality(String),
    Error String,
    Version DateTime64(3, 'UTC'),
    LogPartition UInt32,
    LogOffset UInt64
)
ENGINE = ReplacingMergeTree(Version)
ORDER BY (TenantId, SandboxId);

-- Every event of every sandbox's stream (status steps, commands, warnings, audit), immutable.
CREATE TABLE IF NOT EXISTS sandbox_events
(
    TenantId LowCardinality(String),
    SandboxId String,
    Seq UInt64,
    EventType LowCardinality(String),
    Data String,
    Timestamp DateTime64(3, 'UTC'),
    LogPartition UInt32,
    LogOffset UInt64
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(Timestamp)
ORDER BY (TenantId, SandboxId, Seq);

-- The audit records of every sandbox (the rows of its .svc/audit.jsonl), immutable.
CREATE TABLE IF NOT EXISTS audit_events
(
    TenantId LowCardinality(String),
    SandboxId String,
    Timestamp DateTime64(3, 'UTC'),
    Type LowCardinality(String),
    Details String,
    EventId String,
    LogPartition UInt32,
    LogOffset UInt64
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(Timestamp)
ORDER BY (TenantId, SandboxId, Timestamp, EventId);
