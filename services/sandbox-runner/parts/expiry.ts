/**
 * A sandbox's lifetime: when it expires, the timer that destroys it then (armed at ready), and
 * a change of it (`timeout`: reset or extended, within the maximum lifetime). A step of the
 * teardown stack: the timer stops first.
 */
import { changedExpiry } from '../../domain/sandbox-lifetime.ts';
import type { TimeoutChange } from '../../domain/sandbox-ops.ts';

export class Expiry {
  expiresAt = 0;
  private timer: NodeJS.Timeout | null = null;

  constructor(
    readonly createdAt: number,
    /** SVC_SANDBOX_MAX_LIFETIME */
    private readonly maxLifetimeMs: number,
    /** Called once the sandbox's time is up. */
    private readonly onExpired: () => void,
  ) {}

  /** Sets the lifetime, from the sandbox's creation (the timer is armed at ready). */
  set(lifetimeMs: number): void {
    this.expiresAt = this.createdAt + lifetimeMs;
  }

  /**
   * `{timeout_ms}` resets the timer to that long from now; `{extend_ms}` adds to what is left.
   * Checked against the maximum lifetime before anything changes; applied once `record` (the
   * entity's write) has it, and undone when that fails.
   */
  async change(change: TimeoutChange, record: () => Promise<void>): Promise<void> {
    const previous = this.expiresAt;
    this.expiresAt = changedExpiry({ createdAt: this.createdAt, expiresAt: previous }, change, this.maxLifetimeMs);
    try {
      await record();
    } catch (err) {
      this.expiresAt = previous;
      throw err;
    }
    this.arm();
  }

  arm(): void {
    if (this.timer) clearTimeout(this.timer);
    // setTimeout overflows past 2^31 ms; re-arm in steps for long lifetimes.
    const wait = Math.min(Math.max(0, this.expiresAt - Date.now()), 2 ** 31 - 1);
    this.timer = setTimeout(() => {
      if (Date.now() >= this.expiresAt) this.onExpired();
      else this.arm();
    }, wait);
    this.timer.unref();
  }

  stop(): void {
    if (this.timer) clearTimeout(this.timer);
  }
}
