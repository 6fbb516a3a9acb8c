/**
 * The Kafka backend of the EventLog seam (kafkajs 2.2.4). kafkajs stays inside this folder.
 *
 * - append: an idempotent producer, acks from all in-sync replicas. The partition of each
 *   record is chosen here with kafkajs' DefaultPartitioner (Java-compatible murmur2 of the
 *   key, round robin for null keys), the same function the embedded backend uses, so that
 *   each record's offset is known: kafkajs answers with one base offset per partition.
 * - consume: a consumer group with manual commits. Each kafkajs batch is cut into chunks of
 *   at most `maxBatchSize`; a chunk is committed (offset after its last record) only once
 *   `handleBatch` resolves. A rejection seeks the partition back to the chunk's first record
 *   and retries after a backoff (doubling, 200 ms to 5 s).
 * - consume with `commit: false` (per-process views and reply followers, whose group ids are
 *   per process): nothing is committed, the member keeps its positions itself (and seeks back
 *   to them after a rebalance), and its group is deleted when it stops, so restarts leave no
 *   groups behind. One killed with -9 leaves an empty group without offsets, which Kafka
 *   deletes at its next offsets cleanup (offsets.retention.check.interval.ms, 10 min).
 * - read: a direct Fetch to the partition leader (see replay.ts): no group, no commits.
 */
import {
  type Admin,
  type Consumer as KafkaConsumer,
  type EachBatchPayload,
  Kafka,
  type LogEntry,
  logLevel,
  type Message,
  Partitioners,
  type Producer,
} from 'kafkajs';
import {
  type BackendLogger,
  type Batch,
  consoleLogger,
  type ConsumeOptions,
  type Consumer,
  type EventLog,
  type LogRecord,
  type ProduceRecord,
  type RecordPosition,
  type TopicSpec,
} from '../event-log.ts';
import { toLogRecord } from './records.ts';
import { PartitionReader } from './replay.ts';

export interface KafkaLogOptions {
  brokers: string[];
  clientId?: string;
  logger?: BackendLogger;
  /** Overrides of the consumer tuning below (kafkajs consumer option names). */
  consumerTuning?: Partial<ConsumerTuning>;
}

export interface ConsumerTuning {
  sessionTimeout: number;
  rebalanceTimeout: number;
  heartbeatInterval: number;
  maxWaitTimeInMs: number;
}

/** Largest record a topic accepts (topic config `max.message.bytes`). */
const MAX_MESSAGE_BYTES = 16 * 1024 * 1024;

/**
 * Consumer tuning: low latency and quick group joins. kafkajs heartbeats between batches (not
 * in the background), and a member notices a rebalance at its next heartbeat, so joins and
 * leaves settle within about a heartbeat interval when handlers are quick. A member that sends
 * no heartbeat for `sessionTimeout` (it died, or one handler call ran that long) loses its
 * partitions: its uncommitted batch goes to another member. During a rebalance the group waits
 * up to `rebalanceTimeout` for busy members.
 */
const CONSUMER_TUNING: ConsumerTuning = {
  sessionTimeout: 10_000,
  rebalanceTimeout: 10_000,
  heartbeatInterval: 500,
  maxWaitTimeInMs: 100,
};

/**
 * Batches of different partitions handled at once, as the embedded log's one worker per
 * partition does (kafkajs keeps a partition's batches in order either way). kafkajs's default, 1,
 * made a member handle one partition at a time: the sink's writer then held one partition's
 * records per insert and used one of its two insert lanes (2.5 records per insert, 27k events/s
 * under the bench's POST load; docs/performance.md). Above the partitions a member has, the extra
 * workers wait idle.
 */
const PARTITIONS_CONSUMED_CONCURRENTLY = 16;
const DEFAULT_MAX_BATCH = 1000;
const RETRY_BACKOFF_MIN_MS = 200;
const RETRY_BACKOFF_MAX_MS = 5_000;
/** How long consume() waits for the member's first assignment. */
const JOIN_TIMEOUT_MS = 60_000;

/** Retries a call that failed with an error kafkajs marks retriable (NOT_LEADER, ...), up to ~10 s. */
async function retryRetriable<T>(call: () => Promise<T>): Promise<T> {
  for (let attempt = 0; ; attempt++) {
    try {
      return await call();
    } catch (err) {
      if (!(err as { retriable?: boolean }).retriable || attempt >= 40) throw err;
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
  }
}

export class KafkaLog implements EventLog {
  readonly kind = 'kafka' as const;

  private readonly kafka: Kafka;
  private readonly logger: BackendLogger;
  private readonly clientId: string;
  private readonly consumerTuning: Partial<ConsumerTuning>;
  private admin: Admin | null = null;
  private producer: Producer | null = null;
  private reader: PartitionReader | null = null;
  private readonly partitionCounts = new Map<string, number>();
  private readonly consumers = new Set<KafkaLogConsumer>();
  /** kafkajs' own partitioner: the same murmur2 as the Java client and the embedded log. */
  private readonly partitioner = Partitioners.DefaultPartitioner();
  private closed = false;

  constructor(options: KafkaLogOptions) {
    if (!options.brokers.length) throw new Error('KafkaLog needs at least one broker');
    this.logger = options.logger ?? consoleLogger;
    this.clientId = options.clientId ?? 'svc';
    this.consumerTuning = options.consumerTuning ?? {};
    this.kafka = new Kafka({
      clientId: this.clientId,
      brokers: options.brokers,
      connectionTimeout: 3_000,
      requestTimeout: 30_000,
      logLevel: logLevel.WARN,
      logCreator: () => (entry) => this.logKafkajs(entry),
    });
  }

  async start(catalog: TopicSpec[]): Promise<void> {
    this.assertOpen();
    // A second start (more topics) reuses the connections of the first.
    let admin = this.admin;
    if (!admin) {
      admin = this.kafka.admin();
      await admin.connect();
      this.admin = admin;
    }

    const existing = new Set(await admin.listTopics());
    const missing = catalog.filter((t) => !existing.has(t.name));
    if (missing.length) {
      // Retried: a broker under load may not know a topic its controller just made, and kafkajs
      // waits out only LEADER_NOT_AVAILABLE (UNKNOWN_TOPIC_OR_PARTITION failed a start in a test
      // run); a second try finds the topics made and returns.
      await retryRetriable(() =>
        admin.createTopics({
          waitForLeaders: true,
          topics: missing.map((t) => ({
            topic: t.name,
            numPartitions: t.partitions,
            configEntries: [
              { name: 'cleanup.policy', value: t.cleanupPolicy },
              { name: 'retention.ms', value: String(t.retentionMs ?? -1) },
              { name: 'max.message.bytes', value: String(MAX_MESSAGE_BYTES) },
            ],
          })),
        }),
      );
      this.logger.info({ topics: missing.map((t) => t.name) }, 'created Kafka topics');
      // Leaders exist in the metadata a moment before they serve requests: wait until each new
      // topic answers ListOffsets, so the first reads after start() do not fail NOT_LEADER.
      for (const t of missing) await this.endOffsets(t.name);
    }
    // Learn the real partition counts (an existing topic may differ from the catalog).
    if (catalog.length) {
      const { topics } = await admin.fetchTopicMetadata({ topics: catalog.map((t) => t.name) });
      for (const t of topics) {
        this.partitionCounts.set(t.name, t.partitions.length);
        const spec = catalog.find((c) => c.name === t.name);
        if (spec && spec.partitions !== t.partitions.length) {
          this.logger.warn(
            { topic: t.name, catalog: spec.partitions, actual: t.partitions.length },
            'Kafka topic has a different partition count than the catalog; keys map by the actual count',
          );
        }
      }
    }

    if (this.producer) return;
    const producer = this.kafka.producer({
      idempotent: true,
      maxInFlightRequests: 1,
      allowAutoTopicCreation: false,
      createPartitioner: Partitioners.DefaultPartitioner,
    });
    await producer.connect();
    this.producer = producer;
    this.reader = new PartitionReader(this.kafka, admin);
  }

  async append(topic: string, records: ProduceRecord[]): Promise<RecordPosition[]> {
    const producer = this.need(this.producer);
    if (records.length === 0) return [];
    const partitions = await this.partitionCount(topic);
    const partitionMetadata = Array.from({ length: partitions }, (_, i) => ({
      partitionId: i,
      leader: 0,
      replicas: [0],
      isr: [0],
      partitionErrorCode: 0,
    }));

    const messages: Message[] = [];
    const indexInPartition: number[] = [];
    const perPartition = new Map<number, number>();
    for (const r of records) {
      const message: Message = {
        key: r.key,
        value: r.value,
        headers: r.headers,
        timestamp: r.timestamp === undefined ? undefined : String(r.timestamp),
      };
      const partition = this.partitioner({ topic, partitionMetadata, message });
      message.partition = partition;
      const seen = perPartition.get(partition) ?? 0;
      perPartition.set(partition, seen + 1);
      indexInPartition.push(seen);
      messages.push(message);
    }

    const result = await producer.send({ topic, acks: -1, messages });
    const baseOffsets = new Map<number, number>();
    for (const meta of result) {
      if (meta.topicName === topic && meta.baseOffset !== undefined) baseOffsets.set(meta.partition, Number(meta.baseOffset));
    }
    return messages.map((m, i) => {
      const base = baseOffsets.get(m.partition!);
      if (base === undefined) throw new Error(`Kafka did not report an offset for ${topic}/${m.partition}`);
      return { topic, partition: m.partition!, offset: base + indexInPartition[i]! };
    });
  }

  async consume(options: ConsumeOptions): Promise<Consumer> {
    const admin = this.need(this.admin);
    // kafkajs would retry a subscription to a missing topic for seconds; say it at once.
    const existing = new Set(await admin.listTopics());
    const unknown = options.topics.filter((t) => !existing.has(t));
    if (unknown.length) throw new Error(`unknown topic: Kafka topic ${unknown.map((t) => `"${t}"`).join(', ')} does not exist`);
    const tuning = { ...CONSUMER_TUNING, ...this.consumerTuning };
    const consumer = new KafkaLogConsumer(this.kafka, options, tuning, this.logger, (c) => this.stopped(c));
    this.consumers.add(consumer);
    try {
      await consumer.start();
    } catch (err) {
      await consumer.stop().catch(() => {});
      throw err;
    }
    return consumer;
  }

  async read(topic: string, partition: number, fromOffset: number, max: number): Promise<LogRecord[]> {
    return this.need(this.reader).read(topic, partition, fromOffset, max);
  }

  async endOffsets(topic: string): Promise<number[]> {
    const offsets = await retryRetriable(() => this.need(this.admin).fetchTopicOffsets(topic));
    const result = new Array<number>(offsets.length).fill(0);
    for (const o of offsets) result[o.partition] = Number(o.high);
    return result;
  }

  async committedOffsets(groupId: string, topic: string): Promise<number[]> {
    const admin = this.need(this.admin);
    const [entry] = await retryRetriable(() => admin.fetchOffsets({ groupId, topics: [topic] }));
    const count = await this.partitionCount(topic);
    const result = new Array<number>(count).fill(-1);
    for (const p of entry?.partitions ?? []) result[p.partition] = Number(p.offset);
    return result;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    await Promise.allSettled([...this.consumers].map((c) => c.stop()));
    await this.reader?.close().catch(() => {});
    await this.producer?.disconnect().catch(() => {});
    await this.admin?.disconnect().catch(() => {});
    this.reader = null;
    this.producer = null;
    this.admin = null;
  }

  /** A consumer has left its group: a group that never commits is of no use to anyone now. */
  private async stopped(consumer: KafkaLogConsumer): Promise<void> {
    this.consumers.delete(consumer);
    if (consumer.commits || !this.admin) return;
    await this.admin.deleteGroups([consumer.groupId]).catch((err: Error) => {
      this.logger.warn(
        { groupId: consumer.groupId, err: err.message },
        'could not delete the consumer group of a stopped view; Kafka removes it at its next offsets cleanup',
      );
    });
  }

  private async partitionCount(topic: string): Promise<number> {
    const known = this.partitionCounts.get(topic);
    if (known !== undefined) return known;
    const admin = this.need(this.admin);
    // listTopics first: metadata of a missing topic is retried by kafkajs for seconds.
    if (!(await admin.listTopics()).includes(topic)) throw new Error(`unknown topic: Kafka topic "${topic}" does not exist`);
    const { topics } = await admin.fetchTopicMetadata({ topics: [topic] });
    const count = topics[0]?.partitions.length ?? 0;
    if (!count) throw new Error(`Kafka topic "${topic}" has no partitions`);
    this.partitionCounts.set(topic, count);
    return count;
  }

  private need<T>(value: T | null): T {
    this.assertOpen();
    if (value === null) throw new Error('KafkaLog is not started (call start(catalog) first)');
    return value;
  }

  private assertOpen(): void {
    if (this.closed) throw new Error('KafkaLog is closed');
  }

  /** kafkajs log lines, warn and up, to our logger. */
  private logKafkajs({ namespace, level, log }: LogEntry): void {
    const { message, timestamp: _ts, logger: _logger, ...rest } = log as LogEntry['log'] & { logger?: string };
    const fields = { kafkajs: namespace, ...rest };
    // kafkajs logs every error response at ERROR, also those it retries (e.g. "The group
    // coordinator is not available" while __consumer_offsets is created): warnings for us.
    const retried = namespace === 'Connection' && message.startsWith('Response ');
    if (level === logLevel.ERROR && !retried) this.logger.error(fields, `kafkajs: ${message}`);
    else if (level === logLevel.ERROR || level === logLevel.WARN) this.logger.warn(fields, `kafkajs: ${message}`);
  }
}

class KafkaLogConsumer implements Consumer {
  readonly groupId: string;
  /** False: offsets are kept here, never committed (ConsumeOptions.commit). */
  readonly commits: boolean;
  /** `topic/partition` -> next offset to handle, for a member that does not commit. */
  private readonly positions = new Map<string, number>();
  private readonly consumer: KafkaConsumer;
  private readonly maxBatchSize: number;
  private current: Array<{ topic: string; partition: number }> = [];
  private stopping: Promise<void> | null = null;
  /** Consecutive failures per partition, for the retry backoff. */
  private readonly failures = new Map<string, number>();

  constructor(
    kafka: Kafka,
    private readonly options: ConsumeOptions,
    tuning: ConsumerTuning,
    private readonly logger: BackendLogger,
    private readonly onStopped: (c: KafkaLogConsumer) => Promise<void>,
  ) {
    this.groupId = options.groupId;
    this.commits = options.commit !== false;
    this.maxBatchSize = Math.max(1, options.maxBatchSize ?? DEFAULT_MAX_BATCH);
    this.consumer = kafka.consumer({
      groupId: options.groupId,
      allowAutoTopicCreation: false,
      maxBytesPerPartition: MAX_MESSAGE_BYTES,
      maxBytes: 4 * MAX_MESSAGE_BYTES,
      ...tuning,
    });
  }

  assignment(): Array<{ topic: string; partition: number }> {
    return this.current.map((a) => ({ ...a }));
  }

  /** Connects, joins the group and resolves once the member has its partitions and positions. */
  async start(): Promise<void> {
    const { consumer, options } = this;
    const { GROUP_JOIN, FETCH, REBALANCING, CRASH, STOP } = consumer.events;

    let joined = false;
    let settle: { resolve(): void; reject(err: Error): void } | null = null;
    const ready = new Promise<void>((resolve, reject) => {
      settle = { resolve, reject };
    });
    const timer = setTimeout(
      () => settle?.reject(new Error(`consumer group ${options.groupId} did not assign partitions within ${JOIN_TIMEOUT_MS} ms`)),
      JOIN_TIMEOUT_MS,
    );
    const done = () => {
      clearTimeout(timer);
      settle?.resolve();
      settle = null;
    };

    consumer.on(GROUP_JOIN, ({ payload }) => {
      this.current = Object.entries(payload.memberAssignment).flatMap(([topic, partitions]) => partitions.map((partition) => ({ topic, partition })));
      this.current.sort((a, b) => a.topic.localeCompare(b.topic) || a.partition - b.partition);
      this.resume();
      joined = true;
      // No partitions: nothing to position. Otherwise the first fetch after the join has
      // resolved the starting offsets (committed, or earliest/latest), see FETCH below.
      if (this.current.length === 0) done();
    });
    // kafkajs resolves each partition's starting offset right before its first fetch; only
    // then is "records appended from now on" (fromBeginning: false) well defined.
    consumer.on(FETCH, () => {
      if (joined) done();
    });
    consumer.on(REBALANCING, () => {
      this.current = [];
    });
    consumer.on(STOP, () => {
      this.current = [];
    });
    consumer.on(CRASH, ({ payload }) => {
      this.logger.error(
        { groupId: options.groupId, err: payload.error?.message, restart: payload.restart },
        payload.restart ? 'Kafka consumer crashed; kafkajs restarts it' : 'Kafka consumer crashed and stopped',
      );
      if (!payload.restart) {
        this.current = [];
        clearTimeout(timer);
        settle?.reject(payload.error);
        settle = null;
      }
    });

    await consumer.connect();
    await consumer.subscribe({ topics: options.topics, fromBeginning: options.fromBeginning ?? true });
    await consumer.run({
      autoCommit: false,
      partitionsConsumedConcurrently: PARTITIONS_CONSUMED_CONCURRENTLY,
      eachBatchAutoResolve: false,
      eachBatch: (payload) => this.eachBatch(payload),
    });
    await ready;
  }

  private async eachBatch(payload: EachBatchPayload): Promise<void> {
    const { batch, resolveOffset, heartbeat, isRunning, isStale } = payload;
    const { topic, partition } = batch;
    const messages = batch.messages;
    const key = `${topic}/${partition}`;

    for (let start = 0; start < messages.length; start += this.maxBatchSize) {
      if (!isRunning() || isStale()) return;
      const chunk = messages.slice(start, start + this.maxBatchSize);
      const records = chunk.map((m) => toLogRecord(topic, partition, m));
      try {
        await this.options.handleBatch({ topic, partition, records } satisfies Batch);
      } catch (err) {
        const failures = (this.failures.get(key) ?? 0) + 1;
        this.failures.set(key, failures);
        const backoff = Math.min(RETRY_BACKOFF_MAX_MS, RETRY_BACKOFF_MIN_MS * 2 ** (failures - 1));
        this.logger.warn(
          {
            groupId: this.groupId,
            topic,
            partition,
            fromOffset: records[0]!.offset,
            count: records.length,
            failures,
            retryInMs: backoff,
            err: err instanceof Error ? err.message : String(err),
          },
          'batch handler failed; the batch will be delivered again',
        );
        // Nothing of this chunk is resolved or committed: fetch it again after the backoff.
        this.consumer.seek({ topic, partition, offset: chunk[0]!.offset });
        await pause(backoff, () => !isRunning() || isStale());
        return;
      }
      this.failures.delete(key);
      const last = chunk[chunk.length - 1]!.offset;
      resolveOffset(last);
      if (this.commits) await this.consumer.commitOffsets([{ topic, partition, offset: String(Number(last) + 1) }]);
      else this.positions.set(key, Number(last) + 1);
      await heartbeat();
    }
  }

  /**
   * After a (re)join, a member that does not commit goes on from its own positions: kafkajs
   * would otherwise start its partitions over from `fromBeginning`'s end, as nothing is committed.
   */
  private resume(): void {
    if (this.commits) return;
    for (const { topic, partition } of this.current) {
      const next = this.positions.get(`${topic}/${partition}`);
      if (next !== undefined) this.consumer.seek({ topic, partition, offset: String(next) });
    }
  }

  stop(): Promise<void> {
    this.stopping ??= (async () => {
      try {
        // Waits for the batch in flight (its chunk commits), then leaves the group.
        await this.consumer.disconnect();
      } finally {
        this.current = [];
        await this.onStopped(this);
      }
    })();
    return this.stopping;
  }
}

async function pause(ms: number, cancelled: () => boolean): Promise<void> {
  const until = Date.now() + ms;
  while (Date.now() < until && !cancelled()) {
    await new Promise((resolve) => setTimeout(resolve, Math.min(50, until - Date.now())));
  }
}
