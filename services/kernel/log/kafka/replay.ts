/**
 * Replay reads (EventLog.read): records of one partition from an offset, without a consumer
 * group. kafkajs has no public "assign + seek + poll" (its consumers always join a group, which
 * costs a join/sync round and leaves a group behind), so this sends Fetch requests to the
 * partition's leader through kafkajs' cluster/broker objects, the ones its own consumer uses.
 *
 * Those objects are kafkajs internals: the cluster factory that `new Kafka()` keeps under a
 * symbol, `cluster.addTargetTopic / findLeaderForPartitions / findBroker` and `broker.fetch`.
 * kafkajs is frozen at 2.2.4 (its last release, pinned by package-lock.json); the Kafka
 * contract test pins this behaviour, and a kafkajs upgrade must re-check this file.
 */
import type { Admin, Kafka, KafkaMessage } from 'kafkajs';
import type { LogRecord } from '../event-log.ts';
import { toLogRecord } from './records.ts';

/** kafkajs' isolation levels: read committed, as its consumers do. */
const READ_COMMITTED = 1;
/** Bytes asked for per Fetch; a record larger than this still comes back whole. */
const FETCH_BYTES = 1024 * 1024;
const RETRIABLE = new Set([
  'NOT_LEADER_FOR_PARTITION',
  'NOT_LEADER_OR_FOLLOWER',
  'LEADER_NOT_AVAILABLE',
  'UNKNOWN_TOPIC_OR_PARTITION',
  'FENCED_LEADER_EPOCH',
  'UNKNOWN_LEADER_EPOCH',
  'REPLICA_NOT_AVAILABLE',
]);

interface FetchedPartition {
  partition: number;
  errorCode: number;
  highWatermark: string;
  messages: Array<KafkaMessage & { isControlRecord?: boolean }>;
}
interface InternalBroker {
  fetch(request: {
    maxWaitTime: number;
    minBytes: number;
    maxBytes: number;
    isolationLevel: number;
    topics: Array<{ topic: string; partitions: Array<{ partition: number; fetchOffset: string; maxBytes: number }> }>;
  }): Promise<{ responses: Array<{ topicName: string; partitions: FetchedPartition[] }> }>;
}
interface InternalCluster {
  connect(): Promise<void>;
  disconnect(): Promise<void>;
  refreshMetadata(): Promise<void>;
  addTargetTopic(topic: string): Promise<void>;
  findLeaderForPartitions(topic: string, partitions: number[]): Record<string, number[]>;
  findBroker(options: { nodeId: string }): Promise<InternalBroker>;
}
type CreateCluster = (options: { allowAutoTopicCreation?: boolean; metadataMaxAge?: number }) => InternalCluster;

function clusterFactory(kafka: Kafka): CreateCluster {
  const symbol = Object.getOwnPropertySymbols(kafka).find((s) => s.description === 'private:Kafka:createCluster');
  const factory = symbol && (kafka as unknown as Record<symbol, unknown>)[symbol];
  if (typeof factory !== 'function') {
    throw new Error('kafkajs internals changed: no cluster factory on the Kafka client (see services/kernel/log/kafka/replay.ts)');
  }
  return factory as CreateCluster;
}

export class PartitionReader {
  private connecting: Promise<InternalCluster> | null = null;

  constructor(
    private readonly kafka: Kafka,
    private readonly admin: Admin,
  ) {}

  async read(topic: string, partition: number, fromOffset: number, max: number): Promise<LogRecord[]> {
    if (max <= 0) return [];
    const cluster = await this.connect();
    const out: LogRecord[] = [];
    let offset = Math.max(0, Math.floor(fromOffset));
    let attempts = 0;

    while (out.length < max) {
      let fetched: FetchedPartition;
      try {
        fetched = await this.fetchOnce(cluster, topic, partition, offset);
      } catch (err) {
        const type = (err as { type?: string }).type;
        if (type === 'OFFSET_OUT_OF_RANGE') {
          // Below the log start (retention removed it): go on from the earliest record.
          // At or past the end: nothing to read.
          const bounds = (await this.admin.fetchTopicOffsets(topic)).find((o) => o.partition === partition);
          const low = Number(bounds?.low ?? 0);
          const high = Number(bounds?.high ?? 0);
          if (offset >= high || low <= offset) break;
          offset = low;
          continue;
        }
        if (type && RETRIABLE.has(type) && attempts++ < 5) {
          await cluster.refreshMetadata().catch(() => {});
          await new Promise((resolve) => setTimeout(resolve, 100 * attempts));
          continue;
        }
        throw err;
      }
      attempts = 0;

      let next = offset;
      for (const m of fetched.messages) {
        const at = Number(m.offset);
        if (at < offset) continue; // a fetch returns whole batches, which may start earlier
        next = at + 1;
        if (m.isControlRecord) continue;
        out.push(toLogRecord(topic, partition, m));
        if (out.length >= max) break;
      }
      if (next === offset) break; // nothing more at or after `offset` (end of the partition)
      offset = next;
      if (offset >= Number(fetched.highWatermark)) break;
    }
    return out;
  }

  async close(): Promise<void> {
    const pending = this.connecting;
    this.connecting = null;
    if (pending) await (await pending.catch(() => null))?.disconnect();
  }

  private async fetchOnce(cluster: InternalCluster, topic: string, partition: number, offset: number): Promise<FetchedPartition> {
    await cluster.addTargetTopic(topic);
    const leaders = cluster.findLeaderForPartitions(topic, [partition]);
    const nodeId = Object.keys(leaders)[0];
    if (nodeId === undefined) {
      throw Object.assign(new Error(`no partition ${partition} in topic "${topic}"`), { type: 'UNKNOWN_PARTITION' });
    }
    const broker = await cluster.findBroker({ nodeId });
    const { responses } = await broker.fetch({
      maxWaitTime: 0,
      minBytes: 1,
      maxBytes: FETCH_BYTES,
      isolationLevel: READ_COMMITTED,
      topics: [{ topic, partitions: [{ partition, fetchOffset: String(offset), maxBytes: FETCH_BYTES }] }],
    });
    const fetched = responses.find((r) => r.topicName === topic)?.partitions.find((p) => p.partition === partition);
    if (!fetched) throw new Error(`Kafka answered a fetch of ${topic}/${partition} without that partition`);
    return fetched;
  }

  private connect(): Promise<InternalCluster> {
    this.connecting ??= (async () => {
      const cluster = clusterFactory(this.kafka)({ allowAutoTopicCreation: false });
      await cluster.connect();
      return cluster;
    })().catch((err) => {
      this.connecting = null;
      throw err;
    });
    return this.connecting;
  }
}
