/**
 * How long a sandbox may live: every duration given for it (create's `timeout`, the timeout
 * endpoint's, a command's, a spec's) is at most SVC_SANDBOX_MAX_LIFETIME, and its expiry never
 * passes that long after its creation. The api checks before it asks a runner; the runner checks
 * a timeout change again, as two changes at once would each pass the api's view.
 */
import { badRequest } from '../kernel/errors.ts';
import { formatDuration, parseDuration } from '../kernel/duration.ts';

/** Why `ms` is too long for a sandbox, or null. */
export function lifetimeProblem(ms: number, maxMs: number): string | null {
  return ms > maxMs ? `must be at most ${formatDuration(maxMs)}, the maximum sandbox lifetime (SVC_SANDBOX_MAX_LIFETIME)` : null;
}

/** A duration of a request: parsed, longer than 0, at most the maximum lifetime; else a 400 naming `field`. */
export function sandboxDuration(value: unknown, field: string, maxMs: number): number {
  let ms: number;
  try {
    if (typeof value !== 'string' && typeof value !== 'number') throw new Error('must be a duration such as 30s or 10m');
    ms = parseDuration(value);
  } catch (err) {
    throw badRequest(field, (err as Error).message);
  }
  if (ms <= 0) throw badRequest(field, 'must be longer than 0');
  const problem = lifetimeProblem(ms, maxMs);
  if (problem) throw badRequest(field, problem);
  return ms;
}

/**
 * The expiry a timeout change gives: `timeout_ms` from now, or `extend_ms` past the current
 * expiry; a 400 naming the field when it would pass the maximum lifetime after the creation.
 */
export function changedExpiry(
  sandbox: { createdAt: number; expiresAt: number },
  change: { timeout_ms?: unknown; extend_ms?: unknown },
  maxMs: number,
  now = Date.now(),
): number {
  const field = change.timeout_ms !== undefined && change.timeout_ms !== null ? 'timeout' : 'extend';
  const ms = field === 'timeout' ? change.timeout_ms : change.extend_ms;
  if (typeof ms !== 'number' || !Number.isSafeInteger(ms) || ms <= 0) throw badRequest(field, 'must be a duration longer than 0');
  const next = field === 'timeout' ? now + ms : sandbox.expiresAt + ms;
  const latest = sandbox.createdAt + maxMs;
  if (next > latest) {
    throw badRequest(
      field,
      `would keep the sandbox past ${new Date(latest).toISOString()}, ${formatDuration(maxMs)} after the sandbox was created (SVC_SANDBOX_MAX_LIFETIME)`,
    );
  }
  return next;
}
