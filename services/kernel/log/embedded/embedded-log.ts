/**
 * The embedded backend of the EventLog: an on-disk log in the data dir, owned by one process.
 * Layout under `dir`:
 *
 *   LOCK                              pid of the owning process
 *   consumer-offsets.log              committed offsets (see offsets-store.ts)
 *   topics/<topic>/topic.json         partitions, cleanup policy, retention
 *   topics/<topic>/<partition>/       segment files (see partition.ts, record-format.ts)
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import {
  type BackendLogger,
  type Batch,
  type CleanupPolicy,
  consoleLogger,
  type ConsumeOptions,
  type Consumer,
  type EventLog,
  type LogRecord,
  type ProduceRecord,
  type RecordPosition,
  type TopicSpec,
} from '../event-log.ts';
import { partitionForKey } from '../murmur2.ts';
import { DirLock } from './lock.ts';
import { OffsetStore } from './offsets-store.ts';
import { Partition } from './partition.ts';
import { SyncScheduler } from './sync.ts';

export type FsyncPolicy = 'always' | 'never' | { intervalMs: number };

export interface EmbeddedLogOptions {
  dir: string;
  fsync: FsyncPolicy;
  logger?: BackendLogger;
  /** A partition's active segment is closed once it would grow past this. @default 64 MiB */
  segmentBytes?: number;
  /** How often retention is checked besides on every segment roll. @default 60 000 */
  retentionCheckMs?: number;
  /** Wait before a rejected batch is delivered again. @default 200 */
  redeliveryBackoffMs?: number;
}

interface TopicMeta {
  name: string;
  partitions: number;
  cleanupPolicy: CleanupPolicy;
  retentionMs: number | null;
}

interface TopicState {
  meta: TopicMeta;
  dir: string;
  partitions: Partition[];
  rr: number;
}

const TOPIC_NAME = /^[A-Za-z0-9._-]{1,249}$/;
const DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024;

export class EmbeddedLog implements EventLog {
  readonly kind = 'embedded' as const;
  private readonly dir: string;
  private readonly fsyncPolicy: FsyncPolicy;
  private readonly logger: BackendLogger;
  private readonly segmentBytes: number;
  private readonly retentionCheckMs: number;
  readonly redeliveryBackoffMs: number;
  private readonly sync = new SyncScheduler();
  private readonly lock: DirLock;
  private offsets: OffsetStore | null = null;
  private readonly topics = new Map<string, TopicState>();
  private readonly groups = new Map<string, Group>();
  private state: 'new' | 'open' | 'closing' | 'closed' = 'new';
  private closing: Promise<void> | null = null;
  private timers: NodeJS.Timeout[] = [];
  private background = new Set<Promise<unknown>>();

  constructor(options: EmbeddedLogOptions) {
    this.dir = path.resolve(options.dir);
    this.fsyncPolicy = options.fsync;
    this.logger = options.logger ?? consoleLogger;
    this.segmentBytes = options.segmentBytes ?? DEFAULT_SEGMENT_BYTES;
    this.retentionCheckMs = options.retentionCheckMs ?? 60_000;
    this.redeliveryBackoffMs = options.redeliveryBackoffMs ?? 200;
    const p = this.fsyncPolicy;
    if (!(p === 'always' || p === 'never' || (typeof p === 'object' && p !== null && p.intervalMs > 0))) {
      throw new Error(`invalid fsync policy ${JSON.stringify(p)}: use 'always', 'never' or { intervalMs > 0 }`);
    }
    if (!(this.segmentBytes > 0)) throw new Error('segmentBytes must be positive');
    this.lock = new DirLock(this.dir);
  }

  // ---------------------------------------------------------------- lifecycle

  async start(catalog: TopicSpec[]): Promise<void> {
    if (this.state === 'closing' || this.state === 'closed') throw new Error('event log is closed');
    if (this.state === 'new') this.open();
    for (const spec of catalog) this.ensureTopic(spec);
    for (const g of this.groups.values()) g.rebalance();
  }

  private open(): void {
    fs.mkdirSync(path.join(this.dir, 'topics'), { recursive: true });
    const { tookOverFrom } = this.lock.acquire();
    if (tookOverFrom !== null) this.logger.info({ dir: this.dir, stalePid: tookOverFrom }, 'event log: took over a stale data dir lock');
    try {
      this.offsets = new OffsetStore(this.dir, this.sync, this.logger);
      this.offsets.open();
      for (const name of fs.readdirSync(path.join(this.dir, 'topics')).sort()) {
        const metaFile = path.join(this.dir, 'topics', name, 'topic.json');
        if (!fs.existsSync(metaFile)) continue;
        const meta = JSON.parse(fs.readFileSync(metaFile, 'utf8')) as TopicMeta;
        this.loadTopic(meta);
      }
    } catch (err) {
      this.releaseAll();
      throw err;
    }
    this.state = 'open';
    const p = this.fsyncPolicy;
    if (typeof p === 'object') {
      const t = setInterval(() => this.sync.kick(), p.intervalMs);
      t.unref();
      this.timers.push(t);
    }
    const r = setInterval(() => this.track(this.enforceRetention()), this.retentionCheckMs);
    r.unref();
    this.timers.push(r);
  }

  private loadTopic(meta: TopicMeta): TopicState {
    const dir = path.join(this.dir, 'topics', meta.name);
    const t: TopicState = { meta, dir, partitions: [], rr: Math.floor(Math.random() * 0x7fffffff) };
    for (let p = 0; p < meta.partitions; p++) {
      const part = new Partition(meta.name, p, dir, this.sync, this.logger);
      part.open();
      t.partitions.push(part);
    }
    this.topics.set(meta.name, t);
    return t;
  }

  private writeMeta(t: TopicState): void {
    const file = path.join(t.dir, 'topic.json');
    fs.writeFileSync(`${file}.tmp`, JSON.stringify(t.meta, null, 2));
    fs.renameSync(`${file}.tmp`, file);
  }

  private ensureTopic(spec: TopicSpec): void {
    if (!TOPIC_NAME.test(spec.name) || spec.name === '.' || spec.name === '..') {
      throw new Error(`invalid topic name ${JSON.stringify(spec.name)}: use letters, digits, '.', '_' and '-'`);
    }
    if (!Number.isInteger(spec.partitions) || spec.partitions < 1) {
      throw new Error(`topic ${spec.name}: partitions must be a positive integer`);
    }
    const existing = this.topics.get(spec.name);
    if (!existing) {
      const dir = path.join(this.dir, 'topics', spec.name);
      fs.mkdirSync(dir, { recursive: true });
      const meta: TopicMeta = { name: spec.name, partitions: spec.partitions, cleanupPolicy: spec.cleanupPolicy, retentionMs: spec.retentionMs };
      const t = this.loadTopic(meta);
      this.writeMeta(t);
      this.logger.info({ topic: spec.name, partitions: spec.partitions }, 'event log: topic created');
      return;
    }
    const m = existing.meta;
    let changed = false;
    if (spec.partitions > m.partitions) {
      for (let p = m.partitions; p < spec.partitions; p++) {
        const part = new Partition(m.name, p, existing.dir, this.sync, this.logger);
        part.open();
        existing.partitions.push(part);
      }
      this.logger.info({ topic: m.name, from: m.partitions, to: spec.partitions }, 'event log: topic partitions grown');
      m.partitions = spec.partitions;
      changed = true;
    } else if (spec.partitions < m.partitions) {
      this.logger.warn(
        { topic: m.name, partitions: m.partitions, catalog: spec.partitions },
        'event log: catalog has fewer partitions than the topic; partitions are never removed',
      );
    }
    if (spec.cleanupPolicy !== m.cleanupPolicy || spec.retentionMs !== m.retentionMs) {
      m.cleanupPolicy = spec.cleanupPolicy;
      m.retentionMs = spec.retentionMs;
      changed = true;
    }
    if (changed) this.writeMeta(existing);
  }

  async close(): Promise<void> {
    if (this.state === 'new') {
      this.state = 'closed';
      return;
    }
    if (!this.closing) this.closing = this.doClose();
    return this.closing;
  }

  private async doClose(): Promise<void> {
    this.state = 'closing';
    for (const t of this.timers) clearInterval(t);
    this.timers = [];
    // Stop every consumer gracefully (in-flight batches finish and commit).
    await Promise.all([...this.groups.values()].flatMap((g) => g.members.map((m) => m.stop())));
    await Promise.all([...this.groups.values()].map((g) => g.shutdown()));
    await Promise.all([...this.background].map((p) => p.catch(() => undefined)));
    for (const t of this.topics.values()) for (const p of t.partitions) await p.settle();
    await this.sync.idle();
    this.releaseAll();
    this.state = 'closed';
  }

  private releaseAll(): void {
    let firstError: unknown = null;
    const attempt = (fn: () => void): void => {
      try {
        fn();
      } catch (err) {
        firstError ??= err;
      }
    };
    for (const t of this.topics.values()) for (const p of t.partitions) attempt(() => p.close());
    this.topics.clear();
    attempt(() => this.offsets?.close());
    this.offsets = null;
    this.lock.release();
    if (firstError !== null) throw firstError;
  }

  private track(p: Promise<unknown>): void {
    const q = p.catch((err: unknown) => this.logger.warn({ err }, 'event log: background task failed'));
    this.background.add(q);
    void q.finally(() => this.background.delete(q));
  }

  private assertOpen(): void {
    if (this.state !== 'open') throw new Error(this.state === 'new' ? 'event log is not started' : 'event log is closed');
  }

  topic(name: string): TopicState {
    this.assertOpen();
    const t = this.topics.get(name);
    if (!t) throw new Error(`unknown topic "${name}": it is not in the topic catalog given to start()`);
    return t;
  }

  // ---------------------------------------------------------------- produce / read

  async append(topic: string, records: ProduceRecord[]): Promise<RecordPosition[]> {
    const t = this.topic(topic);
    if (records.length === 0) return [];
    const n = t.partitions.length;
    const now = Date.now();
    const positions = new Array<RecordPosition>(records.length);
    const byPartition: Array<
      Array<{ key: string | null; value: Buffer | null; headers: Record<string, string> | undefined; timestamp: number; offset: number }>
    > = [];
    const indexes: number[][] = [];
    for (let i = 0; i < records.length; i++) {
      const r = records[i];
      const p = r.key === null || r.key === undefined ? (t.rr = (t.rr + 1) & 0x7fffffff) % n : partitionForKey(r.key, n);
      if (r.value !== null && !Buffer.isBuffer(r.value)) throw new TypeError(`append to ${topic}: value must be a Buffer or null`);
      (byPartition[p] ??= []).push({ key: r.key ?? null, value: r.value, headers: r.headers, timestamp: r.timestamp ?? now, offset: 0 });
      (indexes[p] ??= []).push(i);
    }
    let rolled = false;
    for (let p = 0; p < n; p++) {
      const list = byPartition[p];
      if (!list) continue;
      const res = t.partitions[p].append(list, this.segmentBytes);
      rolled ||= res.rolled;
      const idx = indexes[p];
      for (let j = 0; j < idx.length; j++) positions[idx[j]] = { topic, partition: p, offset: res.firstOffset + j };
    }
    if (rolled) this.afterRoll(t);
    if (this.fsyncPolicy === 'always') await this.sync.requestSync();
    return positions;
  }

  private afterRoll(t: TopicState): void {
    if (t.meta.cleanupPolicy === 'compact') this.track(this.compact(t.meta.name));
    else if (t.meta.retentionMs !== null) this.track(this.enforceRetention(t.meta.name));
  }

  async read(topic: string, partition: number, fromOffset: number, max: number): Promise<LogRecord[]> {
    return this.readSync(topic, partition, fromOffset, max);
  }

  readSync(topic: string, partition: number, fromOffset: number, max: number): LogRecord[] {
    const t = this.topic(topic);
    const p = t.partitions[partition];
    if (!p) throw new Error(`topic "${topic}" has no partition ${partition} (it has ${t.partitions.length})`);
    return p.read(fromOffset, max);
  }

  async endOffsets(topic: string): Promise<number[]> {
    return this.topic(topic).partitions.map((p) => p.nextOffset);
  }

  /** The earliest offset still stored, per partition (after retention and compaction). */
  async startOffsets(topic: string): Promise<number[]> {
    return this.topic(topic).partitions.map((p) => p.startOffset);
  }

  async committedOffsets(groupId: string, topic: string): Promise<number[]> {
    const t = this.topic(topic);
    return t.partitions.map((_, p) => this.offsets!.get(groupId, topic, p));
  }

  // ---------------------------------------------------------------- maintenance

  /**
   * Compacts a 'compact' topic: closed segments keep only the last record per key. With
   * `rollActive`, the active segments are closed first so every record takes part (tests).
   */
  async compact(topic: string, options: { rollActive?: boolean } = {}): Promise<void> {
    const t = this.topic(topic);
    if (t.meta.cleanupPolicy !== 'compact') throw new Error(`topic "${topic}" is not a compacted topic`);
    if (options.rollActive) for (const p of t.partitions) p.roll();
    await Promise.all(t.partitions.map((p) => p.compact()));
  }

  /** Deletes closed segments older than retention, for one topic or every 'delete' topic. */
  async enforceRetention(topic?: string): Promise<number> {
    if (this.state !== 'open') return 0;
    const list = topic ? [this.topic(topic)] : [...this.topics.values()];
    let removed = 0;
    const now = Date.now();
    for (const t of list) {
      if (t.meta.cleanupPolicy !== 'delete' || t.meta.retentionMs === null) continue;
      for (const p of t.partitions) removed += await p.applyRetention(now - t.meta.retentionMs);
    }
    return removed;
  }

  /** Closes the active segment of every partition of a topic (tests, maintenance). */
  roll(topic: string): void {
    const t = this.topic(topic);
    let rolled = false;
    for (const p of t.partitions) rolled = p.roll() || rolled;
    if (rolled) this.afterRoll(t);
  }

  /** Number of fsync rounds so far (group commit observability). */
  get fsyncRounds(): number {
    return this.sync.rounds;
  }

  // ---------------------------------------------------------------- consumers

  async consume(options: ConsumeOptions): Promise<Consumer> {
    this.assertOpen();
    if (!options.groupId) throw new Error('consume: groupId is required');
    if (!options.topics.length) throw new Error('consume: at least one topic is required');
    for (const name of options.topics) this.topic(name);
    let group = this.groups.get(options.groupId);
    if (!group) this.groups.set(options.groupId, (group = new Group(this, options.groupId)));
    const member = new Member(group, options);
    group.join(member);
    return member;
  }

  /** @internal */
  partitionOf(topic: string, partition: number): Partition {
    return this.topic(topic).partitions[partition];
  }

  /** @internal */
  committed(groupId: string, topic: string, partition: number): number {
    return this.offsets!.get(groupId, topic, partition);
  }

  /** @internal */
  commit(groupId: string, topic: string, partition: number, offset: number): void {
    this.offsets!.commit(groupId, topic, partition, offset);
  }

  /** @internal */
  partitionCount(topic: string): number {
    return this.topics.get(topic)?.partitions.length ?? 0;
  }

  /** @internal */
  get log(): BackendLogger {
    return this.logger;
  }

  /** @internal Open, or closing while consumers finish their in-flight batches. */
  get acceptsCommits(): boolean {
    return this.state === 'open' || this.state === 'closing';
  }

  /** @internal */
  get isOpen(): boolean {
    return this.state === 'open';
  }
}

let memberSeq = 0;

class Member implements Consumer {
  readonly groupId: string;
  readonly id = ++memberSeq;
  readonly topics: string[];
  readonly fromBeginning: boolean;
  /** False: offsets are never committed, and each start reads from `fromBeginning`'s position. */
  readonly commit: boolean;
  readonly maxBatchSize: number;
  readonly handleBatch: (batch: Batch) => Promise<void>;
  assigned: Array<{ topic: string; partition: number }> = [];
  stopped = false;
  private inFlight = 0;
  private idleWaiters: Array<() => void> = [];
  private stopping: Promise<void> | null = null;

  constructor(
    private readonly group: Group,
    options: ConsumeOptions,
  ) {
    this.groupId = options.groupId;
    this.topics = [...new Set(options.topics)];
    this.fromBeginning = options.fromBeginning ?? true;
    this.commit = options.commit ?? true;
    this.maxBatchSize = Math.max(1, options.maxBatchSize ?? 1000);
    this.handleBatch = options.handleBatch;
  }

  assignment(): Array<{ topic: string; partition: number }> {
    return this.assigned.map((a) => ({ ...a }));
  }

  begin(): void {
    this.inFlight++;
  }

  end(): void {
    this.inFlight--;
    if (this.inFlight === 0) {
      const ws = this.idleWaiters;
      this.idleWaiters = [];
      for (const w of ws) w();
    }
  }

  stop(): Promise<void> {
    if (!this.stopping) {
      this.stopped = true;
      this.group.leave(this);
      this.stopping = this.inFlight === 0 ? Promise.resolve() : new Promise((resolve) => this.idleWaiters.push(resolve));
    }
    return this.stopping;
  }
}

/**
 * A consumer group: its members, and one worker per subscribed partition. The worker delivers
 * batches one at a time to the partition's current owner, so an in-flight batch always finishes
 * (and commits) before the next owner gets the partition.
 */
class Group {
  members: Member[] = [];
  private readonly workers = new Map<string, PartitionWorker>();

  constructor(
    readonly log: EmbeddedLog,
    readonly id: string,
  ) {}

  join(member: Member): void {
    this.members.push(member);
    this.rebalance(member);
  }

  leave(member: Member): void {
    const i = this.members.indexOf(member);
    if (i >= 0) this.members.splice(i, 1);
    this.rebalance();
  }

  /** Round robin over the sorted topic-partitions among the members subscribing to each topic. */
  rebalance(joining?: Member): void {
    if (!this.log.isOpen) {
      for (const m of this.members) m.assigned = [];
      for (const w of this.workers.values()) w.setOwner(null);
      return;
    }
    const topics = [...new Set(this.members.flatMap((m) => m.topics))].sort();
    for (const m of this.members) m.assigned = [];
    const owners = new Map<string, Member>();
    let counter = 0;
    for (const topic of topics) {
      const eligible = this.members.filter((m) => m.topics.includes(topic));
      const n = this.log.partitionCount(topic);
      for (let p = 0; p < n; p++) {
        const owner = eligible[counter++ % eligible.length];
        owner.assigned.push({ topic, partition: p });
        owners.set(`${topic}\u0000${p}`, owner);
      }
    }
    for (const [key, owner] of owners) {
      let w = this.workers.get(key);
      if (!w) {
        const [topic, p] = key.split('\u0000');
        const partition = Number(p);
        const settings = joining ?? owner;
        const committed = settings.commit ? this.log.committed(this.id, topic, partition) : -1;
        const part = this.log.partitionOf(topic, partition);
        const fromBeginning = settings.fromBeginning;
        const start = committed >= 0 ? committed : fromBeginning ? 0 : part.nextOffset;
        w = new PartitionWorker(this, topic, partition, start);
        this.workers.set(key, w);
        w.setOwner(owner);
        w.run();
      } else w.setOwner(owner);
    }
    for (const [key, w] of this.workers) if (!owners.has(key)) w.setOwner(null);
  }

  async shutdown(): Promise<void> {
    await Promise.all([...this.workers.values()].map((w) => w.stop()));
    this.workers.clear();
  }
}

class PartitionWorker {
  private owner: Member | null = null;
  private wake: (() => void) | null = null;
  private stopped = false;
  private done: Promise<void> | null = null;

  constructor(
    private readonly group: Group,
    readonly topic: string,
    readonly partition: number,
    private position: number,
  ) {}

  setOwner(owner: Member | null): void {
    this.owner = owner;
    this.signal();
  }

  private signal(): void {
    const w = this.wake;
    this.wake = null;
    w?.();
  }

  run(): void {
    this.done = this.loop().catch((err: unknown) => {
      this.group.log.log.warn({ err, topic: this.topic, partition: this.partition, group: this.group.id }, 'event log: consumer worker crashed');
    });
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.signal();
    await this.done;
  }

  private waitForChange(part: Partition | null, ms?: number): Promise<void> {
    return new Promise((resolve) => {
      let timer: NodeJS.Timeout | null = null;
      let unsubscribe: (() => void) | null = null;
      const fire = (): void => {
        if (timer) clearTimeout(timer);
        unsubscribe?.();
        if (this.wake === fire) this.wake = null;
        resolve();
      };
      this.wake = fire;
      if (part) unsubscribe = part.onAppend(fire);
      if (ms !== undefined) timer = setTimeout(fire, ms);
    });
  }

  private async loop(): Promise<void> {
    const log = this.group.log;
    while (!this.stopped && log.acceptsCommits) {
      const owner = this.owner;
      if (!owner || owner.stopped) {
        await this.waitForChange(null);
        continue;
      }
      const part = log.partitionOf(this.topic, this.partition);
      let records: LogRecord[];
      try {
        records = part.read(this.position, owner.maxBatchSize);
      } catch (err) {
        log.log.warn({ err, topic: this.topic, partition: this.partition, group: this.group.id }, 'event log: read failed; retrying');
        await this.waitForChange(null, 1000);
        continue;
      }
      if (records.length === 0) {
        await this.waitForChange(part);
        continue;
      }
      owner.begin();
      let ok = false;
      try {
        await owner.handleBatch({ topic: this.topic, partition: this.partition, records });
        ok = true;
      } catch (err) {
        log.log.warn(
          { err, topic: this.topic, partition: this.partition, group: this.group.id, fromOffset: records[0].offset, records: records.length },
          'event log: batch handler rejected; it will be delivered again',
        );
      }
      try {
        if (ok) {
          this.position = records[records.length - 1].offset + 1;
          if (owner.commit && log.acceptsCommits) log.commit(this.group.id, this.topic, this.partition, this.position);
        }
      } finally {
        owner.end();
      }
      if (!ok) await this.waitForChange(null, log.redeliveryBackoffMs);
    }
  }
}
