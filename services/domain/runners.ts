/**
 * Sandbox runners' liveness, from their heartbeats (svc.runners): a runner is live while it beats
 * and has not said it stops; one silent for longer than the dead-after setting is dead, and what
 * it held is gone (its sandboxes end in error, its runs are dispatched again). Pure.
 */
import type { RunnerHeartbeat } from './events/runner-events.ts';

/** Whether the runner's last heartbeat says it is alive at `now`. */
export function isLive(beat: RunnerHeartbeat, now: number, deadAfterMs: number): boolean {
  return !beat.stopping && now - beat.ts <= deadAfterMs;
}

/** When a runner that is not live stopped being so: its last word, or its last beat plus the grace. */
export function goneAt(beat: RunnerHeartbeat, deadAfterMs: number): number {
  return beat.stopping ? beat.ts : beat.ts + deadAfterMs;
}

/**
 * The live runner a new sandbox goes to: among those whose runtime works and with a free slot,
 * the one with the most free slots (no limit counts as most), fewest sandboxes breaking ties.
 */
export function pickRunner(beats: Iterable<RunnerHeartbeat>, now: number, deadAfterMs: number): RunnerHeartbeat | null {
  const free = (b: RunnerHeartbeat) => (b.capacity === 0 ? Infinity : b.capacity - b.sandboxes);
  let best: RunnerHeartbeat | null = null;
  for (const beat of beats) {
    if (!isLive(beat, now, deadAfterMs) || !beat.available || free(beat) <= 0) continue;
    if (!best || free(beat) > free(best) || (free(beat) === free(best) && beat.sandboxes < best.sandboxes)) best = beat;
  }
  return best;
}
