import { AppError } from '../../kernel/errors.ts';

/**
 * Token buckets per API key: `rate` tokens per second, bursts up to one second's worth.
 * A rate of 0 disables the limit. Refused calls get 429 with Retry-After in whole seconds.
 */
export class RateLimiter {
  private readonly buckets = new Map<string, { tokens: number; at: number }>();

  constructor(
    private readonly rate: number,
    private readonly what: string,
  ) {}

  take(keyId: string, cost = 1): void {
    if (this.rate === 0) return;
    const now = performance.now();
    const capacity = Math.max(this.rate, cost);
    const bucket = this.buckets.get(keyId) ?? { tokens: capacity, at: now };
    bucket.tokens = Math.min(capacity, bucket.tokens + ((now - bucket.at) / 1000) * this.rate);
    bucket.at = now;
    this.buckets.set(keyId, bucket);
    if (bucket.tokens >= cost) {
      bucket.tokens -= cost;
      return;
    }
    const retryAfter = Math.max(1, Math.ceil((cost - bucket.tokens) / this.rate));
    throw new AppError('rate_limited', `rate limit exceeded: ${this.rate} ${this.what} per second per API key`, { retryAfter });
  }
}
