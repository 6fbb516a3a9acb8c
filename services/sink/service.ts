/**
 * The sink materialises topics into ClickHouse tables. One consumer group per topic, named for
 * its table (`sink.<table>`, kernel/topics.ts sinkGroupId); each topic's rows go through a TableWriter (batched inserts, replay-safe). Its watermarks are
 * registered with the kernel so a write can await visibility (read-your-writes).
 *
 * Trace events, the high-volume topic, make no JS object per event on a store that takes Native
 * blocks (chDB): the records' Avro bytes are laid out as the table's columns (trace-event-block.ts);
 * elsewhere (the Debian ClickHouse server) they take the row mapping like every other topic.
 */
import { subscribe, type Delivered, type Kernel, type Service } from '../kernel/actor.ts';
import type { AgentSnapshotChanged } from '../domain/events/agent-events.ts';
import type { AuditRecorded, SandboxChanged, SandboxEvent } from '../domain/events/sandbox-events.ts';
import type { DeadLettered } from '../kernel/dead-letters.ts';
import type { Consumer, LogRecord } from '../kernel/log/event-log.ts';
import { sinkGroupId, topicSpec, TOPICS } from '../kernel/topics.ts';
import { Watermark } from '../kernel/watermark.ts';
import { TableWriter, type BatchInsert } from './table-writer.ts';
import { TRACE_EVENT_BLOCK_COLUMN_NAMES, traceEventBlock, type TraceRecordBody } from './trace-event-block.ts';
import { readsNative } from '../kernel/store/store.ts';
import { alertFiringRow, alertRuleRow } from './alert-rows.ts';
import type { AlertChanged, AlertFired } from '../domain/events/alert-events.ts';
import {
  agentSnapshotRow,
  auditRow,
  datasetRecordRow,
  datasetRow,
  deadLetterRow,
  experimentRow,
  experimentScenarioRow,
  runScoreRow,
  sandboxEventRow,
  sandboxRow,
  scoreRow,
  traceEventRows,
} from './rows.ts';
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
  private readonly writers: Array<TableWriter<unknown>> = [];

  async start(kernel: Kernel): Promise<void> {
    for (const topic of Object.keys(PROJECTIONS)) {
      const watermark = new Watermark(`the sink of ${topic}`);
      kernel.visibility.register(topic, watermark);
      await this.sink(kernel, topic, { groupId: sinkGroupId(topicSpec(kernel.catalog, topic).table ?? topic), watermark });
    }
  }

  /** Starts materialising one topic as the consumer group `groupId` (a test replays a topic under another). */
  async sink(kernel: Kernel, topic: string, consume: { groupId: string; watermark?: Watermark }): Promise<void> {
    const { table, flushIntervalMs } = topicSpec(kernel.catalog, topic);
    if (!table) throw new Error(`topic ${topic} has no table in the catalog`);
    const options = { ...consume, topics: [topic], maxBatchSize: 1000 };
    const store = kernel.store;
    if (topic === TOPICS.traces && readsNative(store)) {
      const writer = await this.writer<TraceRecordBody>(kernel, table, flushIntervalMs, {
        limit: kernel.config.sinkBatchBytes,
        size: (record) => record.body.length,
        insert: async (records) => {
          const block = traceEventBlock(records);
          if (!block) return;
          try {
            await store.insertNative({ table, columns: TRACE_EVENT_BLOCK_COLUMN_NAMES, block: block.parts });
          } finally {
            block.release();
          }
        },
      });
      this.consumers.push(
        await subscribe<Buffer>(kernel, {
          ...options,
          raw: true,
          handle: async (events) => {
            const fresh = events.filter((e) => e.value !== null && !writer.alreadyStored(e.record.partition, e.record.offset));
            // Each value in this process's schema of the topic (a record of an older writer is re-encoded).
            const records = await Promise.all(
              fresh.map(async (e) => ({ partition: e.record.partition, offset: e.record.offset, body: await kernel.serde.currentBody(topic, e.value!) })),
            );
            await writer.write(
              records,
              fresh.map((e) => e.record),
            );
          },
        }),
      );
      return;
    }
    const toRows = PROJECTIONS[topic]!;
    const writer = await this.writer<Record<string, unknown>>(kernel, table, flushIntervalMs, {
      limit: kernel.config.sinkBatchRows,
      size: () => 1,
      insert: (rows) => store.insert(table, rows),
    });
    this.consumers.push(
      await subscribe(kernel, {
        ...options,
        handle: async (events: Array<Delivered<unknown>>) => {
          const fresh = events.filter((e) => e.value !== null && !writer.alreadyStored(e.record.partition, e.record.offset));
          await writer.write(
            fresh.flatMap((e) => toRows(e.value, e.record)),
            fresh.map((e) => e.record),
          );
        },
      }),
    );
  }

  private async writer<T>(kernel: Kernel, table: string, flushIntervalMs: number | null | undefined, batches: BatchInsert<T>): Promise<TableWriter<T>> {
    const writer = new TableWriter(kernel, table, batches, flushIntervalMs ?? null);
    await writer.start();
    this.writers.push(writer as TableWriter<unknown>);
    return writer;
  }

  async stop(): Promise<void> {
    await Promise.all(this.consumers.map((c) => c.stop()));
    await Promise.all(this.writers.map((w) => w.flush()));
  }
}
