/**
 * The event log seam. Every state change in the service is a record appended here; two
 * backends implement it with the same semantics: `embedded` (an on-disk log in the data dir,
 * owned by one process) and `kafka` (Apache Kafka through kafkajs). Values are opaque bytes at
 * this level: Avro encoding in the Confluent wire format happens above, in kernel/schema.
 *
 * Semantics both backends keep (pinned by test/contract/event-log.contract.ts):
 * - a key always maps to the same partition (Java-compatible murmur2, as kafkajs' default
 *   partitioner), so records of one key are consumed in append order;
 * - members of one consumer group split the partitions of its topics; independent groups each
 *   see every record;
 * - delivery is at least once: a batch is committed only after its handler resolves, so a
 *   consumer that stops or dies before that leaves the batch to be delivered again;
 * - a compacted topic keeps at least the last value for each key.
 */

export type CleanupPolicy = 'delete' | 'compact';

/** One entry of the topic catalog (topics/catalog.yaml), the single source for both backends. */
export interface TopicSpec {
  name: string;
  partitions: number;
  /** What the record key is, for readers of the catalog (for example "tenant id"). */
  key: string;
  /** Name of the Avro schema in schemas/ that values of this topic use (null for raw bytes). */
  valueSchema: string | null;
  cleanupPolicy: CleanupPolicy;
  /** How long records are kept; null keeps them forever. */
  retentionMs: number | null;
  /** The ClickHouse table the sink materialises this topic into, if any. */
  table?: string | null;
  /** How old the sink lets this table's waiting rows get before it inserts them; null: SVC_SINK_FLUSH_INTERVAL. */
  flushIntervalMs?: number | null;
}

export interface ProduceRecord {
  /** Null keys are spread over the partitions. */
  key: string | null;
  /** Null is a tombstone: on a compacted topic it deletes the key. */
  value: Buffer | null;
  headers?: Record<string, string>;
  /** Milliseconds since the epoch; defaults to the append time. */
  timestamp?: number;
}

export interface LogRecord {
  topic: string;
  partition: number;
  offset: number;
  key: string | null;
  value: Buffer | null;
  headers: Record<string, string>;
  timestamp: number;
}

export interface RecordPosition {
  topic: string;
  partition: number;
  offset: number;
}

/** Records of one partition, in offset order. */
export interface Batch {
  topic: string;
  partition: number;
  records: LogRecord[];
}

export interface ConsumeOptions {
  groupId: string;
  topics: string[];
  /**
   * Where a group without a committed offset starts: the earliest record (default) or only
   * records appended after it joined.
   */
  fromBeginning?: boolean;
  /**
   * False: nothing is committed and every start reads from `fromBeginning`'s position. For
   * per-process views that rebuild their state from a compacted topic on each start.
   * @default true
   */
  commit?: boolean;
  /** Most records handed to one handler call. @default 1000 */
  maxBatchSize?: number;
  /**
   * Called with each batch; the group commits past the batch's last record when this
   * resolves. A rejection is not committed: the batch is delivered again.
   */
  handleBatch(batch: Batch): Promise<void>;
}

export interface Consumer {
  readonly groupId: string;
  /** Partitions currently assigned to this member. */
  assignment(): Array<{ topic: string; partition: number }>;
  /** Graceful stop: finish the batch in flight, commit it, leave the group. */
  stop(): Promise<void>;
}

export interface EventLog {
  readonly kind: 'embedded' | 'kafka';
  /** Connects and creates the catalog's topics that do not exist yet (idempotent). */
  start(catalog: TopicSpec[]): Promise<void>;
  /**
   * Appends records to one topic. Resolves once they are durable by the backend's policy
   * (embedded: written, and fsynced when the fsync policy says so; kafka: acks from all
   * in-sync replicas), with each record's position in input order.
   */
  append(topic: string, records: ProduceRecord[]): Promise<RecordPosition[]>;
  consume(options: ConsumeOptions): Promise<Consumer>;
  /** Replay: up to `max` records of one partition from `fromOffset` on. */
  read(topic: string, partition: number, fromOffset: number, max: number): Promise<LogRecord[]>;
  /** The next offset to be written, per partition (index = partition). */
  endOffsets(topic: string): Promise<number[]>;
  /** The group's committed offsets per partition (-1 where nothing is committed). */
  committedOffsets(groupId: string, topic: string): Promise<number[]>;
  /** Stops every consumer gracefully, then releases the backend. */
  close(): Promise<void>;
}

/** What a backend logs through (the service passes its pino logger). */
export interface BackendLogger {
  info(obj: object, msg?: string): void;
  warn(obj: object, msg?: string): void;
  error(obj: object, msg?: string): void;
}

/** For a backend used without a logger (tests, tools): warnings and errors to the console. */
export const consoleLogger: BackendLogger = {
  info() {},
  warn(obj, msg) {
    console.warn(msg ?? 'event log warning', obj);
  },
  error(obj, msg) {
    console.error(msg ?? 'event log error', obj);
  },
};
