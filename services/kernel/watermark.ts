import { AppError } from './errors.ts';
import type { RecordPosition } from './log/event-log.ts';

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
 * Where a write waits to become readable: the projections of this process register the
 * watermark of each topic they materialise (the sink registers the store tables' topics).
 */
export class Visibility {
  private readonly byTopic = new Map<string, Watermark>();

  register(topic: string, watermark: Watermark): void {
    this.byTopic.set(topic, watermark);
  }

  /** Resolves once the projection of every position's topic has applied it. */
  async waitFor(positions: RecordPosition[], timeoutMs: number): Promise<void> {
    const topics = new Set(positions.map((p) => p.topic));
    for (const topic of topics) {
      const watermark = this.byTopic.get(topic);
      if (!watermark) {
        throw new AppError('unavailable', `no projection of ${topic} runs in this process; run the sink beside the api`);
      }
      await watermark.waitFor(positions.filter((p) => p.topic === topic), timeoutMs);
    }
  }
}
