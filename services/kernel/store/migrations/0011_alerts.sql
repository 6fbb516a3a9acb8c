-- Alert rules (svc.alerts) and their firings (svc.alert-firings), docs/alerts.md. Both are
-- entities whose latest event is their state: ReplacingMergeTree by UpdatedAt (the event's ts,
-- strictly increasing per id), read with FINAL. A deleted rule keeps its row, Deleted = 1.
-- The api lists rules from its view of the topic; the table is for analysts (the SQL endpoint).
CREATE TABLE IF NOT EXISTS alert_rules
(
    TenantId LowCardinality(String),
    AlertId String,
    Name String,
    EvalId String,
    Condition String,
    AlertWindow String,
    Notify LowCardinality(String),
    SlackChannel String,
    WebhookOrigin String,
    EmailTo Array(String),
    CreatedAt DateTime64(3, 'UTC'),
    Deleted UInt8,
    UpdatedAt DateTime64(3, 'UTC'),
    LogPartition UInt32,
    LogOffset UInt64
)
ENGINE = ReplacingMergeTree(UpdatedAt)
ORDER BY (TenantId, AlertId);

-- A firing's FiredAt never changes, so it sits in the key: a tenant's firings newest first are
-- one range read backwards; a rule's or an experiment's are found through the bloom filters.
-- Target is what the API shows of the destination (a webhook URL's origin only).
CREATE TABLE IF NOT EXISTS alert_firings
(
    TenantId LowCardinality(String),
    FiringId String,
    RuleId String,
    RuleName String,
    RuleSource LowCardinality(String),
    EvalId String,
    ExperimentId String,
    ExperimentName String,
    SpecId String,
    Condition String,
    AlertWindow String,
    Metric LowCardinality(String),
    HasValue UInt8,
    MetricValue Float64,
    HasThreshold UInt8,
    Threshold Float64,
    Reason String,
    Details String,
    FiredAt DateTime64(3, 'UTC'),
    TriggeredBy LowCardinality(String),
    Status LowCardinality(String),
    DuplicateOf String,
    Notify LowCardinality(String),
    Target String,
    Notifications String,
    Interruptions UInt32,
    UpdatedAt DateTime64(3, 'UTC'),
    LogPartition UInt32,
    LogOffset UInt64,

    INDEX idx_rule_id RuleId TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_experiment_id ExperimentId TYPE bloom_filter(0.01) GRANULARITY 1
)
ENGINE = ReplacingMergeTree(UpdatedAt)
ORDER BY (TenantId, FiredAt, FiringId);
