/**
 * Batches rows for one ClickHouse table and inserts them by size (SVC_SINK_BATCH_ROWS) or by
 * age (SVC_SINK_FLUSH_INTERVAL). `write` resolves only once its rows are inserted, so the
 * consumer commits (and advances its watermark) after the data is in the store, never before.
 *
 * Replays never duplicate rows: every row carries the log position it came from
 * (LogPartition, LogOffset), and at start the writer reads the highest offset stored per
 * partition; records at or below it are skipped.
 */
import type { Kernel } from '../kernel/actor.ts';

type Row = Record<string, unknown>;

interface Pending {
  rows: Row[];
  waiters: Array<{ resolve: () => void; reject: (err: unknown) => void }>;
  timer: NodeJS.Timeout | null;
  /** The flush interval has passed since its first row. */
  due: boolean;
}

/**
 * Inserts of one table that run at once: two, one per core (the chDB store has two insert
 * lanes). While both run, the next batch keeps growing (see onDue).
 */
const MAX_INSERTS_IN_FLIGHT = 2;

export class TableWriter {
  private highWater = new Map<number, number>();
  private pending: Pending = { rows: [], waiters: [], timer: null, due: false };
  private inFlight = 0;
  private readonly queue: Pending[] = [];

  constructor(
    private readonly kernel: Kernel,
    readonly table: string,
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

  write(rows: Row[]): Promise<void> {
    if (rows.length === 0) return Promise.resolve();
    const { sinkBatchRows } = this.kernel.config;
    const flushInterval = this.flushIntervalMs ?? this.kernel.config.sinkFlushInterval;
    return new Promise((resolve, reject) => {
      const p = this.pending;
      for (const row of rows) p.rows.push(row);
      p.waiters.push({ resolve, reject });
      if (p.rows.length >= sinkBatchRows) this.seal();
      else if (p.timer === null && !p.due) p.timer = setTimeout(() => this.onDue(p), flushInterval);
    });
  }

  /**
   * The pending batch is old enough to go. If an insert is running it waits for it instead:
   * under load batches grow by themselves (group commit), which is what keeps ClickHouse fast.
   */
  private onDue(p: Pending): void {
    p.timer = null;
    p.due = true;
    if (this.inFlight < MAX_INSERTS_IN_FLIGHT && p === this.pending) this.seal();
  }

  /** Closes the pending batch and starts inserting it. */
  private seal(): void {
    const p = this.pending;
    if (p.timer) clearTimeout(p.timer);
    if (p.rows.length === 0) return;
    this.pending = { rows: [], waiters: [], timer: null, due: false };
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

  private async insert(batch: Pending): Promise<void> {
    const { metrics, store } = this.kernel;
    const started = performance.now();
    try {
      await store.insert(this.table, batch.rows);
      metrics.sinkBatchRows.observe({ table: this.table }, batch.rows.length);
      metrics.sinkInsertSeconds.observe({ table: this.table }, (performance.now() - started) / 1000);
      for (const row of batch.rows) {
        const partition = row.LogPartition as number;
        const offset = row.LogOffset as number;
        if (offset > (this.highWater.get(partition) ?? -1)) this.highWater.set(partition, offset);
      }
      for (const w of batch.waiters) w.resolve();
    } catch (err) {
      for (const w of batch.waiters) w.reject(err);
    }
  }

  /** Inserts whatever is pending and waits for every insert in flight. */
  async flush(): Promise<void> {
    this.seal();
    while (this.inFlight > 0 || this.queue.length > 0) await new Promise((resolve) => setTimeout(resolve, 5));
  }
}
