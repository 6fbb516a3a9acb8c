import ms from 'ms';

/**
 * Durations in settings, spec documents and request bodies: strings such as `30s`, `5m`, `1h`,
 * `2d` (parsed by `ms`), or a bare integer, which means seconds (docs/decisions.md,
 * "Durations"). Returns ms.
 */
export function parseDuration(input: string | number): number {
  if (typeof input === 'number') {
    if (!Number.isInteger(input) || input < 0) throw new Error(`expected a duration such as 30s, 5m or an integer of seconds, got ${input}`);
    return input * 1000;
  }
  const raw = input.trim();
  if (/^\d+$/.test(raw)) return Number(raw) * 1000;
  const value = /^\d+(\.\d+)?\s*[a-z]+$/i.test(raw) ? ms(raw as ms.StringValue) : undefined;
  if (typeof value !== 'number' || !Number.isFinite(value) || value < 0) {
    throw new Error(`expected a duration such as 30s, 5m, 1h or an integer of seconds, got "${input}"`);
  }
  return value;
}

/** Milliseconds in the largest unit that divides them evenly (`90m`, `1d`), for messages. */
export function formatDuration(value: number): string {
  for (const [unit, size] of [['d', 86_400_000], ['h', 3_600_000], ['m', 60_000], ['s', 1000]] as const) {
    if (value % size === 0) return `${value / size}${unit}`;
  }
  return `${value}ms`;
}
