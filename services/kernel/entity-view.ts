/**
 * A per-process, in-memory view of a compacted entity topic (tenants, API keys, idempotency
 * records, ...): rebuilt from the beginning on every start, then kept current by following the
 * tail. It is the "owning actor's state" that live reads are served from; a write awaits
 * `waitFor` of its positions so the next read in this process sees it.
 */
import { subscribe, type Delivered, type Kernel } from './actor.ts';
import type { Consumer, RecordPosition } from './log/event-log.ts';
import { Watermark } from './watermark.ts';

let viewCount = 0;

/** Called after the latest value of a key changed (null: removed), to keep an index beside the view. */
export type ChangeHook<T> = (previous: T | undefined, next: T | null) => void;

/** The default fold: the latest value per record key, a tombstone removes it. */
export function latestPerKey<T>(onChange?: ChangeHook<T>): (entities: Map<string, T>, event: Delivered<T>) => void {
  return (entities, { record, value }) => {
    if (record.key === null) return;
    const previous = entities.get(record.key);
    if (value === null) entities.delete(record.key);
    else entities.set(record.key, value);
    onChange?.(previous, value);
  };
}

export class EntityView<T> {
  readonly entities = new Map<string, T>();
  private readonly watermark: Watermark;
  private consumer: Consumer | null = null;

  constructor(
    private readonly topic: string,
    /** Folds one event into the map; the default keeps the latest value per record key. */
    private readonly apply: (entities: Map<string, T>, event: Delivered<T>) => void = latestPerKey<T>(),
  ) {
    this.watermark = new Watermark(`the ${topic} view`);
  }

  /** Resolves once the view has caught up with everything appended before the call. */
  async start(kernel: Kernel): Promise<void> {
    const ends = await kernel.log.endOffsets(this.topic);
    this.consumer = await subscribe<T>(kernel, {
      // Its own group: two views of one topic in a process (the api's and a runner's) must each
      // see every partition, not split them as members of one group.
      groupId: `view.${this.topic}.${kernel.instanceId}.${++viewCount}`,
      topics: [this.topic],
      fromBeginning: true,
      commit: false,
      watermark: this.watermark,
      handle: async (events) => {
        for (const event of events) this.apply(this.entities, event);
      },
    });
    const caughtUp = ends.flatMap((end, partition) => (end > 0 ? [{ topic: this.topic, partition, offset: end - 1 }] : []));
    await this.watermark.waitFor(caughtUp, kernel.config.replyTimeout);
  }

  waitFor(positions: RecordPosition[], timeoutMs: number): Promise<void> {
    return this.watermark.waitFor(positions, timeoutMs);
  }

  async stop(): Promise<void> {
    await this.consumer?.stop();
    this.consumer = null;
  }
}
