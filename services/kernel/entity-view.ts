/**
 * A per-process, in-memory view of a compacted entity topic (tenants, API keys, idempotency
 * records, ...): rebuilt from the beginning on every start, then kept current by following the
 * tail. It is the "owning actor's state" that live reads are served from; a write awaits
 * `waitFor` of its positions so the next read in this process sees it.
 *
 * `EntityCatalog` is the base of a class that serves one such topic: it owns the view's start,
 * stop and read-your-writes appends, so a subclass holds only its indexes and domain methods.
 */
import { publish, subscribe, type Delivered, type Kernel, type OutgoingEvent } from './actor.ts';
import { AppError, notFound } from './errors.ts';
import type { Consumer, RecordPosition } from './log/event-log.ts';
import { Watermark } from './watermark.ts';

let viewCount = 0;

/** Called after the latest value of a key changed (null: removed), to keep an index beside the view. */
type ChangeHook<T> = (previous: T | undefined, next: T | null) => void;

/** Folds one event into the map of entities by key. */
type Fold<T> = (entities: Map<string, T>, event: Delivered<T>) => void;

/** The default fold: the latest value per record key, a tombstone removes it. */
export function latestPerKey<T>(onChange?: ChangeHook<T>): Fold<T> {
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
    private readonly apply: Fold<T> = latestPerKey<T>(),
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

  /** Appends to the view's topic; resolves with the positions once this view shows them. */
  async append(kernel: Kernel, events: OutgoingEvent[]): Promise<RecordPosition[]> {
    const positions = await publish(kernel, this.topic, events);
    await this.waitFor(positions, kernel.config.replyTimeout);
    return positions;
  }

  async stop(): Promise<void> {
    await this.consumer?.stop();
    this.consumer = null;
  }
}

interface Waiter<T> {
  id: string;
  reached: (entity: T) => boolean;
  resolve: (entity: T | null) => void;
}

/**
 * Serves one entity topic from an EntityView. A subclass keeps an index beside the view by
 * overriding `changed` (called by the default latest-per-key fold) or replaces the fold itself.
 */
export abstract class EntityCatalog<T extends { tenant: string }> {
  protected readonly view: EntityView<T>;
  private readonly keepLatest = latestPerKey<T>((previous, next) => this.changed(previous, next));
  private readonly waiters = new Set<Waiter<T>>();

  protected constructor(
    protected readonly kernel: Kernel,
    topic: string,
  ) {
    this.view = new EntityView<T>(topic, (entities, event) => {
      this.fold(entities, event);
      this.wake(event.record.key);
    });
  }

  /** Resolves once the view has caught up with the topic. */
  start(): Promise<void> {
    return this.view.start(this.kernel);
  }

  stop(): Promise<void> {
    return this.view.stop();
  }

  /** Folds one event into the view; the default keeps the latest value per key and calls `changed`. */
  protected fold(entities: Map<string, T>, event: Delivered<T>): void {
    this.keepLatest(entities, event);
  }

  /** The latest value of a key changed (null: removed). */
  protected changed(_previous: T | undefined, _next: T | null): void {}

  /** Appends to the topic; on return the next read in this process sees the events. */
  protected append(events: OutgoingEvent[]): Promise<RecordPosition[]> {
    return this.view.append(this.kernel, events);
  }

  /**
   * The entity `id` of `tenant`: 404 when unknown (or `gone`), 403 when another tenant's
   * (server-made ids are global: docs/decisions.md, "Names and ids").
   */
  protected ownedBy(tenant: string, id: string, what: string, gone: (entity: T) => boolean = () => false): T {
    const entity = this.view.entities.get(id);
    if (!entity || gone(entity)) throw notFound(what, id);
    if (entity.tenant !== tenant) throw new AppError('forbidden', `${what} ${id} belongs to another tenant`);
    return entity;
  }

  /**
   * Resolves with the entity `id` once the view shows it `reached` (a state another party
   * writes), or with null after the reply timeout.
   */
  protected waitUntil(id: string, reached: (entity: T) => boolean): Promise<T | null> {
    const current = this.view.entities.get(id);
    if (current !== undefined && reached(current)) return Promise.resolve(current);
    return new Promise((resolve) => {
      const waiter: Waiter<T> = {
        id,
        reached,
        resolve: (entity) => {
          clearTimeout(timer);
          this.waiters.delete(waiter);
          resolve(entity);
        },
      };
      const timer = setTimeout(() => waiter.resolve(null), this.kernel.config.replyTimeout);
      this.waiters.add(waiter);
    });
  }

  private wake(key: string | null): void {
    if (this.waiters.size === 0 || key === null) return;
    const entity = this.view.entities.get(key);
    if (entity === undefined) return;
    for (const waiter of this.waiters) if (waiter.id === key && waiter.reached(entity)) waiter.resolve(entity);
  }
}
