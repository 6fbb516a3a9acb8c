/**
 * "Integers are integers" (docs/decisions.md): every field the contract types as an integer is a
 * JSON integer wherever it appears. The test server's `request` and the SSE reader run every body
 * they parse through `nonIntegers`, so each e2e test checks every response it reads.
 */

/** Field names the contract types as integers (aggregates such as `mean_duration_ms` are not). */
const INTEGER_FIELDS = new Set([
  'duration_ms',
  'exit_code',
  'row_count',
  'status',
  'size',
  'count',
  'wall_ms',
  'seq',
  'version',
  'attempt',
  'replica',
  'total_runs',
  'scored_runs',
  'pid',
  'ppid',
]);
const isIntegerField = (key: string) => INTEGER_FIELDS.has(key) || key.endsWith('_bytes');

/** Paths (`a.b[2].duration_ms = 1.5`) of integer fields whose value is a number but not an integer. */
export function nonIntegers(value: unknown, at = ''): string[] {
  if (Array.isArray(value)) return value.flatMap((item, i) => nonIntegers(item, `${at}[${i}]`));
  if (value === null || typeof value !== 'object') return [];
  return Object.entries(value).flatMap(([key, item]) => {
    const where = at ? `${at}.${key}` : key;
    if (typeof item === 'number' && isIntegerField(key) && !Number.isSafeInteger(item)) return [`${where} = ${item}`];
    return nonIntegers(item, where);
  });
}

/** Throws naming every non-integer integer field of a parsed body. */
export function assertIntegers(value: unknown, what: string): void {
  const found = nonIntegers(value);
  if (found.length > 0) throw new Error(`${what}: integer fields that are not integers: ${found.join(', ')}`);
}
