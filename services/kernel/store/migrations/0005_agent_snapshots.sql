-- Agent snapshot rows (svc.agents), latest state per snapshot id; deleted rows stay, flagged.
CREATE TABLE IF NOT EXISTS agent_snapshots
(
    TenantId LowCardinality(String),
    SnapshotId String,
    Name String,
    Version UInt32,
    Tag String,
    Digest String,
    SizeBytes UInt64,
    StoragePath String,
    Runtime String,
    Entrypoint Array(String),
    Auth String,
    CreatedAt DateTime64(3, 'UTC'),
    Deleted UInt8,
    UpdatedAt DateTime64(3, 'UTC'),
    LogPartition UInt32,
    LogOffset UInt64
)
ENGINE = ReplacingMergeTree(UpdatedAt)
ORDER BY (TenantId, Name, Version, SnapshotId);
