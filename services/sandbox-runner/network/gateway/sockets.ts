/**
 * What the gateway does with a sandbox's connection at its ends: joins it to an upstream,
 * resets it, or writes a last answer on it (raw, where the HTTP parser let go of it, or as a
 * response) and ends it.
 */
import type { Duplex } from 'node:stream';
import http from 'node:http';
import net from 'node:net';
import type { Registered } from './sandbox-egress.ts';

/** How long a connection the gateway ended after an answer may stay half-open (the sandbox reading the answer) before it is closed. */
const ANSWERED_LINGER_MS = 2_000;

/** A refused connection: a TCP reset where the socket is a real one. */
export function reset(socket: Duplex): void {
  if (socket instanceof net.Socket && !socket.destroyed) socket.resetAndDestroy();
  else socket.destroy();
}

/** An answer written on a connection the parser let go of (an upgrade's, or one it could not parse); the connection ends with it. */
export function rawAnswer(socket: Duplex, status: number, reason: string): void {
  const body = `${reason}\n`;
  const lines = rawHeaderLines([
    'Content-Type',
    'text/plain; charset=utf-8',
    'Content-Length',
    String(Buffer.byteLength(body)),
    'X-Svc-Egress',
    status < 500 ? 'denied' : 'failed',
    'Connection',
    'close',
  ]);
  if (!socket.writable) return void socket.destroy();
  socket.write(`HTTP/1.1 ${status} ${http.STATUS_CODES[status] ?? ''}\r\n${lines}\r\n${body}`);
  endAnswered(socket);
}

/** Ends a connection after its last answer: what the sandbox still sends is read and dropped (never sent on), and it is closed soon whatever the sandbox does. */
export function endAnswered(socket: Duplex): void {
  socket.end();
  socket.resume();
  setTimeout(() => socket.destroy(), ANSWERED_LINGER_MS).unref();
}

/** `[name, value, name, value...]` as header lines, each ending in CRLF (node's parser let no CR or LF into them). */
export function rawHeaderLines(raw: string[]): string {
  let lines = '';
  for (let i = 0; i + 1 < raw.length; i += 2) lines += `${raw[i]}: ${raw[i + 1]}\r\n`;
  return lines;
}

export function refuse(res: http.ServerResponse, reason: string, status = 403): void {
  const body = `${reason}\n`;
  res.writeHead(status, {
    'content-type': 'text/plain; charset=utf-8',
    'content-length': Buffer.byteLength(body),
    'x-svc-egress': status === 403 ? 'denied' : 'failed',
  });
  res.end(body);
}

/** The two ends of an accepted connection, as connection tracking names them. */
export const peerOf = (socket: net.Socket) => ({ address: socket.remoteAddress ?? '', port: socket.remotePort ?? 0 });
export const localOf = (socket: net.Socket) => ({ address: socket.localAddress ?? '', port: socket.localPort ?? 0 });

/** Both ways, half-open, ended together; the upstream is counted among the sandbox's sockets. */
export function join(inbound: Duplex, upstream: net.Socket, sandbox: Registered): void {
  sandbox.sockets.add(upstream);
  upstream.once('close', () => sandbox.sockets.delete(upstream));
  for (const socket of [inbound, upstream]) {
    socket.on('error', () => {
      inbound.destroy();
      upstream.destroy();
    });
  }
  inbound.pipe(upstream).pipe(inbound);
  inbound.resume();
}
