/** Sizes as people write them, in specs and settings alike. */

const SIZE = /^(\d+(?:\.\d+)?)\s*(b|k|kb|ki|kib|m|mb|mi|mib|g|gb|gi|gib)?$/i;
const UNITS: Record<string, number> = {
  b: 1,
  k: 1e3,
  kb: 1e3,
  ki: 1024,
  kib: 1024,
  m: 1e6,
  mb: 1e6,
  mi: 1024 ** 2,
  mib: 1024 ** 2,
  g: 1e9,
  gb: 1e9,
  gi: 1024 ** 3,
  gib: 1024 ** 3,
};

/** Sizes: an integer of bytes, or `512Mi`, `1Gi`, `500MB`, `2G`. */
export function parseSize(value: unknown): number {
  if (typeof value === 'number' && Number.isInteger(value) && value > 0) return value;
  const m = typeof value === 'string' ? SIZE.exec(value.trim()) : null;
  if (!m) throw new Error('must be a size such as 512Mi, 1Gi, 500MB or a number of bytes');
  const bytes = Math.floor(Number(m[1]) * UNITS[(m[2] ?? 'b').toLowerCase()]);
  if (bytes <= 0) throw new Error('must be more than 0 bytes');
  return bytes;
}
