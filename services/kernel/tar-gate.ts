/**
 * What stands between an inflated tar stream and node-tar's parser when the archive is a tenant's
 * (bundles, image layers and archives): node-tar, past a tar's end-of-archive blocks, re-copies
 * everything it holds on every further chunk (quadratic: 200 MB of zeros after a tiny tar took
 * minutes), and it inflates a tar that is itself gzip again, synchronously, on the event loop.
 */
import { Transform } from 'node:stream';
import type { Parser } from 'tar';

/** Passes chunks to `parser` until its end-of-archive blocks, and fails on a tar that is itself gzip. */
export function tarGate(parser: Parser): Transform {
  let tarEnded = false;
  parser.on('eof', () => (tarEnded = true));
  let first = true;
  return new Transform({
    transform(chunk: Buffer, _encoding, done) {
      if (first && chunk[0] === 0x1f && chunk[1] === 0x8b) return done(new Error('compressed twice: the tar inside is gzip again'));
      first = false;
      done(null, tarEnded ? undefined : chunk);
    },
  });
}
