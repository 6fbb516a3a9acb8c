import ms from 'ms';

/**
 * The one parser of durations; two grammars, because what they read was written for different
 * readers:
 *  - `lenient` (settings, spec documents, request bodies; docs/decisions.md, "Durations"): strings
 *    such as `30s`, `5m`, `1.5h`, `2d` (parsed by `ms`), or a bare integer, which means seconds;
 *  - `whole` (the topic catalog's retention and flush interval, alert windows): a whole number
 *    and one of the units below (`7d`, `250ms`), nothing else.
 */
export type DurationGrammar = 'lenient' | 'whole';

/** The units of the `whole` grammar, in ms. */
const UNIT_MS = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000, w: 604_800_000 } as const;
const WHOLE = /^(\d+)\s*(ms|s|m|h|d|w)$/;

/** A duration in ms; throws an Error saying what the grammar expects. */
export function parseDuration(input: string | number, grammar: DurationGrammar = 'lenient'): number {
  if (grammar === 'whole') return parseWhole(input);
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

function parseWhole(input: string | number): number {
  const match = typeof input === 'string' ? WHOLE.exec(input.trim()) : null;
  if (!match) throw new Error(`expected a whole number and a unit (ms, s, m, h, d or w) such as 7d, got ${JSON.stringify(input)}`);
  return Number(match[1]) * UNIT_MS[match[2] as keyof typeof UNIT_MS];
}

/**
 * Milliseconds in the largest unit that divides them evenly (`90m`, `1d`), for messages; weeks
 * only when `largest` is `w` (an alert window's `2w`).
 */
export function formatDuration(value: number, largest: 'd' | 'w' = 'd'): string {
  const units = (['w', 'd', 'h', 'm', 's'] as const).filter((unit) => unit !== 'w' || largest === 'w');
  for (const unit of units) {
    if (value % UNIT_MS[unit] === 0) return `${value / UNIT_MS[unit]}${unit}`;
  }
  return `${value}ms`;
}
