/**
 * Drives each firing's notification through its states on svc.alert-firings:
 *
 *   pending -> delivering -> delivered | failed
 *
 * `delivering` is recorded before the first call goes out, so a firing found `delivering` at a
 * start was interrupted by a stop or a crash: its attempt in flight is recorded as `interrupted`
 * (its fate unknown: the receiver may have it) and it is delivered again, each with the same
 * firing id (`X-Svc-Firing-Id`, `Idempotency-Key`) so a receiver can drop a repeat; after more
 * interruptions than SVC_WEBHOOK_RETRIES it is recorded failed. A firing is never left without
 * an outcome: every one recorded pending is delivered, or recorded failed saying why.
 */
import type { Kernel } from '../kernel/actor.ts';
import { newEventId } from '../kernel/ids.ts';
import type { NotificationOutcome } from '../domain/alerts.ts';
import type { AlertFired } from '../domain/events/alert-events.ts';
import { DeliveryStopped, type Notifiers } from './notifiers.ts';

/** The firing's next state: a new event, its ts strictly after the last (the table keeps the latest). */
export function nextState(f: AlertFired, change: Partial<AlertFired>): AlertFired {
  return { ...f, ...change, event_id: newEventId(), ts: Math.max(Date.now(), f.ts + 1) };
}

export class Deliveries {
  private readonly running = new Map<string, Promise<void>>();
  private readonly stopping = new AbortController();

  constructor(
    private readonly kernel: Kernel,
    private readonly notifiers: Notifiers,
    /** Appends states of firings; resolves once the alerter's view shows them. */
    private readonly record: (firings: readonly AlertFired[]) => Promise<void>,
  ) {}

  /**
   * Delivers each firing (pending, or interrupted while delivering) unless its delivery is
   * already under way here; their `delivering` states are recorded together, then the calls go
   * out at once.
   */
  start(firings: readonly AlertFired[]): void {
    const todo = firings.filter((f) => !this.stopping.signal.aborted && !this.running.has(f.firing_id));
    if (todo.length === 0) return;
    const done = this.runAll(todo).catch((err) =>
      this.kernel.logger.error(
        { firings: todo.map((f) => f.firing_id), err: (err as Error).message },
        'alert deliveries could not be recorded; they are resumed at the next start',
      ),
    );
    for (const f of todo) this.running.set(f.firing_id, done);
    void done.finally(() => {
      for (const f of todo) if (this.running.get(f.firing_id) === done) this.running.delete(f.firing_id);
    });
  }

  /** How many deliveries are under way (for tests and the bench). */
  inFlight(): number {
    return this.running.size;
  }

  /** Lets deliveries under way finish for up to `graceMs`, then abandons them (they are resumed at the next start). */
  async stop(graceMs: number): Promise<void> {
    const all = () => Promise.allSettled([...this.running.values()]);
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([all(), new Promise((resolve) => (timer = setTimeout(resolve, graceMs)))]);
    clearTimeout(timer);
    this.stopping.abort();
    await all();
  }

  private async runAll(firings: readonly AlertFired[]): Promise<void> {
    const prepared = firings.map((f) => this.prepare(f));
    await this.record(prepared.map((p) => p.state));
    await Promise.all(prepared.filter((p) => p.state.status === 'delivering').map((p) => this.deliver(p.state, p.outcome)));
  }

  /** The firing's `delivering` state, or `failed` when it was interrupted too often. */
  private prepare(f: AlertFired): { state: AlertFired; outcome: NotificationOutcome } {
    const { logger, config } = this.kernel;
    let outcome = (JSON.parse(f.notifications) as NotificationOutcome[])[0]!;
    let interruptions = f.interruptions;
    if (f.status === 'delivering') {
      interruptions++;
      outcome = {
        ...outcome,
        attempts: [
          ...outcome.attempts,
          {
            at: new Date(f.ts).toISOString(),
            outcome: 'interrupted',
            error: 'the alerter stopped while this notification was being delivered; its fate is unknown',
            duration_ms: 0,
          },
        ],
      };
      if (interruptions > config.webhookRetries) {
        outcome = { ...outcome, status: 'failed', error: `the alerter stopped ${interruptions} times while delivering it` };
        return { state: nextState(f, { status: 'failed', interruptions, notifications: JSON.stringify([outcome]) }), outcome };
      }
      logger.warn({ firing_id: f.firing_id, rule_id: f.rule_id, interruptions }, 'resuming an alert delivery the alerter stopped during');
    }
    return { state: nextState(f, { status: 'delivering', interruptions, notifications: JSON.stringify([outcome]) }), outcome };
  }

  private async deliver(current: AlertFired, previous: NotificationOutcome): Promise<void> {
    let outcome: NotificationOutcome;
    try {
      outcome = await this.notifiers.deliver(current, previous, this.stopping.signal);
    } catch (err) {
      if (err instanceof DeliveryStopped) return;
      throw err;
    }
    await this.record([nextState(current, { status: outcome.status, notifications: JSON.stringify([outcome]) })]);
    const { logger } = this.kernel;
    const where = {
      firing_id: current.firing_id,
      rule_id: current.rule_id,
      experiment_id: current.experiment_id,
      tenant: current.tenant,
      notify: current.notify,
      target: current.target,
      attempts: outcome.attempts.length,
    };
    if (outcome.status === 'delivered') logger.info(where, 'alert delivered');
    else logger.warn({ ...where, err: outcome.error }, 'alert delivery failed');
  }
}
