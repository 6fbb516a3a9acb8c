-- Datasets (svc.datasets) as versioned rows: the latest row per dataset is its state
-- (ReplacingMergeTree by UpdatedAt, the event's ts); a deleted dataset's row stays, flagged.
-- Versions is the JSON of its versions: [{version, records, added, created_at}].
CREATE TABLE IF NOT EXISTS datasets
(
    TenantId LowCardinality(String),
    DatasetId String,
    Name String,
    Description String,
    Version UInt32,
    Records UInt32,
    Versions String,
    CreatedAt DateTime64(3, 'UTC'),
    Deleted UInt8,
    UpdatedAt DateTime64(3, 'UTC'),
    LogPartition UInt32,
    LogOffset UInt64
)
ENGINE = ReplacingMergeTree(UpdatedAt)
ORDER BY (TenantId, DatasetId);

-- Dataset records (svc.dataset-records), one row per record in its dataset's order (Seq, from 1):
-- version N of a dataset is the range of rows with Version <= N, read with FINAL, Deleted = 0, in
-- Seq order (the keyset cursor of the records endpoint). A record is immutable; the one later row
-- a record may get is its deletion marker (Deleted 1, content emptied), which replaces it.
-- Input, Expected and Metadata are JSON text (Expected and Metadata NULL when absent).
CREATE TABLE IF NOT EXISTS dataset_records
(
    TenantId LowCardinality(String),
    DatasetId String,
    Seq UInt32,
    RecordId String,
    Version UInt32,
    Input String CODEC(ZSTD(3)),
    Expected Nullable(String) CODEC(ZSTD(3)),
    Metadata Nullable(String) CODEC(ZSTD(3)),
    Tags Array(String),
    CreatedAt DateTime64(3, 'UTC'),
    Deleted UInt8,
    UpdatedAt DateTime64(3, 'UTC'),
    LogPartition UInt32,
    LogOffset UInt64,

    INDEX idx_record_id RecordId TYPE bloom_filter(0.01) GRANULARITY 1
)
ENGINE = ReplacingMergeTree(UpdatedAt)
ORDER BY (TenantId, DatasetId, Seq);

-- The scenarios of experiments over a dataset (svc.experiment-scenarios): each one's Params (the
-- matrix entry with its record, JSON), written once when the experiment is created (a retried
-- creation writes the same rows again, which the engine keeps once).
CREATE TABLE IF NOT EXISTS experiment_scenarios
(
    TenantId LowCardinality(String),
    ExperimentId String,
    ScenarioIndex UInt32,
    ScenarioCount UInt32,
    Params String CODEC(ZSTD(3)),
    CreatedAt DateTime64(3, 'UTC'),
    LogPartition UInt32,
    LogOffset UInt64
)
ENGINE = ReplacingMergeTree(CreatedAt)
ORDER BY (TenantId, ExperimentId, ScenarioIndex);
