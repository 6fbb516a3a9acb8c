/**
 * The servers of the outside world (test/helpers/outside-world.ts), run by it inside the world's
 * network namespace: `SVCO_CONFIG={"prefix":"10.98.k","certFile":...,"keyFile":...}`. Prints
 * `{"ready":true}` on stdout once every server listens, then answers `{"id","op"}` lines on stdin
 * with `{"id","result"}` lines; exits when stdin closes (its test process is gone).
 */
import dgram from 'node:dgram';
import { createReadStream, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import readline from 'node:readline';
import { Readable } from 'node:stream';
import tls from 'node:tls';
import dnsPacket from 'dns-packet';
import { GatewayDnsServer } from '../../services/sandbox-runner/network/dns-server.ts';
import { DNS_OCTET, DOT_PORT, TCP_ECHO_PORT, UDP_ECHO_PORT, WEB_HOSTS, WORLD_HOSTS, madeUpName, worldOctet, type WorldRequest } from './outside-world.ts';

const config = JSON.parse(process.env.SVCO_CONFIG ?? '{}') as { prefix: string; certFile: string; keyFile: string; filesDir?: string };
const { prefix } = config;
const cert = readFileSync(config.certFile);
const key = readFileSync(config.keyFile);
const addr = (name: keyof typeof WORLD_HOSTS) => `${prefix}.${WORLD_HOSTS[name]}`;
const DOH_ANSWER = addr('denied.test');

let requests: WorldRequest[] = [];
let tcpConnections = 0;
let udpPackets = 0;
let dotQueries = 0;
let dnsQueries: Array<{ source: string; name: string; type: string }> = [];

function flatHeaders(headers: http.IncomingHttpHeaders): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(headers)) if (v !== undefined) out[k] = Array.isArray(v) ? v.join(', ') : v;
  return out;
}

/** The DoH/DoT answer: every A question gets the denied host's address, other types nothing. */
function dohReply(message: Buffer): Buffer | null {
  let query: dnsPacket.DecodedPacket;
  try {
    query = dnsPacket.decode(message);
  } catch {
    return null;
  }
  if (query.type !== 'query') return null;
  const questions = query.questions ?? [];
  return dnsPacket.encode({
    type: 'response',
    id: query.id ?? 0,
    flags: ((query.flags ?? 0) & dnsPacket.RECURSION_DESIRED) | dnsPacket.RECURSION_AVAILABLE,
    questions,
    answers: questions.filter((q) => q.type === 'A').map((q) => ({ type: 'A' as const, name: q.name, ttl: 60, class: 'IN' as const, data: DOH_ANSWER })),
  });
}

function target(authority: string): { host: string; port: number } | null {
  const m = /^\[?([^\]]+?)\]?:(\d+)$/.exec(authority);
  if (!m) return null;
  const octet = worldOctet(m[1]);
  const host = net.isIP(m[1]) ? m[1] : octet === null ? null : `${prefix}.${octet}`;
  return host ? { host, port: Number(m[2]) } : null;
}

function webHandler(server: string, scheme: 'http' | 'https') {
  return (req: http.IncomingMessage, res: http.ServerResponse) => {
    const record: WorldRequest = {
      server,
      scheme,
      method: req.method ?? '',
      host: req.headers.host ?? '',
      path: req.url ?? '',
      headers: flatHeaders(req.headers),
      body_bytes: 0,
    };
    requests.push(record);
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => {
      record.body_bytes += c.length;
      if (record.body_bytes <= 65536) chunks.push(c);
    });
    req.on('error', () => undefined);
    req.on('end', () => {
      const url = new URL(req.url ?? '/', 'http://x');
      if (server === 'doh.test' && url.pathname === '/dns-query') {
        const message = req.method === 'POST' ? Buffer.concat(chunks) : Buffer.from(url.searchParams.get('dns') ?? '', 'base64url');
        const reply = dohReply(message);
        if (!reply) {
          res.writeHead(400, { 'content-type': 'text/plain' }).end('bad DNS message\n');
          return;
        }
        res.writeHead(200, { 'content-type': 'application/dns-message', 'content-length': reply.length, 'cache-control': 'max-age=60' }).end(reply);
        return;
      }
      if (url.pathname.startsWith('/files/') && config.filesDir) {
        const file = path.join(config.filesDir, path.posix.normalize(decodeURIComponent(url.pathname.slice('/files/'.length))).replace(/^(\.\.\/)+/, ''));
        const stat = statSync(file, { throwIfNoEntry: false });
        if (!stat?.isFile()) {
          res.writeHead(404, { 'content-type': 'text/plain' }).end('not found\n');
          return;
        }
        res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': stat.size });
        if (req.method === 'HEAD') res.end();
        else createReadStream(file).pipe(res);
        return;
      }
      if (url.pathname === '/big') {
        const total = Math.max(0, Math.min(Number(url.searchParams.get('bytes') ?? 0) || 0, 2 ** 34));
        res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': total });
        const chunk = Buffer.alloc(64 * 1024, 0x78);
        Readable.from(
          (function* () {
            for (let sent = 0; sent < total; sent += chunk.length) yield total - sent >= chunk.length ? chunk : chunk.subarray(0, total - sent);
          })(),
        ).pipe(res);
        return;
      }
      const status = Number(url.searchParams.get('status') ?? 200);
      const body = JSON.stringify({
        server,
        method: record.method,
        host: record.host,
        path: record.path,
        headers: record.headers,
        body_bytes: record.body_bytes,
        scheme,
      });
      res.writeHead(status >= 200 && status <= 599 ? status : 200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) }).end(body);
    });
  };
}

/** `CONNECT host:port`: recorded, then relayed (so a test can show when one got through). */
function connectHandler(server: string, scheme: 'http' | 'https') {
  return (req: http.IncomingMessage, socket: net.Socket, head: Buffer) => {
    requests.push({
      server,
      scheme,
      method: 'CONNECT',
      host: req.headers.host ?? req.url ?? '',
      path: req.url ?? '',
      headers: flatHeaders(req.headers),
      body_bytes: 0,
    });
    socket.on('error', () => undefined);
    const to = target(req.url ?? '');
    if (!to) {
      socket.end('HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n');
      return;
    }
    const upstream = net.connect(to.port, to.host, () => {
      socket.write('HTTP/1.1 200 Connection Established\r\n\r\n');
      if (head.length) upstream.write(head);
      upstream.pipe(socket);
      socket.pipe(upstream);
    });
    upstream.on('error', () => {
      if (!socket.destroyed) socket.end('HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n');
    });
    socket.on('close', () => upstream.destroy());
  };
}

function listen(server: net.Server, port: number, host: string): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      server.on('error', (err) => process.stderr.write(`${host}:${port}: ${err.message}\n`));
      resolve();
    });
  });
}

async function main(): Promise<void> {
  const started: Array<Promise<void>> = [];
  for (const name of WEB_HOSTS) {
    const h = http.createServer(webHandler(name, 'http'));
    h.on('connect', connectHandler(name, 'http'));
    const s = https.createServer({ cert, key }, webHandler(name, 'https'));
    s.on('connect', connectHandler(name, 'https'));
    started.push(listen(h, 80, addr(name)), listen(s, 443, addr(name)));
  }

  // DNS over TLS on doh.test: length-prefixed messages in TLS
  const dot = tls.createServer({ cert, key }, (socket) => {
    let pending = Buffer.alloc(0);
    socket.on('error', () => undefined);
    socket.setTimeout(30_000, () => socket.destroy());
    socket.on('data', (chunk: Buffer) => {
      pending = Buffer.concat([pending, chunk]);
      if (pending.length > 70_000) socket.destroy();
      while (pending.length >= 2 && pending.length >= 2 + pending.readUInt16BE(0)) {
        const message = pending.subarray(2, 2 + pending.readUInt16BE(0));
        pending = pending.subarray(2 + message.length);
        dotQueries++;
        const reply = dohReply(message);
        if (!reply) {
          socket.destroy();
          return;
        }
        const head = Buffer.alloc(2);
        head.writeUInt16BE(reply.length);
        socket.write(Buffer.concat([head, reply]));
      }
    });
  });
  started.push(listen(dot, DOT_PORT, addr('doh.test')));

  const echo = net.createServer((socket) => {
    tcpConnections++;
    socket.on('error', () => undefined);
    socket.pipe(socket);
  });
  started.push(listen(echo, TCP_ECHO_PORT, addr('echo.allowed.test')));

  const udp = dgram.createSocket('udp4');
  udp.on('message', (msg, rinfo) => {
    udpPackets++;
    udp.send(msg, rinfo.port, rinfo.address);
  });
  udp.on('error', (err) => process.stderr.write(`udp echo: ${err.message}\n`));
  started.push(new Promise<void>((resolve) => udp.bind(UDP_ECHO_PORT, addr('echo.allowed.test'), () => resolve())));

  started.push(
    GatewayDnsServer.start({
      host: `${prefix}.${DNS_OCTET}`,
      port: 53,
      answer: async (source, name, type) => {
        dnsQueries.push({ source, name, type });
        const madeUp = madeUpName(name);
        if (madeUp) {
          if (type !== 'A') return { kind: 'empty' };
          // A rebinding name answers the allowed host first, and its own address ever after.
          const asked = dnsQueries.filter((q) => q.name === name && q.type === 'A').length;
          const address = madeUp.kind === 'rebind' && asked === 1 ? addr('other.allowed.test') : madeUp.address;
          return { kind: 'addresses', addresses: [address], ttl: 0 };
        }
        const octet = worldOctet(name);
        if (octet === null) return { kind: 'nxdomain', reason: 'not in the outside world' };
        if (type !== 'A') return { kind: 'empty' };
        return { kind: 'addresses', addresses: [`${prefix}.${octet}`], ttl: 60 };
      },
      onError: (err) => process.stderr.write(`dns: ${err.message}\n`),
    }).then(() => undefined),
  );

  await Promise.all(started);

  const send = (msg: unknown) => process.stdout.write(`${JSON.stringify(msg)}\n`);
  const lines = readline.createInterface({ input: process.stdin });
  lines.on('line', (line) => {
    let msg: { id: number; op: string };
    try {
      msg = JSON.parse(line);
    } catch {
      return;
    }
    switch (msg.op) {
      case 'requests':
        return send({ id: msg.id, result: requests });
      case 'tcpConnections':
        return send({ id: msg.id, result: tcpConnections });
      case 'udpPackets':
        return send({ id: msg.id, result: udpPackets });
      case 'dotQueries':
        return send({ id: msg.id, result: dotQueries });
      case 'dnsQueries':
        return send({ id: msg.id, result: dnsQueries });
      case 'reset':
        requests = [];
        dnsQueries = [];
        tcpConnections = udpPackets = dotQueries = 0;
        return send({ id: msg.id, result: null });
      default:
        return send({ id: msg.id, error: `unknown op ${msg.op}` });
    }
  });
  lines.on('close', () => process.exit(0));
  send({ ready: true });
}

main().catch((err) => {
  process.stderr.write(`outside world: ${err instanceof Error ? err.stack : String(err)}\n`);
  process.exit(1);
});
