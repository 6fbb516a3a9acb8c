/**
 * fsync scheduling for the embedded log. `always` is a group commit: every caller that asks
 * for durability in the same tick, or while an fsync round is in flight, shares the next round,
 * and is resolved only once the round that covers its writes has finished.
 */
import { fsync, fsyncSync } from 'node:fs';

export interface SyncTarget {
  fd: number;
}

export class SyncScheduler {
  private dirty = new Set<SyncTarget>();
  private waiters: Array<{ resolve: () => void; reject: (e: unknown) => void }> = [];
  private running = false;
  private scheduled = false;
  private idleWaiters: Array<() => void> = [];
  rounds = 0;

  markDirty(target: SyncTarget): void {
    this.dirty.add(target);
  }

  /** Forget a target whose fd is about to be closed (its data was synced some other way). */
  forget(target: SyncTarget): void {
    this.dirty.delete(target);
  }

  get hasDirty(): boolean {
    return this.dirty.size > 0;
  }

  /** Resolves after an fsync round that started after this call (so covering every write before it). */
  requestSync(): Promise<void> {
    return new Promise((resolve, reject) => {
      this.waiters.push({ resolve, reject });
      this.schedule();
    });
  }

  /** Starts a round if anything is dirty (for the interval policy); nobody waits for it. */
  kick(): void {
    if (this.dirty.size > 0) this.schedule();
  }

  /** Resolves when no round is in flight (call before closing an fd a round might use). */
  idle(): Promise<void> {
    if (!this.running && !this.scheduled) return Promise.resolve();
    return new Promise((resolve) => this.idleWaiters.push(resolve));
  }

  /** Synchronous fsync of everything dirty (close, segment roll). Only when idle. */
  syncAllNow(): void {
    for (const t of this.dirty) fsyncSync(t.fd);
    this.dirty.clear();
  }

  private schedule(): void {
    if (this.running || this.scheduled) return;
    this.scheduled = true;
    setImmediate(() => {
      this.scheduled = false;
      void this.round();
    });
  }

  private async round(): Promise<void> {
    this.running = true;
    this.rounds++;
    const targets = [...this.dirty];
    this.dirty.clear();
    const waiters = this.waiters;
    this.waiters = [];
    let error: unknown = null;
    await Promise.all(
      targets.map(
        (t) =>
          new Promise<void>((resolve) =>
            fsync(t.fd, (err) => {
              if (err && error === null) error = err;
              resolve();
            }),
          ),
      ),
    );
    this.running = false;
    for (const w of waiters) {
      if (error === null) w.resolve();
      else w.reject(error);
    }
    // Idle waiters run (as microtasks) before the next round can start (setImmediate).
    const idle = this.idleWaiters;
    this.idleWaiters = [];
    for (const r of idle) r();
    if (this.waiters.length > 0) this.schedule();
  }
}
