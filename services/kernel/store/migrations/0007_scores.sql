-- Score records of offline scoring (svc.scores, docs/scoring.md): one rule's grade of one stored
-- run. Scoring an experiment again with a rule replaces that rule's records (ReplacingMergeTree by
-- ScoredAt, one row per rule and run in the key, read with FINAL), so a retry after a judge outage
-- leaves the latest grades. Not partitioned, so a re-score months later still replaces the row.
-- Graded = 0 is a record without a grade (score and passed null in the API): no Nullable column,
-- because compact inserts leave out a column that is 0 in every row of a batch, and the default
-- of a Nullable column is NULL, not 0.
CREATE TABLE IF NOT EXISTS scores
(
    TenantId LowCardinality(String),
    ExperimentId String,
    RuleId String,
    RunId String,
    ScenarioId String,
    ScenarioIndex UInt32,
    Replica UInt32,
    RuleName String,
    RuleType LowCardinality(String),
    RequestId String,
    Graded UInt8,
    Score Float64,
    Passed UInt8,
    JudgeFailure UInt8,
    Reason String,
    Details String,
    Error String,
    ScoredAt DateTime64(3, 'UTC'),
    LogPartition UInt32,
    LogOffset UInt64
)
ENGINE = ReplacingMergeTree(ScoredAt)
ORDER BY (TenantId, ExperimentId, RuleId, RunId);
