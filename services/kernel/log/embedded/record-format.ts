/**
 * On-disk record format of the embedded log. Every record is self-describing and checksummed:
 *
 *   crc32     u32   CRC-32 (zlib polynomial) of every byte after this field
 *   length    u32   bytes after this field
 *   offset    u32 hi, u32 lo
 *   timestamp f64   milliseconds since the epoch
 *   keyLen    i32   -1 for a null key, then the key's UTF-8 bytes
 *   valueLen  i32   -1 for a null value (tombstone), then the value bytes
 *   headers   u32   count, then per header: u32 name length, name, u32 value length, value (UTF-8)
 */
import { crc32 } from 'node:zlib';
import type { LogRecord } from '../event-log.ts';

const RECORD_OVERHEAD = 8; // crc + length
/** Smallest possible `length`: offset + timestamp + keyLen + valueLen + header count. */
const MIN_BODY = 8 + 8 + 4 + 4 + 4;
/** Anything claiming more is treated as corruption. */
const MAX_BODY = 256 * 1024 * 1024;

const TWO_32 = 0x1_0000_0000;

export interface EncodableRecord {
  offset: number;
  timestamp: number;
  key: string | null;
  value: Buffer | null;
  headers: Record<string, string> | undefined;
}

export function encodedSize(r: EncodableRecord): number {
  let size = RECORD_OVERHEAD + MIN_BODY;
  if (r.key !== null) size += Buffer.byteLength(r.key, 'utf8');
  if (r.value !== null) size += r.value.length;
  if (r.headers) {
    for (const name in r.headers) {
      size += 8 + Buffer.byteLength(name, 'utf8') + Buffer.byteLength(r.headers[name], 'utf8');
    }
  }
  return size;
}

/** Writes `r` at `pos` in `buf` (which must have room for encodedSize(r)); returns the new position. */
export function encodeInto(buf: Buffer, pos: number, r: EncodableRecord): number {
  const start = pos;
  let p = pos + RECORD_OVERHEAD;
  buf.writeUInt32BE(Math.floor(r.offset / TWO_32), p);
  buf.writeUInt32BE(r.offset >>> 0, p + 4);
  buf.writeDoubleBE(r.timestamp, p + 8);
  p += 16;
  if (r.key === null) {
    buf.writeInt32BE(-1, p);
    p += 4;
  } else {
    const n = buf.write(r.key, p + 4, 'utf8');
    buf.writeInt32BE(n, p);
    p += 4 + n;
  }
  if (r.value === null) {
    buf.writeInt32BE(-1, p);
    p += 4;
  } else {
    buf.writeInt32BE(r.value.length, p);
    r.value.copy(buf, p + 4);
    p += 4 + r.value.length;
  }
  const countPos = p;
  p += 4;
  let count = 0;
  if (r.headers) {
    for (const name in r.headers) {
      const n = buf.write(name, p + 4, 'utf8');
      buf.writeUInt32BE(n, p);
      p += 4 + n;
      const v = buf.write(r.headers[name], p + 4, 'utf8');
      buf.writeUInt32BE(v, p);
      p += 4 + v;
      count++;
    }
  }
  buf.writeUInt32BE(count, countPos);
  buf.writeUInt32BE(p - start - RECORD_OVERHEAD, start + 4);
  buf.writeUInt32BE(crc32(buf.subarray(start + 4, p)), start);
  return p;
}

export type FrameCheck =
  | { kind: 'ok'; size: number; offset: number; timestamp: number }
  | { kind: 'short' } // not enough bytes in the buffer for the whole record
  | { kind: 'corrupt'; reason: string };

/** Validates the record framed at `pos` (length bounds and checksum) without decoding it. */
export function checkFrame(buf: Buffer, pos: number, end: number, verifyCrc = true): FrameCheck {
  if (end - pos < RECORD_OVERHEAD) return { kind: 'short' };
  const length = buf.readUInt32BE(pos + 4);
  if (length < MIN_BODY || length > MAX_BODY) return { kind: 'corrupt', reason: `bad record length ${length}` };
  const size = RECORD_OVERHEAD + length;
  if (end - pos < size) return { kind: 'short' };
  if (verifyCrc && crc32(buf.subarray(pos + 4, pos + size)) !== buf.readUInt32BE(pos)) {
    return { kind: 'corrupt', reason: 'checksum mismatch' };
  }
  const offset = buf.readUInt32BE(pos + 8) * TWO_32 + buf.readUInt32BE(pos + 12);
  const timestamp = buf.readDoubleBE(pos + 16);
  return { kind: 'ok', size, offset, timestamp };
}

/** Decodes a record that checkFrame accepted. `value` shares memory with `buf`. */
export function decodeAt(buf: Buffer, pos: number, topic: string, partition: number): LogRecord {
  const end = pos + RECORD_OVERHEAD + buf.readUInt32BE(pos + 4);
  let p = pos + RECORD_OVERHEAD;
  const offset = buf.readUInt32BE(p) * TWO_32 + buf.readUInt32BE(p + 4);
  const timestamp = buf.readDoubleBE(p + 8);
  p += 16;
  const keyLen = buf.readInt32BE(p);
  p += 4;
  let key: string | null = null;
  if (keyLen >= 0) {
    key = buf.toString('utf8', p, p + keyLen);
    p += keyLen;
  }
  const valueLen = buf.readInt32BE(p);
  p += 4;
  let value: Buffer | null = null;
  if (valueLen >= 0) {
    value = buf.subarray(p, p + valueLen);
    p += valueLen;
  }
  const count = buf.readUInt32BE(p);
  p += 4;
  const headers: Record<string, string> = {};
  for (let i = 0; i < count; i++) {
    const n = buf.readUInt32BE(p);
    const name = buf.toString('utf8', p + 4, p + 4 + n);
    p += 4 + n;
    const v = buf.readUInt32BE(p);
    headers[name] = buf.toString('utf8', p + 4, p + 4 + v);
    p += 4 + v;
  }
  if (p > end) throw new Error(`malformed record at offset ${offset}`);
  return { topic, partition, offset, key, value, headers, timestamp };
}

/** Key and tombstone flag only, for compaction. */
export function peekKey(buf: Buffer, pos: number): { key: string | null; tombstone: boolean } {
  let p = pos + RECORD_OVERHEAD + 16;
  const keyLen = buf.readInt32BE(p);
  p += 4;
  let key: string | null = null;
  if (keyLen >= 0) {
    key = buf.toString('utf8', p, p + keyLen);
    p += keyLen;
  }
  return { key, tombstone: buf.readInt32BE(p) === -1 };
}
