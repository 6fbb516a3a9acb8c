/**
 * The sink materialises topics into ClickHouse tables. One consumer group ("sink") per topic;
 * each topic's rows go through a TableWriter (batched inserts, replay-safe). Its watermarks are
 * registered with the kernel so a write can await visibility (read-your-writes).
 */
import { subscribe, type Delivered, type Kernel, type Service } from '../kernel/actor.ts';
import type { AgentSnapshotChanged } from '../domain/events/agent-events.ts';
import type { AuditRecorded, SandboxChanged, SandboxEvent } from '../domain/events/sandbox-events.ts';
import type { DeadLettered } from '../kernel/dead-letters.ts';
import type { Consumer, LogRecord } from '../kernel/log/event-log.ts';
import { sinkGroupId, topicSpec, TOPICS } from '../kernel/topics.ts';
import { Watermark } from '../kernel/watermark.ts';
import { TableWriter } from './table-writer.ts';
import { alertFiringRow, alertRuleRow } from './alert-rows.ts';
import type { AlertChanged, AlertFired } from '../domain/events/alert-events.ts';
import { agentSnapshotRow, auditRow, datasetRecordRow, datasetRow, deadLetterRow, experimentRow, experimentScenarioRow, runScoreRow, sandboxEventRow, sandboxRow, scoreRow, traceEventRows } from './rows.ts';
import type { DatasetChanged, DatasetRecordAdded } from '../domain/events/dataset-events.ts';
import type { ExperimentChanged, ExperimentScenario } from '../domain/events/experiment-events.ts';
import type { RunScored } from '../domain/events/run-events.ts';
import type { ScoreRecorded } from '../domain/events/score-events.ts';

type ToRows = (value: unknown, record: LogRecord) => Array<Record<string, unknown>>;

/** Row mappings per topic; the table of each comes from the topic catalog. */
export const PROJECTIONS: Record<string, ToRows> = {
  [TOPICS.traces]: traceEventRows as ToRows,
  [TOPICS.deadLetters]: (v, r) => [deadLetterRow(v as DeadLettered, r)],
  [TOPICS.sandboxes]: (v, r) => [sandboxRow(v as SandboxChanged, r)],
  [TOPICS.sandboxEvents]: (v, r) => [sandboxEventRow(v as SandboxEvent, r)],
  [TOPICS.audit]: (v, r) => [auditRow(v as AuditRecorded, r)],
  [TOPICS.agents]: (v, r) => [agentSnapshotRow(v as AgentSnapshotChanged, r)],
  [TOPICS.experiments]: (v, r) => [experimentRow(v as ExperimentChanged, r)],
  [TOPICS.runScores]: (v, r) => [runScoreRow(v as RunScored, r)],
  [TOPICS.scores]: (v, r) => [scoreRow(v as ScoreRecorded, r)],
  [TOPICS.alerts]: (v, r) => [alertRuleRow(v as AlertChanged, r)],
  [TOPICS.alertFirings]: (v, r) => [alertFiringRow(v as AlertFired, r)],
  [TOPICS.experimentScenarios]: (v, r) => [experimentScenarioRow(v as ExperimentScenario, r)],
  [TOPICS.datasets]: (v, r) => [datasetRow(v as DatasetChanged, r)],
  [TOPICS.datasetRecords]: (v, r) => [datasetRecordRow(v as DatasetRecordAdded, r)],
};

export class SinkService implements Service {
  readonly name = 'sink';
  private readonly consumers: Consumer[] = [];
  private readonly writers: TableWriter[] = [];

  async start(kernel: Kernel): Promise<void> {
    for (const [topic, toRows] of Object.entries(PROJECTIONS)) {
      const { table, flushIntervalMs } = topicSpec(kernel.catalog, topic);
      if (!table) throw new Error(`topic ${topic} has no table in the catalog`);
      const writer = new TableWriter(kernel, table, flushIntervalMs);
      await writer.start();
      const watermark = new Watermark(`the sink of ${topic}`);
      kernel.visibility.register(topic, watermark);
      this.writers.push(writer);
      this.consumers.push(
        await subscribe(kernel, {
          groupId: sinkGroupId(table),
          topics: [topic],
          maxBatchSize: 1000,
          watermark,
          handle: async (events: Array<Delivered<unknown>>) => {
            const rows = events
              .filter((e) => e.value !== null && !writer.alreadyStored(e.record.partition, e.record.offset))
              .flatMap((e) => toRows(e.value, e.record));
            await writer.write(rows);
          },
        }),
      );
    }
  }

  async stop(): Promise<void> {
    await Promise.all(this.consumers.map((c) => c.stop()));
    await Promise.all(this.writers.map((w) => w.flush()));
  }
}
