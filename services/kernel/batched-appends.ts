/**
 * Appends to one topic in the order of the calls without waiting for each: what is pushed while
 * an append runs goes into the next one, so a burst is one append (one fsync, one Kafka request)
 * and a slow log makes larger appends rather than a queue of small ones. Items become records
 * only when their append starts (`toEvents`), so a caller can merge what arrived meanwhile.
 * One instance per process and topic keeps the order of everything pushed to it.
 */
import { publish, type Kernel, type OutgoingEvent } from './actor.ts';

export class BatchedAppends<Item> {
  /** the batch that takes pushes until its append starts */
  private open: { items: Item[]; done: Promise<void> } | null = null;
  private last: Promise<void> = Promise.resolve();

  constructor(
    private readonly kernel: Kernel,
    private readonly topic: string,
    private readonly toEvents: (items: Item[]) => OutgoingEvent[],
  ) {}

  /** Resolves once every append started or queued so far has ended (failed or not). */
  idle(): Promise<void> {
    return this.last;
  }

  /** Queues `item`; resolves once the append that holds it is on the log, rejects when that append failed. */
  push(item: Item): Promise<void> {
    if (!this.open) {
      const items: Item[] = [];
      const done = this.last.then(async () => {
        this.open = null;
        await publish(this.kernel, this.topic, this.toEvents(items));
      });
      this.open = { items, done };
      this.last = done.catch(() => {});
    }
    this.open.items.push(item);
    return this.open.done;
  }
}
