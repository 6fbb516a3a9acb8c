/**
 * A sandbox's teardown as data: each part pushes how it stops (what the step is called, and the
 * function), and `unwind` runs them last-pushed first (e2b-dev/infra's orchestrator does the
 * same with its `cleanup.go`). A stop that fails does not stop the others; every failure is
 * returned, as `<what> failed: <message>`, and each is reported as it happens.
 *
 * Unwinding does not empty the stack: a second teardown (a destroy while a failed boot's teardown
 * still runs) runs every stop again, so each stop must be safe to run twice, and on a part that
 * never started.
 */

/** How one part stops; `reason` is why the sandbox ends (`destroyed`, `timeout`, `boot failed`, ...). */
export type Stop = (reason: string) => Promise<unknown> | unknown;

export class TeardownStack {
  private readonly entries: Array<{ what: string; stop: Stop }> = [];

  /** Adds a part's stop, to run before every stop pushed so far. */
  push(what: string, stop: Stop): void {
    this.entries.push({ what, stop });
  }

  /** What each entry is called, in the order `unwind` runs them. */
  get order(): string[] {
    return this.entries.map((entry) => entry.what).reverse();
  }

  /** Runs every stop, the last pushed first, even when one before failed; returns what failed. */
  async unwind(reason: string, onFailure: (what: string, err: unknown) => void = () => {}): Promise<string[]> {
    const failures: string[] = [];
    for (const { what, stop } of [...this.entries].reverse()) {
      try {
        await stop(reason);
      } catch (err) {
        failures.push(`${what} failed: ${(err as Error).message}`);
        onFailure(what, err);
      }
    }
    return failures;
  }
}
