/**
 * Event -> row mappings of the sink, one function per table. Column names follow the DDL in
 * kernel/store/migrations (otel_traces names for the span columns).
 */
import type { AgentSnapshotChanged } from '../domain/events/agent-events.ts';
import type { AuditRecorded, SandboxChanged, SandboxEvent } from '../domain/events/sandbox-events.ts';
import type { DeadLettered } from '../kernel/dead-letters.ts';
import type { TraceEventsIngested } from '../domain/events/trace-events.ts';
import type { LogRecord } from '../kernel/log/event-log.ts';
import type { ExperimentChanged } from '../domain/events/experiment-events.ts';
import type { RunScored } from '../domain/events/run-events.ts';
import type { ScoreRecorded } from '../domain/events/score-events.ts';
import type { DatasetChanged, DatasetRecordAdded } from '../domain/events/dataset-events.ts';
import type { ExperimentScenario } from '../domain/events/experiment-events.ts';

/** ClickHouse DateTime64 text for microseconds since the epoch, in UTC. */
function clickhouseTimeUs(us: number): string {
  const ms = Math.floor(us / 1000);
  const iso = new Date(ms).toISOString(); // 2026-01-31T12:00:00.123Z
  return `${iso.slice(0, 10)} ${iso.slice(11, 23)}${String(us - ms * 1000).padStart(3, '0')}`;
}

export function clickhouseTimeMs(ms: number): string {
  const iso = new Date(ms).toISOString();
  return `${iso.slice(0, 10)} ${iso.slice(11, 23)}`;
}

/**
 * The rows of one svc.traces record, on a store that takes no Native block (the ClickHouse
 * server). On chDB trace-event-block.ts makes the same rows from the record's bytes.
 */
export function traceEventRows(batch: TraceEventsIngested, record: LogRecord): Array<Record<string, unknown>> {
  const ingestedAt = clickhouseTimeMs(batch.ts);
  const resource: Record<string, string> = {};
  if (batch.agent_snapshot_id) resource['svc.agent_snapshot_id'] = batch.agent_snapshot_id;
  if (batch.agent_version !== null) resource['svc.agent_version'] = String(batch.agent_version);
  if (batch.scenario_id) resource['svc.scenario_id'] = batch.scenario_id;
  if (batch.run_id) resource['svc.run_id'] = batch.run_id;
  return batch.events.map((e) => ({
    Timestamp: clickhouseTimeUs(e.ts_us),
    TraceId: e.trace_id,
    SpanId: e.span_id,
    ParentSpanId: e.parent_span_id ?? '',
    SpanName: e.tool,
    SpanKind: e.event_type === 'llm_call' ? 'Client' : 'Internal',
    ServiceName: batch.agent ?? '',
    ResourceAttributes: resource,
    SpanAttributes: e.metadata,
    Duration: e.duration_ms * 1_000_000,
    StatusCode: e.status === 'error' ? 'Error' : 'Ok',
    StatusMessage: '',
    TenantId: batch.tenant,
    EventId: e.event_id,
    SandboxId: batch.sandbox_id,
    ExperimentId: batch.experiment_id ?? '',
    AgentSnapshotId: batch.agent_snapshot_id ?? '',
    EventType: e.event_type,
    Phase: e.phase,
    Input: e.input ?? '',
    Output: e.output ?? '',
    CostModel: e.cost?.model ?? '',
    InputTokens: e.cost?.input_tokens ?? 0,
    OutputTokens: e.cost?.output_tokens ?? 0,
    CacheReadTokens: e.cost?.cache_read_tokens ?? 0,
    ReasoningTokens: e.cost?.reasoning_tokens ?? 0,
    EstimatedUsd: e.cost?.estimated_usd ?? 0,
    HasCost: e.cost ? 1 : 0,
    IngestedAt: ingestedAt,
    LogPartition: record.partition,
    LogOffset: record.offset,
  }));
}

export function deadLetterRow(d: DeadLettered, record: LogRecord): Record<string, unknown> {
  return {
    TenantId: d.tenant,
    GroupId: d.group_id,
    Topic: d.topic,
    Partition: d.partition,
    Offset: d.offset,
    Key: d.key ?? '',
    Error: d.error,
    Attempts: d.attempts,
    FailedAt: clickhouseTimeMs(d.ts),
    Value: d.value ? d.value.toString('base64') : '',
    LogPartition: record.partition,
    LogOffset: record.offset,
  };
}

export function agentSnapshotRow(a: AgentSnapshotChanged, record: LogRecord): Record<string, unknown> {
  return {
    TenantId: a.tenant,
    SnapshotId: a.id,
    Name: a.name,
    Version: a.version,
    Tag: a.tag ?? '',
    Digest: a.digest,
    SizeBytes: a.size_bytes,
    StoragePath: a.storage_path,
    Runtime: a.runtime ?? '',
    Entrypoint: a.entrypoint,
    Auth: a.auth ?? '',
    CreatedAt: clickhouseTimeMs(a.created_at),
    Deleted: a.deleted ? 1 : 0,
    UpdatedAt: clickhouseTimeMs(a.ts),
    LogPartition: record.partition,
    LogOffset: record.offset,
  };
}

export function sandboxRow(s: SandboxChanged, record: LogRecord): Record<string, unknown> {
  return {
    TenantId: s.tenant,
    SandboxId: s.sandbox_id,
    SpecId: s.spec_id,
    SpecVersion: s.spec_version,
    State: s.state,
    Path: s.path,
    CreatedAt: clickhouseTimeMs(s.created_at),
    ExpiresAt: clickhouseTimeMs(s.expires_at),
    Metadata: s.metadata,
    RunnerId: s.runner_id,
    Error: s.error ?? '',
    Version: clickhouseTimeMs(s.ts),
    LogPartition: record.partition,
    LogOffset: record.offset,
  };
}

export function sandboxEventRow(e: SandboxEvent, record: LogRecord): Record<string, unknown> {
  return {
    TenantId: e.tenant,
    SandboxId: e.sandbox_id,
    Seq: e.seq,
    EventType: e.event_type,
    Data: e.data,
    Timestamp: clickhouseTimeMs(e.ts),
    LogPartition: record.partition,
    LogOffset: record.offset,
  };
}

export function auditRow(a: AuditRecorded, record: LogRecord): Record<string, unknown> {
  return {
    TenantId: a.tenant,
    SandboxId: a.sandbox_id,
    Timestamp: clickhouseTimeMs(a.record_ts),
    Type: a.type,
    Details: a.details,
    EventId: a.event_id,
    LogPartition: record.partition,
    LogOffset: record.offset,
  };
}

const nullableTimeMs = (ms: number | null) => (ms === null ? null : clickhouseTimeMs(ms));

export function experimentRow(e: ExperimentChanged, record: LogRecord): Record<string, unknown> {
  return {
    TenantId: e.tenant,
    ExperimentId: e.experiment_id,
    Name: e.name,
    SpecId: e.spec_id,
    SpecVersion: e.spec_version,
    Status: e.status,
    CreatedAt: clickhouseTimeMs(e.created_at),
    QueuedAt: nullableTimeMs(e.queued_at),
    StartedAt: nullableTimeMs(e.started_at),
    CompletedAt: nullableTimeMs(e.completed_at),
    TotalRuns: e.total_runs,
    ScoredRuns: e.scored_runs,
    Concurrency: e.concurrency,
    Options: e.options,
    Yaml: e.yaml ?? '',
    Agent: e.agent ?? '',
    Error: e.error ?? '',
    Metrics: e.metrics ?? '',
    UpdatedAt: clickhouseTimeMs(e.ts),
    LogPartition: record.partition,
    LogOffset: record.offset,
  };
}

export function runScoreRow(s: RunScored, record: LogRecord): Record<string, unknown> {
  return {
    TenantId: s.tenant,
    ExperimentId: s.experiment_id,
    ScenarioId: s.scenario_id,
    ScenarioIndex: s.scenario_index,
    RunId: s.run_id,
    Replica: s.replica,
    Attempt: s.attempt,
    Params: s.params,
    Seed: s.seed,
    Verdict: s.verdict,
    Composite: s.composite,
    Invariants: s.invariants,
    Violations: s.violations,
    Error: s.error,
    WallMs: s.wall_ms,
    Outcome: s.outcome,
    SandboxId: s.sandbox_id,
    AgentSnapshotId: s.agent_snapshot_id,
    ScoredAt: clickhouseTimeMs(s.ts),
    LogPartition: record.partition,
    LogOffset: record.offset,
  };
}

export function scoreRow(s: ScoreRecorded, record: LogRecord): Record<string, unknown> {
  return {
    TenantId: s.tenant,
    ExperimentId: s.experiment_id,
    RuleId: s.rule_id,
    RunId: s.run_id,
    ScenarioId: s.scenario_id,
    ScenarioIndex: s.scenario_index,
    Replica: s.replica,
    RuleName: s.rule_name,
    RuleType: s.rule_type,
    RequestId: s.request_id,
    Graded: s.score === null ? 0 : 1,
    Score: s.score ?? 0,
    Passed: s.passed ? 1 : 0,
    JudgeFailure: s.judge_failure ? 1 : 0,
    Reason: s.reason,
    Details: s.details,
    Error: s.error ?? '',
    ScoredAt: clickhouseTimeMs(s.ts),
    LogPartition: record.partition,
    LogOffset: record.offset,
  };
}

export function datasetRow(d: DatasetChanged, record: LogRecord): Record<string, unknown> {
  return {
    TenantId: d.tenant,
    DatasetId: d.dataset_id,
    Name: d.name,
    Description: d.description ?? '',
    Version: d.version,
    Records: d.versions.at(-1)?.records ?? 0,
    Versions: JSON.stringify(
      d.versions.map(({ version, records, added, created_at }) => ({ version, records, added, created_at: new Date(created_at).toISOString() })),
    ),
    CreatedAt: clickhouseTimeMs(d.created_at),
    Deleted: d.deleted ? 1 : 0,
    UpdatedAt: clickhouseTimeMs(d.ts),
    LogPartition: record.partition,
    LogOffset: record.offset,
  };
}

export function datasetRecordRow(r: DatasetRecordAdded, record: LogRecord): Record<string, unknown> {
  return {
    TenantId: r.tenant,
    DatasetId: r.dataset_id,
    Seq: r.seq,
    RecordId: r.record_id,
    Version: r.version,
    Input: r.input,
    Expected: r.expected,
    Metadata: r.metadata,
    Tags: r.tags,
    CreatedAt: clickhouseTimeMs(r.created_at),
    Deleted: r.deleted ? 1 : 0,
    UpdatedAt: clickhouseTimeMs(r.ts),
    LogPartition: record.partition,
    LogOffset: record.offset,
  };
}

export function experimentScenarioRow(s: ExperimentScenario, record: LogRecord): Record<string, unknown> {
  return {
    TenantId: s.tenant,
    ExperimentId: s.experiment_id,
    ScenarioIndex: s.scenario_index,
    ScenarioCount: s.scenario_count,
    Params: s.params,
    CreatedAt: clickhouseTimeMs(s.ts),
    LogPartition: record.partition,
    LogOffset: record.offset,
  };
}
