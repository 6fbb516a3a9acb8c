/**
 * Java-compatible murmur2, the hash Kafka's (and kafkajs') default partitioner uses, so a key
 * lands on the same partition whichever backend or client appended it.
 */

const SEED = 0x9747b28c;
const M = 0x5bd1e995;

/** murmur2 of the key's UTF-8 bytes (or of the bytes themselves), as a signed 32-bit int. */
export function murmur2(key: string | Buffer): number {
  const data = typeof key === 'string' ? Buffer.from(key, 'utf8') : key;
  const length = data.length;
  let h = (SEED ^ length) | 0;
  const length4 = length >>> 2;
  for (let i = 0; i < length4; i++) {
    const i4 = i * 4;
    let k = data[i4] | (data[i4 + 1] << 8) | (data[i4 + 2] << 16) | (data[i4 + 3] << 24);
    k = Math.imul(k, M);
    k ^= k >>> 24;
    k = Math.imul(k, M);
    h = Math.imul(h, M);
    h ^= k;
  }
  const tail = length & ~3;
  const rest = length % 4;
  if (rest === 3) h ^= data[tail + 2] << 16;
  if (rest >= 2) h ^= data[tail + 1] << 8;
  if (rest >= 1) {
    h ^= data[tail];
    h = Math.imul(h, M);
  }
  h ^= h >>> 13;
  h = Math.imul(h, M);
  h ^= h >>> 15;
  return h | 0;
}

/** Kafka's `toPositive`: masks the sign bit (not the absolute value). */
function toPositive(x: number): number {
  return x & 0x7fffffff;
}

/** The partition of a non-null key, as kafkajs' DefaultPartitioner and the Java client pick it. */
export function partitionForKey(key: string | Buffer, partitions: number): number {
  return toPositive(murmur2(key)) % partitions;
}
