/**
 * What a sandbox's connection is, told by its first bytes: TLS (a ClientHello), HTTP (a request
 * line), or other. The gateway reads until they tell, then hands the connection on with those
 * bytes ahead of the rest (`wrap`), so that nothing is piped unseen that a server might read as
 * a request.
 */
import { Duplex } from 'node:stream';
import type net from 'node:net';
import { readClientHello } from '../client-hello.ts';

const HELLO_TIMEOUT_MS = 10_000;

/** The longest request line read before a connection is taken for HTTP unseen to its end. */
const MAX_REQUEST_LINE = 2048;

/** A method: an HTTP token. */
const METHOD = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+/;
/** What a lenient server may split a request line on (Python's str.split does on all of them). */
const BLANK = /^[ \t\v\f\x1c-\x1f\x85\xa0]/;

/**
 * What a connection's first bytes are, as far as they tell: 'tls' (a whole ClientHello), 'http'
 * (a request line: a method, a blank, then any bytes but CR and LF with an `HTTP/` in them, or
 * HTTP/0.9's `/path`), 'other' once they can be neither, 'incomplete' while they still may be.
 * Taken for HTTP too: empty lines first (servers skip them), a line past MAX_REQUEST_LINE, and a
 * TLS handshake record whose ClientHello the gateway cannot read (over 16 KiB, say: a server may
 * take it, so it is never piped unseen); the parser refuses what is not HTTP. Loosely, as the most lenient server would take it (a byte
 * past ASCII in the target, a vertical tab after the method): what such a server might read as a
 * request is never piped unseen.
 */
export function firstKind(buf: Buffer): 'tls' | 'http' | 'other' | 'incomplete' {
  if (buf.length === 0) return 'incomplete';
  const hello = readClientHello(buf);
  if (hello.state !== 'not-tls') return hello.state === 'tls' ? 'tls' : 'incomplete';
  if (buf[0] === 0x16 && buf[1] === 3) return 'http';
  if (buf[0] === 0x0d || buf[0] === 0x0a) return 'http';
  const head = buf.subarray(0, MAX_REQUEST_LINE).toString('latin1');
  const end = head.search(/[\r\n]/);
  const line = end === -1 ? head : head.slice(0, end);
  const method = METHOD.exec(line)?.[0] ?? '';
  if (method === '' || (method.length < line.length && !BLANK.test(line.slice(method.length)))) return 'other';
  if (end === -1) return head.length < MAX_REQUEST_LINE ? 'incomplete' : 'http';
  return /HTTP\/|^[^\w]*\//i.test(line.slice(method.length)) ? 'http' : 'other';
}

/**
 * Reads until the first bytes say what they are (firstKind), the sandbox ends, `stop` aborts, or
 * HELLO_TIMEOUT_MS passes: from the start, or (`patient`) from the first byte. Null when nothing came.
 */
export function firstBytes(socket: Duplex, head: Buffer, options: { patient?: boolean; stop?: AbortSignal } = {}): Promise<Buffer | null> {
  return new Promise((resolve) => {
    let buffer = head;
    let timer: NodeJS.Timeout | undefined;
    const done = (value: Buffer | null) => {
      clearTimeout(timer);
      socket.off('data', onData).off('end', onEnd).off('close', onEnd);
      options.stop?.removeEventListener('abort', onStop);
      socket.pause();
      resolve(value);
    };
    const decided = () => firstKind(buffer) !== 'incomplete';
    const arm = () => {
      if (timer === undefined && (!options.patient || buffer.length > 0)) timer = setTimeout(() => done(buffer.length > 0 ? buffer : null), HELLO_TIMEOUT_MS);
    };
    const onData = (chunk: Buffer) => {
      buffer = Buffer.concat([buffer, chunk]);
      if (decided()) done(buffer);
      else arm();
    };
    const onEnd = () => done(buffer.length > 0 ? buffer : null);
    const onStop = () => done(buffer);
    if (decided()) return done(buffer);
    arm();
    socket.on('data', onData).on('end', onEnd).on('close', onEnd);
    options.stop?.addEventListener('abort', onStop);
    socket.resume();
  });
}

/** A stream over `socket` that yields `first` before the socket's own bytes (for a TLS server or the parser). */
export function wrap(socket: Duplex, first: Buffer): Duplex {
  const stream = new Duplex({
    read() {
      socket.resume();
    },
    write(chunk: Buffer, _encoding, callback) {
      socket.write(chunk, callback);
    },
    final(callback) {
      socket.end();
      callback();
    },
    destroy(err, callback) {
      socket.destroy();
      callback(err);
    },
  });
  if (first.length > 0) stream.push(first);
  socket.on('data', (chunk: Buffer) => {
    if (!stream.push(chunk)) socket.pause();
  });
  socket.on('end', () => stream.push(null));
  socket.on('close', () => stream.destroy());
  // The parser asks a connection's address; it is the sandbox's.
  Object.defineProperty(stream, 'remoteAddress', { get: () => (socket as net.Socket).remoteAddress });
  return stream;
}
