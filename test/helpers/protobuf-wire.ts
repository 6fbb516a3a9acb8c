/** Protobuf bytes made by hand, for bodies no encoder would make. */

/** A length-delimited field: its tag, its length, its bytes. */
export const lengthField = (tag: number, bytes: Buffer | number[]) => Buffer.concat([varint((tag << 3) | 2), varint(bytes.length), Buffer.from(bytes)]);

export function varint(n: number): Buffer {
  const out: number[] = [];
  while (n > 0x7f) {
    out.push((n & 0x7f) | 0x80);
    n >>>= 7;
  }
  out.push(n);
  return Buffer.from(out);
}
