/**
 * Prefixes every topic and consumer group with a namespace, so several deployments (or test
 * runs) can share one Kafka cluster without seeing each other's records (SVC_LOG_NAMESPACE).
 * Services keep using the catalog's names; only the backend sees the prefixed ones.
 */
import type { Batch, ConsumeOptions, Consumer, EventLog, LogRecord, ProduceRecord, RecordPosition, TopicSpec } from './event-log.ts';

export class NamespacedLog implements EventLog {
  readonly kind: EventLog['kind'];

  constructor(
    private readonly inner: EventLog,
    private readonly namespace: string,
  ) {
    this.kind = inner.kind;
  }

  private out = (topic: string) => `${this.namespace}${topic}`;
  private in = (topic: string) => topic.slice(this.namespace.length);
  private position = (p: RecordPosition): RecordPosition => ({ ...p, topic: this.in(p.topic) });
  private record = (r: LogRecord): LogRecord => ({ ...r, topic: this.in(r.topic) });

  start(catalog: TopicSpec[]): Promise<void> {
    return this.inner.start(catalog.map((t) => ({ ...t, name: this.out(t.name) })));
  }

  async append(topic: string, records: ProduceRecord[]): Promise<RecordPosition[]> {
    return (await this.inner.append(this.out(topic), records)).map(this.position);
  }

  async consume(options: ConsumeOptions): Promise<Consumer> {
    const inner = await this.inner.consume({
      ...options,
      groupId: this.out(options.groupId),
      topics: options.topics.map(this.out),
      handleBatch: (batch: Batch) => options.handleBatch({ ...batch, topic: this.in(batch.topic), records: batch.records.map(this.record) }),
    });
    return {
      groupId: options.groupId,
      assignment: () => inner.assignment().map((a) => ({ ...a, topic: this.in(a.topic) })),
      stop: () => inner.stop(),
    };
  }

  async read(topic: string, partition: number, fromOffset: number, max: number): Promise<LogRecord[]> {
    return (await this.inner.read(this.out(topic), partition, fromOffset, max)).map(this.record);
  }

  endOffsets(topic: string): Promise<number[]> {
    return this.inner.endOffsets(this.out(topic));
  }

  committedOffsets(groupId: string, topic: string): Promise<number[]> {
    return this.inner.committedOffsets(this.out(groupId), this.out(topic));
  }

  close(): Promise<void> {
    return this.inner.close();
  }
}
