-- Records a consumer gave up on after its retries, kept for inspection and replay.
-- Value is the record's original bytes, base64-encoded (it may not be valid UTF-8 or JSON).
-- Append-only; ordered by time so "the latest failures" is a range read. No TTL here (a setting).
CREATE TABLE IF NOT EXISTS dead_letters
(
    TenantId LowCardinality(String),
    GroupId LowCardinality(String),
    Topic LowCardinality(String),
    Partition UInt32,
    Offset UInt64,
    Key String,
    Error String,
    Attempts UInt32,
    FailedAt DateTime64(3, 'UTC'),
    Value String CODEC(ZSTD(3)),
    -- Position on svc.dead-letters this row came from: the sink's replay high-water mark.
    LogPartition UInt32,
    LogOffset UInt64
)
ENGINE = MergeTree
PARTITION BY toYYYYMM(FailedAt)
ORDER BY (FailedAt, Topic, Partition, Offset);
