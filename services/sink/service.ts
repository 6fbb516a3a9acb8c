/**
 * The sink materialises topics into ClickHouse tables. One consumer group ("sink") per topic;
 * each topic's rows go through a TableWriter (batched inserts, replay-safe). Its watermarks are
 * registered with the kernel so a write can await visibility (read-your-writes).
 */
import { subscribe, type Delivered, type Kernel, type Service } from '../kernel/actor.ts';
import type { Consumer, LogRecord } from '../kernel/log/event-log.ts';
import { TOPICS } from '../kernel/topics.ts';
import { Watermark } from '../kernel/watermark.ts';
import { TableWriter } from './table-writer.ts';
import { deadLetterRow, traceEventRows } from './rows.ts';

interface Projection {
  topic: string;
  table: string;
  toRows(value: unknown, record: LogRecord): Array<Record<string, unknown>>;
}

const PROJECTIONS: Projection[] = [
  { topic: TOPICS.traces, table: 'trace_events', toRows: traceEventRows as Projection['toRows'] },
  { topic: TOPICS.deadLetters, table: 'dead_letters', toRows: (v, r) => [deadLetterRow(v as Parameters<typeof deadLetterRow>[0], r)] },
];

export class SinkService implements Service {
  readonly name = 'sink';
  private readonly consumers: Consumer[] = [];
  private readonly writers: TableWriter[] = [];

  async start(kernel: Kernel): Promise<void> {
    for (const projection of PROJECTIONS) {
      const writer = new TableWriter(kernel, projection.table);
      await writer.start();
      const watermark = new Watermark(`the sink of ${projection.topic}`);
      kernel.visibility.register(projection.topic, watermark);
      this.writers.push(writer);
      this.consumers.push(
        await subscribe(kernel, {
          groupId: `sink.${projection.table}`,
          topics: [projection.topic],
          maxBatchSize: 1000,
          watermark,
          handle: async (events: Array<Delivered<unknown>>) => {
            const rows = events
              .filter((e) => e.value !== null && !writer.alreadyStored(e.record.partition, e.record.offset))
              .flatMap((e) => projection.toRows(e.value, e.record));
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
