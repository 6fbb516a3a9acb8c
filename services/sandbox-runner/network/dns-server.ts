/**
 * DNS for the sandbox network.
 *
 * - `GatewayDnsServer`: the resolver the sandboxes see. The host redirects every UDP/53 and
 *   TCP/53 a sandbox sends to this server (one per runner, in the runner's process); it decodes
 *   each query with `dns-packet`, asks `answer(sourceIp, name, type)` what to say (the policy:
 *   allowed names, overrides, NXDOMAIN) and encodes the reply. Bounded against a hostile sandbox:
 *   malformed packets are dropped, a TCP connection that sends garbage or more than 64 KiB
 *   unanswered is closed, at most 64 queries per source address are in flight (the rest are
 *   dropped), a TCP connection idle for 10 s is closed.
 * - `UpstreamResolver`: how the gateway resolves an allowed name for real (node:dns `Resolver`,
 *   the host's resolver or configured servers), with a small TTL-honouring cache.
 */
import dgram from 'node:dgram';
import { Resolver } from 'node:dns/promises';
import net from 'node:net';
import dnsPacket from 'dns-packet';

export type DnsAnswer =
  | { kind: 'addresses'; addresses: string[]; ttl: number }
  | { kind: 'nxdomain'; reason: string }
  /** NOERROR without answers (e.g. AAAA when only IPv4 is given) */
  | { kind: 'empty' };

export interface GatewayDnsServerOptions {
  /** address to listen on, e.g. '0.0.0.0' ('::' listens dual-stack) */
  host: string;
  /** 0 = any free port (the same one for UDP and TCP) */
  port: number;
  /**
   * What to answer: `sourceIp` without a `::ffff:` prefix, `name` lower-cased without the
   * trailing dot, `type` the question's type ('A', 'AAAA', 'MX', ...). A rejection is answered
   * SERVFAIL (and reported to `onError`).
   */
  answer: (sourceIp: string, name: string, type: string) => Promise<DnsAnswer>;
  onError?: (err: Error) => void;
}

/** Queries in flight per source address; more are dropped unanswered. */
export const MAX_IN_FLIGHT_PER_SOURCE = 64;
/** Unanswered bytes a TCP connection may have sent (one maximal DNS message and its length). */
export const MAX_TCP_PENDING_BYTES = 64 * 1024 + 2;
const TCP_IDLE_MS = 10_000;
const MAX_TCP_CONNECTIONS = 1024;
/** Questions in one query (real clients send one). */
const MAX_QUESTIONS = 4;
/** Largest UDP reply we send to a client that announced EDNS. */
const MAX_UDP_PAYLOAD = 1232;

/** RFC 1035 / 2136 response codes we use. */
const RCODE = { NOERROR: 0, FORMERR: 1, SERVFAIL: 2, NXDOMAIN: 3, NOTIMP: 4 } as const;

export function normaliseIp(address: string): string {
  return address.startsWith('::ffff:') && net.isIPv4(address.slice(7)) ? address.slice(7) : address;
}

interface Decoded extends dnsPacket.DecodedPacket {
  opcode?: string;
}

export class GatewayDnsServer {
  readonly port: number;
  private closed = false;
  private readonly inFlight = new Map<string, number>();
  private readonly connections = new Set<net.Socket>();

  private constructor(
    private readonly options: GatewayDnsServerOptions,
    private readonly udp: dgram.Socket,
    private readonly tcp: net.Server,
  ) {
    this.port = (tcp.address() as net.AddressInfo).port;
    udp.on('message', (msg, rinfo) => this.onUdp(msg, rinfo));
    udp.on('error', (err) => this.report(err));
    tcp.on('connection', (socket) => this.onTcp(socket));
    tcp.on('error', (err) => this.report(err));
  }

  static async start(options: GatewayDnsServerOptions): Promise<GatewayDnsServer> {
    const attempts = options.port === 0 ? 20 : 1;
    let lastError: unknown;
    for (let i = 0; i < attempts; i++) {
      const tcp = net.createServer({ pauseOnConnect: false });
      await new Promise<void>((resolve, reject) => {
        tcp.once('error', reject);
        tcp.listen({ host: options.host, port: options.port, exclusive: true }, () => {
          tcp.off('error', reject);
          resolve();
        });
      });
      const port = (tcp.address() as net.AddressInfo).port;
      const udp = dgram.createSocket({ type: net.isIPv6(options.host) ? 'udp6' : 'udp4' });
      try {
        await new Promise<void>((resolve, reject) => {
          udp.once('error', reject);
          udp.bind({ address: options.host, port, exclusive: true }, () => {
            udp.off('error', reject);
            resolve();
          });
        });
        return new GatewayDnsServer(options, udp, tcp);
      } catch (err) {
        lastError = err;
        udp.close();
        await new Promise<void>((resolve) => tcp.close(() => resolve()));
        if ((err as NodeJS.ErrnoException).code !== 'EADDRINUSE') throw err;
      }
    }
    throw lastError;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    for (const socket of this.connections) socket.destroy();
    this.connections.clear();
    await Promise.all([
      new Promise<void>((resolve) => this.tcp.close(() => resolve())),
      new Promise<void>((resolve) => {
        try {
          this.udp.close(() => resolve());
        } catch {
          resolve();
        }
      }),
    ]);
  }

  private report(err: unknown): void {
    if (this.closed) return;
    try {
      this.options.onError?.(err instanceof Error ? err : new Error(String(err)));
    } catch {
      // the reporter's failure is not ours
    }
  }

  private acquire(source: string): boolean {
    const n = this.inFlight.get(source) ?? 0;
    if (n >= MAX_IN_FLIGHT_PER_SOURCE) return false;
    this.inFlight.set(source, n + 1);
    return true;
  }

  private release(source: string): void {
    const n = (this.inFlight.get(source) ?? 1) - 1;
    if (n <= 0) this.inFlight.delete(source);
    else this.inFlight.set(source, n);
  }

  private onUdp(msg: Buffer, rinfo: dgram.RemoteInfo): void {
    if (this.closed) return;
    const source = normaliseIp(rinfo.address);
    const query = decodeQuery(msg);
    if (!query || !this.acquire(source)) return;
    this.respond(source, query, 'udp')
      .then((reply) => {
        if (reply && !this.closed) {
          this.udp.send(reply, rinfo.port, rinfo.address, (err) => {
            if (err) this.report(err);
          });
        }
      })
      .catch((err) => this.report(err))
      .finally(() => this.release(source));
  }

  private onTcp(socket: net.Socket): void {
    if (this.closed || this.connections.size >= MAX_TCP_CONNECTIONS) {
      socket.destroy();
      return;
    }
    this.connections.add(socket);
    const source = normaliseIp(socket.remoteAddress ?? '');
    let pending: Buffer = Buffer.alloc(0);
    socket.setTimeout(TCP_IDLE_MS, () => socket.destroy());
    socket.on('error', () => socket.destroy());
    socket.on('close', () => this.connections.delete(socket));
    socket.on('data', (chunk: Buffer) => {
      pending = pending.length ? Buffer.concat([pending, chunk]) : chunk;
      if (pending.length > MAX_TCP_PENDING_BYTES) {
        socket.destroy();
        return;
      }
      while (pending.length >= 2) {
        const length = pending.readUInt16BE(0);
        if (pending.length < 2 + length) break;
        const message = pending.subarray(2, 2 + length);
        pending = pending.subarray(2 + length);
        const query = decodeQuery(message);
        if (!query) {
          socket.destroy();
          return;
        }
        if (!this.acquire(source)) continue;
        this.respond(source, query, 'tcp')
          .then((reply) => {
            if (reply && !socket.destroyed) {
              const frame = Buffer.alloc(2 + reply.length);
              frame.writeUInt16BE(reply.length, 0);
              reply.copy(frame, 2);
              socket.write(frame);
            }
          })
          .catch((err) => this.report(err))
          .finally(() => this.release(source));
      }
    });
  }

  /** The encoded reply to one decoded query, or null to say nothing. */
  private async respond(source: string, query: Decoded, transport: 'udp' | 'tcp'): Promise<Buffer | null> {
    const questions = query.questions ?? [];
    const opt = (query.additionals ?? []).find((a) => a.type === 'OPT') as dnsPacket.OptAnswer | undefined;
    const base = (rcode: number, answers: dnsPacket.Answer[] = []): dnsPacket.Packet => ({
      type: 'response',
      id: query.id ?? 0,
      // opcode and RD as asked, RA set, the rcode in the low bits
      flags: ((query.flags ?? 0) & 0x7900) | dnsPacket.RECURSION_AVAILABLE | rcode,
      questions,
      answers,
      additionals: opt
        ? [{ type: 'OPT', name: '.', udpPayloadSize: MAX_UDP_PAYLOAD, extendedRcode: 0, ednsVersion: 0, flags: 0, flag_do: false, options: [] }]
        : [],
    });
    if ((query.flags ?? 0) & 0x7800) return dnsPacket.encode(base(RCODE.NOTIMP)); // opcode other than QUERY
    if (questions.length === 0 || questions.length > MAX_QUESTIONS) return dnsPacket.encode(base(RCODE.FORMERR));

    let rcode: number = RCODE.NOERROR;
    const answers: dnsPacket.Answer[] = [];
    const results = await Promise.allSettled(questions.map((q) => this.options.answer(source, q.name.toLowerCase().replace(/\.$/, ''), String(q.type))));
    results.forEach((result, i) => {
      const q = questions[i];
      if (result.status === 'rejected') {
        this.report(result.reason);
        rcode = RCODE.SERVFAIL;
        return;
      }
      const a = result.value;
      if (a.kind === 'nxdomain') {
        if (rcode === RCODE.NOERROR) rcode = RCODE.NXDOMAIN;
        return;
      }
      if (a.kind !== 'addresses') return;
      const ttl = Math.max(0, Math.min(2 ** 31 - 1, Math.floor(a.ttl)));
      const type = String(q.type);
      for (const address of a.addresses) {
        if (net.isIPv4(address) && (type === 'A' || type === 'ANY')) {
          answers.push({ type: 'A', name: q.name, ttl, class: 'IN', data: address });
        } else if (net.isIPv6(address) && (type === 'AAAA' || type === 'ANY')) {
          answers.push({ type: 'AAAA', name: q.name, ttl, class: 'IN', data: address });
        }
      }
    });
    if (this.closed) return null;
    if (rcode !== RCODE.NOERROR) answers.length = 0;
    let reply = dnsPacket.encode(base(rcode, answers));
    if (transport === 'udp') {
      const limit = opt ? Math.min(MAX_UDP_PAYLOAD, Math.max(512, opt.udpPayloadSize || 512)) : 512;
      if (reply.length > limit) {
        // too big for this client over UDP: truncated, it retries over TCP
        const truncated = base(rcode);
        truncated.flags = (truncated.flags ?? 0) | dnsPacket.TRUNCATED_RESPONSE;
        reply = dnsPacket.encode(truncated);
      }
    } else if (reply.length > 0xffff) {
      return dnsPacket.encode(base(RCODE.SERVFAIL));
    }
    return reply;
  }
}

/** A query worth answering, or null (malformed, a response, no question list). */
function decodeQuery(message: Buffer): Decoded | null {
  if (message.length < 12) return null;
  try {
    const packet = dnsPacket.decode(message) as Decoded;
    if (packet.type !== 'query') return null;
    for (const q of packet.questions ?? []) {
      if (typeof q.name !== 'string' || q.type === undefined) return null;
    }
    return packet;
  } catch {
    return null;
  }
}

// ---------------------------------------------------------------------------------------------

interface CacheEntry {
  addresses: string[];
  expiresAt: number;
}

/** TTL bounds of the cache, in seconds. */
export const MIN_CACHE_TTL_S = 1;
export const MAX_CACHE_TTL_S = 300;
/** How long a name that does not exist (or has no A record) is remembered, in seconds. */
export const NEGATIVE_CACHE_TTL_S = 5;
export const MAX_CACHE_NAMES = 10_000;
/** Errors that mean "no such address", answered with an empty list rather than thrown. */
const NO_ADDRESS = new Set(['ENOTFOUND', 'ENODATA', 'EBADNAME', 'ENONAME']);

/**
 * Real resolution of a name for the gateway: node:dns's Resolver (2 s timeout, one retry) over
 * `servers` ('ip' or 'ip:port', '[v6]:port'), or the host's resolver when null. Answers are cached
 * by name for their TTL (bounded to 1..300 s, at most 10,000 names, the least recently used
 * forgotten first); concurrent lookups of one name share one query. A name that does not exist or
 * has no A record gives `addresses: []` (remembered for 5 s); other failures (timeout, SERVFAIL,
 * refused) reject and are not cached.
 */
export class UpstreamResolver {
  private readonly resolver: Resolver;
  private readonly cache = new Map<string, CacheEntry>();
  private readonly pending = new Map<string, Promise<CacheEntry>>();

  constructor(servers: string[] | null) {
    this.resolver = new Resolver({ timeout: 2000, tries: 2 });
    if (servers) this.resolver.setServers(servers);
  }

  async lookup4(name: string): Promise<{ addresses: string[]; ttl: number }> {
    const key = name.toLowerCase().replace(/\.$/, '');
    const now = Date.now();
    const cached = this.cache.get(key);
    if (cached && cached.expiresAt > now) {
      // most recently used goes last
      this.cache.delete(key);
      this.cache.set(key, cached);
      return view(cached, now);
    }
    if (cached) this.cache.delete(key);
    let query = this.pending.get(key);
    if (!query) {
      query = this.query(key).finally(() => this.pending.delete(key));
      this.pending.set(key, query);
    }
    return view(await query, Date.now());
  }

  /** Forgets every cached answer and abandons the queries in flight. */
  cancel(): void {
    this.cache.clear();
    this.resolver.cancel();
  }

  private async query(name: string): Promise<CacheEntry> {
    let entry: CacheEntry;
    try {
      const records = await this.resolver.resolve4(name, { ttl: true });
      const ttl = records.length ? Math.min(...records.map((r) => r.ttl)) : NEGATIVE_CACHE_TTL_S;
      const bounded = Math.max(MIN_CACHE_TTL_S, Math.min(MAX_CACHE_TTL_S, ttl));
      entry = { addresses: records.map((r) => r.address), expiresAt: Date.now() + bounded * 1000 };
    } catch (err) {
      if (!NO_ADDRESS.has((err as NodeJS.ErrnoException).code ?? '')) throw err;
      entry = { addresses: [], expiresAt: Date.now() + NEGATIVE_CACHE_TTL_S * 1000 };
    }
    this.cache.set(name, entry);
    while (this.cache.size > MAX_CACHE_NAMES) {
      const oldest = this.cache.keys().next().value as string;
      this.cache.delete(oldest);
    }
    return entry;
  }
}

function view(entry: CacheEntry, now: number): { addresses: string[]; ttl: number } {
  return { addresses: [...entry.addresses], ttl: Math.max(1, Math.ceil((entry.expiresAt - now) / 1000)) };
}
