/**
 * The actor runtime. A service declares its subscriptions (group, topics, handler) and emits
 * events through `publish`; it never calls another service. The same services run all in one
 * process (embedded) or one per process on Kafka (`svc run <service>`).
 *
 * Failure policy: a batch whose handler fails is retried with backoff up to
 * SVC_HANDLER_MAX_ATTEMPTS times; then its records are tried one by one, and a record that
 * still fails (or cannot be decoded at all) goes to the dead-letter topic with the error, so
 * one poison record never blocks its partition.
 */
import os from 'node:os';
import type { Config } from './config.ts';
import type { Consumer, EventLog, LogRecord, RecordPosition, TopicSpec } from './log/event-log.ts';
import type { Logger } from './logger.ts';
import type { Metrics } from './metrics.ts';
import type { EventSerde } from './schema/serde.ts';
import type { Store } from './store/store.ts';
import { TOPICS } from './topics.ts';
import { newEventId } from './ids.ts';
import type { Visibility, Watermark } from './watermark.ts';

/** Everything a service is given: the seams and the process-wide tools. */
export interface Kernel {
  readonly config: Config;
  /** The topic catalog (topics/catalog.yaml). */
  readonly catalog: TopicSpec[];
  readonly logger: Logger;
  readonly log: EventLog;
  readonly serde: EventSerde;
  readonly store: Store;
  readonly metrics: Metrics;
  /** Read-your-writes: where a write awaits the projection its next read hits. */
  readonly visibility: Visibility;
  /** Distinguishes this process among replicas (per-process views use it in their group ids). */
  readonly instanceId: string;
}

export interface Service {
  readonly name: string;
  start(kernel: Kernel): Promise<void>;
  /** Graceful: finish in-flight work, flush, commit. */
  stop(): Promise<void>;
}

/** A decoded record: its Avro value (null for a tombstone) and where it came from. */
export interface Delivered<T> {
  record: LogRecord;
  value: T | null;
}

export interface OutgoingEvent {
  key: string | null;
  /** Null appends a tombstone (compacted topics). */
  value: object | null;
  /** Tenant the event belongs to; carried as a header so operators can see it on dead letters. */
  tenant: string;
}

export function instanceIdFor(config: Config): string {
  return config.logBackend === 'embedded' ? 'embedded' : `${os.hostname()}-${process.pid}`;
}

/** Encodes and appends events to one topic; resolves with their positions once durable. */
export function publish(kernel: Kernel, topic: string, events: OutgoingEvent[]): Promise<RecordPosition[]> {
  return publishEncoded(
    kernel,
    topic,
    events.map((e) => ({ key: e.key, tenant: e.tenant, value: e.value === null ? null : kernel.serde.encode(topic, e.value) })),
  );
}

/** Appends values already in the wire format (encoded off the event loop, e.g. by the ingest workers). */
export async function publishEncoded(
  kernel: Kernel,
  topic: string,
  records: Array<{ key: string | null; tenant: string; value: Buffer | null }>,
): Promise<RecordPosition[]> {
  const positions = await kernel.log.append(
    topic,
    records.map((r) => ({ key: r.key, value: r.value, headers: { tenant: r.tenant } })),
  );
  kernel.metrics.appendedRecords.inc({ topic }, records.length);
  return positions;
}

export interface SubscribeOptions<T> {
  groupId: string;
  topics: string[];
  fromBeginning?: boolean;
  maxBatchSize?: number;
  /** False for per-process views that rebuild from the beginning on every start. @default true */
  commit?: boolean;
  /** Advanced past each batch once it is handled. */
  watermark?: Watermark;
  /**
   * Hand the values over undecoded, as their wire-format bytes (a handler that passes them on
   * as they are; it dead-letters nothing at decode time, its failures are handled as usual).
   */
  raw?: boolean;
  handle(events: Array<Delivered<T>>): Promise<void>;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** Appends a record that cannot be handled to the dead-letter topic, with the error and attempts. */
async function deadLetter(kernel: Kernel, group: string, record: LogRecord, error: unknown, attempts: number): Promise<void> {
  const message = error instanceof Error ? error.message : String(error);
  kernel.logger.error(
    { group, topic: record.topic, partition: record.partition, offset: record.offset, tenant: record.headers.tenant, err: message },
    'event sent to the dead-letter topic',
  );
  kernel.metrics.deadLettered.inc({ group, topic: record.topic });
  await publish(kernel, TOPICS.deadLetters, [
    {
      key: `${record.topic}:${record.partition}:${record.offset}`,
      tenant: record.headers.tenant ?? '',
      value: {
        tenant: record.headers.tenant ?? '',
        event_id: newEventId(),
        ts: Date.now(),
        group_id: group,
        topic: record.topic,
        partition: record.partition,
        offset: record.offset,
        key: record.key,
        value: record.value,
        error: message,
        attempts,
      },
    },
  ]);
}

/** Decodes a batch; a record that cannot be decoded can never succeed, so it is dead-lettered at once. */
async function decode<T>(kernel: Kernel, group: string, records: LogRecord[]): Promise<Array<Delivered<T>>> {
  const out: Array<Delivered<T>> = [];
  for (const record of records) {
    try {
      const value = record.value === null ? null : ((await kernel.serde.decode(record.topic, record.value)) as T);
      out.push({ record, value });
    } catch (err) {
      // An undecodable record can never succeed: no retries.
      await deadLetter(kernel, group, record, err, 1);
    }
  }
  return out;
}

/** Runs the handler up to `attempts` times with backoff; resolves with the last error, or null once it succeeds. */
async function tryHandle<T>(
  kernel: Kernel,
  group: string,
  handle: SubscribeOptions<T>['handle'],
  events: Array<Delivered<T>>,
  attempts: number,
): Promise<unknown> {
  let lastError: unknown = null;
  for (let attempt = 1; attempt <= attempts; attempt++) {
    try {
      await handle(events);
      return null;
    } catch (err) {
      lastError = err;
      kernel.metrics.handlerFailures.inc({ group });
      kernel.logger.warn({ group, attempt, err: (err as Error).message }, 'handler failed');
      if (attempt < attempts) await sleep(Math.min(2000, 50 * 2 ** (attempt - 1)));
    }
  }
  return lastError;
}

/**
 * Handles decoded events as a batch with retries; when the batch still fails, tries each record
 * once more on its own and dead-letters those that fail (one poison record never blocks the rest).
 */
async function handleOrDeadLetter<T>(kernel: Kernel, group: string, handle: SubscribeOptions<T>['handle'], events: Array<Delivered<T>>): Promise<void> {
  const maxAttempts = kernel.config.handlerMaxAttempts;
  const error = await tryHandle(kernel, group, handle, events, maxAttempts);
  if (error === null) return;
  for (const event of events) {
    const single = events.length === 1 ? error : await tryHandle(kernel, group, handle, [event], 1);
    if (single !== null) await deadLetter(kernel, group, event.record, single, events.length === 1 ? maxAttempts : maxAttempts + 1);
  }
}

export async function subscribe<T>(kernel: Kernel, options: SubscribeOptions<T>): Promise<Consumer> {
  const group = options.groupId;
  if (options.commit !== false) kernel.metrics.trackLag(group, options.topics);
  return kernel.log.consume({
    groupId: group,
    topics: options.topics,
    fromBeginning: options.fromBeginning ?? true,
    maxBatchSize: options.maxBatchSize,
    commit: options.commit,
    handleBatch: async (batch) => {
      const events = options.raw ? batch.records.map((record) => ({ record, value: record.value as T | null })) : await decode<T>(kernel, group, batch.records);
      if (events.length > 0) await handleOrDeadLetter(kernel, group, (e) => options.handle(e), events);
      const last = batch.records[batch.records.length - 1];
      if (last) options.watermark?.advance(batch.topic, batch.partition, last.offset);
    },
  });
}
