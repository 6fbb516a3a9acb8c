/**
 * Start-up against what a process depends on (Kafka, the schema registry, ClickHouse). The
 * processes of a distributed deployment start in any order, so one that cannot reach a
 * dependency yet says which and tries again with backoff, rather than exiting. Only failures
 * that may pass are retried (unreachable, busy, rate limited); any other (bad credentials, an
 * incompatible schema) fails the start at once, as retrying would not change it.
 */
import type { Logger } from './logger.ts';

/** Network failures of Node and of kafkajs' connections: the other side is not there (yet). */
const NETWORK_CODES = new Set([
  'ECONNREFUSED',
  'ECONNRESET',
  'ETIMEDOUT',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EPIPE',
  'UND_ERR_CONNECT_TIMEOUT',
  'UND_ERR_SOCKET',
]);
const FIRST_DELAY_MS = 500;
const MAX_DELAY_MS = 10_000;

/**
 * True when the error, or one it wraps (`cause`, kafkajs' `originalError`), says the call may
 * succeed later: marked retriable (AppError, kafkajs) or a network failure.
 */
export function mayPass(err: unknown): boolean {
  for (let e = err, depth = 0; e && typeof e === 'object' && depth < 10; depth++) {
    const { retriable, code, cause, originalError } = e as { retriable?: unknown; code?: unknown; cause?: unknown; originalError?: unknown };
    if (retriable === true || (typeof code === 'string' && NETWORK_CODES.has(code))) return true;
    e = cause ?? originalError;
  }
  return false;
}

/**
 * Runs `call` until it succeeds; a failure that may pass is logged as a warning naming the
 * dependency and retried after a backoff (0.5 s doubling to 10 s), for as long as it takes.
 */
export async function whenReachable<T>(dependency: string, logger: Logger, call: () => Promise<T>): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      const result = await call();
      if (attempt > 1) logger.info({ dependency, attempts: attempt }, `${dependency} is reachable`);
      return result;
    } catch (err) {
      if (!mayPass(err)) throw err;
      const retryInMs = Math.min(MAX_DELAY_MS, FIRST_DELAY_MS * 2 ** (attempt - 1));
      logger.warn({ dependency, attempt, retry_in_ms: retryInMs, err: (err as Error).message }, `cannot reach ${dependency} yet; retrying`);
      await new Promise((resolve) => setTimeout(resolve, retryInMs));
    }
  }
}
