/**
 * A run's status in an experiment, decided from the facts the aggregator read of it (its
 * dispatches, the runners' reports, its scores), whatever order they were read in:
 *   scored                         -> done (counted once, whatever the number of attempts)
 *   finished                       -> waiting for its score (its slot is free)
 *   never dispatched               -> due, attempt 1
 *   rejected, lost, lease expired  -> due again (attempt + 1)
 *   otherwise                      -> in flight
 * "Lost": the runner that started its latest attempt restarted or died after it started (or, not
 * yet started, any runner did after its dispatch). "Lease expired": the attempt has been in flight
 * longer than the lease (the run's lifetime plus slack), so a run within its lifetime is never
 * dispatched again; a run executed twice is still counted once.
 */

/** What was read of one run. */
export interface RunRecord {
  /** attempt -> when dispatched */
  dispatched: ReadonlyMap<number, number>;
  /** attempt -> who started it, when */
  started: ReadonlyMap<number, { runner: string; ts: number }>;
  rejected: ReadonlySet<number>;
  finished: boolean;
  scored: boolean;
}

/** What the aggregator observes of the world when it decides. */
export interface Observed {
  now: number;
  /** How long an attempt may be in flight before it is dispatched again. */
  leaseMs: number;
  /** runner id -> when it last (re)started, or died */
  runnerStarts: ReadonlyMap<string, number>;
  /** The latest of runnerStarts (0 when none): what a run not yet started is lost to. */
  latestRunnerStart: number;
}

export type DueReason = 'new' | 'rejected' | 'lost' | 'lease_expired';

export type RunStatus =
  | { kind: 'scored' }
  | { kind: 'finished' }
  | { kind: 'in_flight'; attempt: number }
  | { kind: 'due'; attempt: number; reason: DueReason };

/** The status of a run (null: nothing read of it yet). */
export function runStatus(run: RunRecord | null, observed: Observed): RunStatus {
  if (run?.scored) return { kind: 'scored' };
  if (run?.finished) return { kind: 'finished' };
  const attempt = run && run.dispatched.size > 0 ? Math.max(...run.dispatched.keys()) : 0;
  if (run === null || attempt === 0) return { kind: 'due', attempt: 1, reason: 'new' };
  const reason = againReason(run, attempt, observed);
  return reason === null ? { kind: 'in_flight', attempt } : { kind: 'due', attempt: attempt + 1, reason };
}

/** Why the latest attempt must be dispatched again, or null while it is in flight. */
function againReason(run: RunRecord, attempt: number, { now, leaseMs, runnerStarts, latestRunnerStart }: Observed): DueReason | null {
  const dispatchedAt = run.dispatched.get(attempt)!;
  const started = run.started.get(attempt);
  const lost = started ? (runnerStarts.get(started.runner) ?? 0) > started.ts : latestRunnerStart > dispatchedAt;
  if (run.rejected.has(attempt)) return 'rejected';
  if (lost) return 'lost';
  if (now - dispatchedAt > leaseMs) return 'lease_expired';
  return null;
}
