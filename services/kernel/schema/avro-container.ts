/**
 * Avro object container files (the Avro specification's "Object Container Files") made from
 * values that are already Avro-encoded: a header naming the writer schema, then one block of the
 * values' bytes laid end to end. Nothing is decoded or re-encoded, so a batch of log records
 * becomes a file ClickHouse reads natively (`FORMAT Avro`) for the cost of a copy.
 *
 * avsc writes containers only from JS values (its BlockEncoder encodes them itself); the header
 * and block layouts below are the specification's own record schemas, encoded with avsc.
 */
import { randomBytes } from 'node:crypto';
import avro from 'avsc';

const MAGIC = Buffer.from('Obj\x01');

const HEADER = avro.Type.forSchema({
  type: 'record',
  name: 'org.apache.avro.file.Header',
  fields: [
    { name: 'magic', type: { type: 'fixed', name: 'Magic', size: 4 } },
    { name: 'meta', type: { type: 'map', values: 'bytes' } },
    { name: 'sync', type: { type: 'fixed', name: 'Sync', size: 16 } },
  ],
});

/** A block's object count and byte size (the data and the sync marker follow them). */
const BLOCK_PREFIX = avro.Type.forSchema({
  type: 'record',
  name: 'BlockPrefix',
  fields: [
    { name: 'count', type: 'long' },
    { name: 'size', type: 'long' },
  ],
});

/**
 * A container of `values` (each one value's Avro binary encoding under `schema`), uncompressed,
 * in one block.
 */
export function avroContainer(schema: object, values: readonly Buffer[]): Buffer {
  const sync = randomBytes(16);
  const header = HEADER.toBuffer({ magic: MAGIC, meta: { 'avro.schema': Buffer.from(JSON.stringify(schema)), 'avro.codec': Buffer.from('null') }, sync });
  let size = 0;
  for (const value of values) size += value.length;
  const prefix = BLOCK_PREFIX.toBuffer({ count: values.length, size });
  return Buffer.concat([header, prefix, ...values, sync]);
}
