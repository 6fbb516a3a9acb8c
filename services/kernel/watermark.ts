import { AppError } from './errors.ts';
import type { EventLog, RecordPosition, TopicSpec } from './log/event-log.ts';
import { partitionForKey } from './log/murmur2.ts';
import { sinkGroupId } from './topics.ts';

/**
 * How far a projection (the sink, an entity view) has applied each partition it consumes.
 * Read-your-writes rests on it: a write appends, then awaits `waitFor` of its positions before
 * answering, so the next read sees it.
 */
export class Watermark {
  /** topic -> partition -> highest applied offset. */
  private readonly applied = new Map<string, Map<number, number>>();
  private waiters: Array<{ positions: RecordPosition[]; resolve: () => void }> = [];

  constructor(readonly name: string) {}

  /** Marks every offset up to and including `offset` of a partition as applied. */
  advance(topic: string, partition: number, offset: number): void {
    let partitions = this.applied.get(topic);
    if (!partitions) this.applied.set(topic, (partitions = new Map()));
    if ((partitions.get(partition) ?? -1) >= offset) return;
    partitions.set(partition, offset);
    if (this.waiters.length === 0) return;
    this.waiters = this.waiters.filter((w) => {
      if (!this.covers(w.positions)) return true;
      w.resolve();
      return false;
    });
  }

  offset(topic: string, partition: number): number {
    return this.applied.get(topic)?.get(partition) ?? -1;
  }

  covers(positions: RecordPosition[]): boolean {
    return positions.every((p) => this.offset(p.topic, p.partition) >= p.offset);
  }

  /** Resolves once every position is applied; rejects with a 504 `timeout` after `timeoutMs`. */
  waitFor(positions: RecordPosition[], timeoutMs: number): Promise<void> {
    if (this.covers(positions)) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const waiter = {
        positions,
        resolve: () => {
          clearTimeout(timer);
          resolve();
        },
      };
      const timer = setTimeout(() => {
        this.waiters = this.waiters.filter((w) => w !== waiter);
        reject(new AppError('timeout', `the write was accepted but ${this.name} did not apply it within ${timeoutMs} ms; it will become visible later`));
      }, timeoutMs);
      this.waiters.push(waiter);
    });
  }
}

/**
 * Where a write waits to become readable. The projections of this process register the
 * watermark of each topic they materialise (the sink registers its tables' topics). When the
 * sink runs in another process (`svc run api` on Kafka), the sink's committed offsets stand in
 * for its watermark: it commits only after an insert succeeded.
 */
export class Visibility {
  private readonly byTopic = new Map<string, Watermark>();

  constructor(
    private readonly catalog: TopicSpec[],
    private readonly log: Pick<EventLog, 'committedOffsets' | 'endOffsets'>,
  ) {}

  register(topic: string, watermark: Watermark): void {
    this.byTopic.set(topic, watermark);
  }

  /** Resolves once the projection of every position's topic has applied it. */
  async waitFor(positions: RecordPosition[], timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (const topic of new Set(positions.map((p) => p.topic))) {
      const mine = positions.filter((p) => p.topic === topic);
      const watermark = this.byTopic.get(topic);
      if (watermark) await watermark.waitFor(mine, Math.max(0, deadline - Date.now()));
      else await this.pollCommits(topic, mine, deadline);
    }
  }

  /**
   * Whether every position is queryable: at once when so, else once it becomes so within
   * `timeoutMs` (false after that). Positions its projection applied before this process started
   * count too: the projection's group commits only what it stored.
   */
  async visible(positions: RecordPosition[], timeoutMs: number): Promise<boolean> {
    const applied = (p: RecordPosition) => this.byTopic.get(p.topic)?.covers([p]) === true;
    if (positions.every(applied) || (await this.committed(positions))) return true;
    try {
      await this.waitFor(positions, timeoutMs);
      return true;
    } catch (err) {
      if (err instanceof AppError && err.code === 'timeout') return this.committed(positions);
      throw err;
    }
  }

  /** How many records of `topic` its projection has not stored yet (its end past its group's commits). */
  async lag(topic: string): Promise<number> {
    const table = this.tableOf(topic);
    const [ends, committed] = await Promise.all([this.log.endOffsets(topic), this.log.committedOffsets(sinkGroupId(table), topic)]);
    return ends.reduce((sum, end, partition) => sum + Math.max(0, end - Math.max(0, committed[partition] ?? 0)), 0);
  }

  private async committed(positions: RecordPosition[]): Promise<boolean> {
    for (const topic of new Set(positions.map((p) => p.topic))) {
      const committed = await this.log.committedOffsets(sinkGroupId(this.tableOf(topic)), topic);
      if (!positions.every((p) => p.topic !== topic || (committed[p.partition] ?? -1) > p.offset)) return false;
    }
    return true;
  }

  private tableOf(topic: string): string {
    const table = this.catalog.find((t) => t.name === topic)?.table;
    if (!table) throw new Error(`topic ${topic} has no table in the catalog: nothing makes it visible`);
    return table;
  }

  /**
   * A read's barrier, for a table fed by writes of another actor (whose positions the reader
   * never saw): resolves once the projection of the table's topic has applied everything on
   * that topic when the call began; only the partition of `key` when given (records of one key
   * share a partition). Rejects with a 504 `timeout` after `timeoutMs`, saying the table is behind.
   */
  async waitForTable(table: string, key: string | null, timeoutMs: number): Promise<void> {
    const topic = this.catalog.find((t) => t.table === table)?.name;
    if (!topic) throw new Error(`no topic of the catalog feeds the table ${table}`);
    const ends = await this.log.endOffsets(topic);
    const partitions = key === null ? [...ends.keys()] : [partitionForKey(key, ends.length)];
    let positions = partitions.filter((p) => ends[p] > 0).map((partition) => ({ topic, partition, offset: ends[partition] - 1 }));
    if (positions.length > 0 && !this.byTopic.get(topic)?.covers(positions)) {
      // A projection started after those records were stored never sees them again (its
      // watermark starts where it resumes): its group's commits, made after each insert, say so.
      const committed = await this.log.committedOffsets(sinkGroupId(table), topic);
      positions = positions.filter((p) => (committed[p.partition] ?? -1) <= p.offset);
    }
    try {
      await this.waitFor(positions, timeoutMs);
    } catch (err) {
      if (!(err instanceof AppError && err.code === 'timeout')) throw err;
      throw new AppError('timeout', `${table} is behind its topic ${topic}: what was on it ${timeoutMs} ms ago is not all stored yet; retry`);
    }
  }

  private async pollCommits(topic: string, positions: RecordPosition[], deadline: number): Promise<void> {
    const table = this.tableOf(topic);
    for (;;) {
      const committed = await this.log.committedOffsets(sinkGroupId(table), topic);
      if (positions.every((p) => (committed[p.partition] ?? -1) > p.offset)) return;
      if (Date.now() >= deadline) {
        throw new AppError('timeout', `the write was accepted but the sink of ${topic} did not store it in time; it will become visible later`);
      }
      await new Promise((resolve) => setTimeout(resolve, COMMIT_POLL_MS));
    }
  }
}

/** How often a write polls the sink's commits when the sink runs in another process. */
const COMMIT_POLL_MS = 20;
