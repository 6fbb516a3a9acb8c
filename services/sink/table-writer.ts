/**
 * Batches what becomes rows of one ClickHouse table and inserts it by size or by age
 * (SVC_SINK_FLUSH_INTERVAL). The items are the rows themselves (size: SVC_SINK_BATCH_ROWS) or
 * the log records they are made from (size in bytes: SVC_SINK_BATCH_BYTES), as the table's
 * BatchInsert says. `write` resolves only once its items are inserted, so the consumer commits
 * (and advances its watermark) after the data is in the store, never before.
 *
 * Replays never duplicate rows: every row carries the log position it came from
 * (LogPartition, LogOffset), and at start the writer reads the highest offset stored per
 * partition; records at or below it are skipped.
 */
import type { Kernel } from '../kernel/actor.ts';
import type { LogRecord } from '../kernel/log/event-log.ts';

/** How one table's batches are sized and inserted. */
export interface BatchInsert<T> {
  /** A batch is sealed once the sizes of its items reach `limit`. */
  limit: number;
  size(item: T): number;
  insert(items: T[]): Promise<void>;
}

/** One `write`: its items, the log records they came from, and its caller. */
interface Write<T> {
  items: T[];
  records: readonly LogRecord[];
  resolve: () => void;
  reject: (err: unknown) => void;
}

interface Pending<T> {
  writes: Array<Write<T>>;
  size: number;
  timer: NodeJS.Timeout | null;
  /** The flush interval has passed since its first row. */
  due: boolean;
}

/**
 * Inserts of one table that run at once: two, one per core (the chDB store has two insert
 * lanes). While both run, the next batch keeps growing (see onDue).
 */
const MAX_INSERTS_IN_FLIGHT = 2;

const emptyBatch = <T>(): Pending<T> => ({ writes: [], size: 0, timer: null, due: false });

export class TableWriter<T> {
  private highWater = new Map<number, number>();
  private pending: Pending<T> = emptyBatch();
  private inFlight = 0;
  private readonly queue: Array<Pending<T>> = [];

  constructor(
    private readonly kernel: Kernel,
    readonly table: string,
    private readonly batches: BatchInsert<T>,
    /** null: SVC_SINK_FLUSH_INTERVAL */
    private readonly flushIntervalMs: number | null = null,
  ) {}

  async start(): Promise<void> {
    const rows = await this.kernel.store.query<{ p: number; o: string }>(
      `SELECT LogPartition AS p, max(LogOffset) AS o FROM ${this.table} GROUP BY LogPartition`,
    );
    this.highWater = new Map(rows.map((r) => [Number(r.p), Number(r.o)]));
  }

  /** True when the record at this position is already in the table (a replay). */
  alreadyStored(partition: number, offset: number): boolean {
    return offset <= (this.highWater.get(partition) ?? -1);
  }

  /** Queues `items`, made from `records`, for insertion; resolves once they are inserted. */
  write(items: T[], records: readonly LogRecord[]): Promise<void> {
    if (items.length === 0) return Promise.resolve();
    const flushInterval = this.flushIntervalMs ?? this.kernel.config.sinkFlushInterval;
    return new Promise((resolve, reject) => {
      const p = this.pending;
      for (const item of items) p.size += this.batches.size(item);
      p.writes.push({ items, records, resolve, reject });
      if (p.size >= this.batches.limit) this.seal();
      else if (p.timer === null && !p.due) p.timer = setTimeout(() => this.onDue(p), flushInterval);
    });
  }

  /**
   * The pending batch is old enough to go. If an insert is running it waits for it instead:
   * under load batches grow by themselves (group commit), which is what keeps ClickHouse fast.
   */
  private onDue(p: Pending<T>): void {
    p.timer = null;
    p.due = true;
    if (this.inFlight < MAX_INSERTS_IN_FLIGHT && p === this.pending) this.seal();
  }

  /** Closes the pending batch and starts inserting it. */
  private seal(): void {
    const p = this.pending;
    if (p.timer) clearTimeout(p.timer);
    if (p.writes.length === 0) return;
    this.pending = emptyBatch();
    this.queue.push(p);
    this.drain();
  }

  private drain(): void {
    while (this.inFlight < MAX_INSERTS_IN_FLIGHT && this.queue.length > 0) {
      const batch = this.queue.shift()!;
      this.inFlight++;
      void this.insert(batch).finally(() => {
        this.inFlight--;
        if (this.pending.due) this.seal();
        this.drain();
      });
    }
  }

  /**
   * Inserts a batch. When it fails and holds several writes, each is tried on its own, so one
   * write the store refuses (a record the engine cannot read) fails only its own caller, whose
   * consumer retries and finally dead-letters it, rather than everything batched with it.
   */
  private async insert(batch: Pending<T>): Promise<void> {
    const { writes } = batch;
    try {
      await this.insertWrites(writes);
    } catch (err) {
      if (writes.length === 1) return writes[0]!.reject(err);
      for (const write of writes) {
        try {
          await this.insertWrites([write]);
        } catch (own) {
          write.reject(own);
        }
      }
    }
  }

  /** One insert of these writes' items; on success they are stored and their callers told. */
  private async insertWrites(writes: Array<Write<T>>): Promise<void> {
    const { metrics } = this.kernel;
    const items = writes.length === 1 ? writes[0]!.items : writes.flatMap((w) => w.items);
    const started = performance.now();
    await this.batches.insert(items);
    metrics.sinkBatchItems.observe({ table: this.table }, items.length);
    metrics.sinkInsertSeconds.observe({ table: this.table }, (performance.now() - started) / 1000);
    for (const write of writes) {
      for (const { partition, offset } of write.records) if (offset > (this.highWater.get(partition) ?? -1)) this.highWater.set(partition, offset);
      write.resolve();
    }
  }

  /** Inserts whatever is pending and waits for every insert in flight. */
  async flush(): Promise<void> {
    this.seal();
    while (this.inFlight > 0 || this.queue.length > 0) await new Promise((resolve) => setTimeout(resolve, 5));
  }
}
