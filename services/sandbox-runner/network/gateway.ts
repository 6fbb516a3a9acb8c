/**
 * The egress gateway: every packet a sandbox sends off its private network ends here (the
 * runtime redirects it: runtimes/local/local-network.ts), and every connection that leaves is made by
 * this process, after the sandbox's policy allowed it. It knows a sandbox by its address.
 *
 * - DNS (UDP and TCP 53): a name the policy allows resolves through the upstream resolver; a
 *   `dns_overrides` name resolves to its replacement; anything else is NXDOMAIN. What resolved is
 *   remembered per sandbox, so a later connection to that address is known by its name.
 * - HTTP (TCP 80): parsed by node's parser, request by request; the host comes from the request
 *   (Host, or the absolute URL of a proxy request) and is checked; each request that leaves is a
 *   fresh one, its body framed again (one request out per request in). CONNECT is checked by its
 *   target; an Upgrade only to a WebSocket, joined after the upstream's 101. A refusal is an HTTP
 *   403 naming the policy; what the parser refuses, a 400.
 * - TLS (TCP 443): the host is the ClientHello's server name (without one: the name resolved to
 *   the address it was sent to). Passed through untouched, unless the sandbox audits HTTP calls
 *   or a brokered credential is for that host: then it is terminated with a certificate of the
 *   deployment's authority (network/certificate-authority.ts) and goes on as HTTP, where the Host
 *   header must name the same host (no domain fronting).
 * - Any other TCP: by its original destination (connection tracking), allowed only to an
 *   address the sandbox resolved for an allowed name (or an allowed literal address); then its
 *   first bytes, read until they tell, say what it is, and HTTP or TLS on any port goes the ways
 *   above (piped as it is only when the server speaks first).
 * - Never, whatever the policy: the service host itself, loopback, link-local, multicast, or a
 *   sandbox network.
 * - Any other UDP: never leaves (the runtime refuses it and reports it here: `refusedUdp`).
 * - A backing service of the sandbox (backing/): its name (or a `dns_overrides` name sent to it)
 *   resolves to its own address (`serviceAddress`), and a connection to that address goes to
 *   the service, never out: an http_mock answers the parsed requests itself (HTTPS too, with a
 *   certificate for the name asked for), a database gets the connection's bytes. Its `http_call`
 *   records name the service as their host.
 * Each refusal is a `network_denied` audit record (what, where, why); with `audit.http_calls`,
 * each HTTP request is an `http_call` record.
 */
import { Duplex } from 'node:stream';
import fs from 'node:fs';
import path from 'node:path';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import os from 'node:os';
import tls from 'node:tls';
import { normaliseHost, type EgressPolicy } from '../../domain/egress-policy.ts';
import type { Logger } from '../../kernel/logger.ts';
import type { Config } from '../../kernel/config.ts';
import { CertificateAuthority } from './certificate-authority.ts';
import { readClientHello } from './client-hello.ts';
import { GatewayDnsServer, UpstreamResolver, type DnsAnswer } from './dns-server.ts';
import { redactHeaders } from './headers.ts';
import { originalDestination, type GatewayPorts } from '../runtimes/local/local-network.ts';

/** What the gateway needs of one sandbox. */
export interface SandboxEgress {
  policy: EgressPolicy;
  /** real hostname -> the name (or address) it resolves to instead */
  dnsOverrides: Record<string, string>;
  /** name -> address the sandbox's /etc/hosts fixes (determinism.dns): where the gateway connects for that name too */
  hosts: Record<string, string>;
  /** audit.http_calls: record every HTTP request, terminating TLS to see HTTPS ones */
  inspect: boolean;
  /** headers set on requests to these hosts (the real value of a brokered secret) */
  brokered: Array<{ hosts: EgressPolicy; header: string; value: string }>;
  record(type: 'http_call' | 'network_denied', details: Record<string, unknown>): void;
  /** the sandbox's backing services */
  services: ServiceEndpoint[];
}

/** Where the sandbox reaches one of its backing services. */
export interface ServiceEndpoint {
  name: string;
  /** its address on the sandbox's network (`serviceAddress`) */
  address: string;
  /** An HTTP service (http_mock) answers the gateway's parsed requests; `host` is the name the request asked for. */
  http?: (req: http.IncomingMessage, res: http.ServerResponse, host: string) => void;
  /** A TCP service (a database): a connection to it, and an observer of each connection's bytes. */
  connect?: () => net.Socket;
  observe?: () => { fromClient(chunk: Buffer): void; fromServer(chunk: Buffer): void; close(): void } | null;
}

/** The address of a sandbox's `index`th backing service: in 198.18.0.0/24 (RFC 2544's benchmarking range, never a real host's); the same in every sandbox. */
export const serviceAddress = (index: number): string => `198.18.0.${index + 1}`;

interface Registered extends SandboxEgress {
  /** address -> the name it was resolved for */
  resolved: Map<string, string>;
  sockets: Set<Duplex>;
  /** requests the gateway has open upstream for it (pipelined ones too): they count against MAX_CONNECTIONS_PER_SANDBOX */
  inflight: number;
  /** refusals of UDP and DNS already recorded (what -> the second it was recorded in) */
  recent: Map<string, number>;
}

/** How an HTTP connection reached the parser: which sandbox, plain or terminated TLS, the TLS name. */
interface Via {
  sandbox: Registered;
  scheme: 'http' | 'https';
  port: number;
  serverName: string | null;
}

/** Places no sandbox reaches, whatever its policy says. */
const NEVER: Array<[string, net.BlockList]> = [
  ['loopback', blockList([['127.0.0.0', 8, 'ipv4'], ['::1', 128, 'ipv6']])],
  ['unspecified', blockList([['0.0.0.0', 8, 'ipv4'], ['::', 128, 'ipv6']])],
  ['link-local (where clouds serve instance credentials)', blockList([['169.254.0.0', 16, 'ipv4'], ['fe80::', 10, 'ipv6']])],
  ['multicast or broadcast', blockList([['224.0.0.0', 3, 'ipv4'], ['ff00::', 8, 'ipv6']])],
];

function blockList(subnets: Array<[string, number, 'ipv4' | 'ipv6']>): net.BlockList {
  const list = new net.BlockList();
  for (const [address, prefix, family] of subnets) list.addSubnet(address, prefix, family);
  return list;
}

/** Connections one sandbox may hold through the gateway at once; past it new ones are reset. */
const MAX_CONNECTIONS_PER_SANDBOX = 1024;
const FULL = `the sandbox holds ${MAX_CONNECTIONS_PER_SANDBOX} connections through the egress gateway, the most it may`;
const HELLO_TIMEOUT_MS = 10_000;
/** How long a connection's request may take to send its headers, from its first byte (or the connection's start). */
const HEADERS_TIMEOUT_MS = 60_000;
/** How long a sandbox's connection on another port may stay silent before it is taken for a protocol whose server speaks first. */
const SERVER_FIRST_MS = 50;
const UPSTREAM_TIMEOUT_MS = 30_000;
/** The most of an answer to a declined WebSocket handshake relayed (it is read whole to be sent with its length); past it, a 502. */
const MAX_DECLINED_ANSWER = 1024 * 1024;
/** How long a connection the gateway ended after an answer may stay half-open (the sandbox reading the answer) before it is closed. */
const ANSWERED_LINGER_MS = 2_000;
const HOP_BY_HOP = new Set(['connection', 'keep-alive', 'proxy-connection', 'proxy-authorization', 'te', 'trailer', 'transfer-encoding', 'upgrade']);

export class EgressGateway {
  private readonly sandboxes = new Map<string, Registered>();
  private readonly via = new WeakMap<object, Via>();
  /** A connection's requests open upstream. */
  private readonly upstreams = new WeakMap<Duplex, Set<http.ClientRequest>>();
  private readonly parser: http.Server;
  private readonly servers: net.Server[] = [];
  private dns: GatewayDnsServer | null = null;
  private readonly httpAgent = new http.Agent({ keepAlive: true, maxFreeSockets: 64 });
  private readonly httpsAgent: https.Agent;
  ports: GatewayPorts = { http: 0, tls: 0, tcp: 0, dns: 0 };
  private readonly sandboxRanges = new net.BlockList();
  private own = { at: 0, addresses: new Set<string>() };

  constructor(
    private readonly options: { ca: CertificateAuthority; upstream: UpstreamResolver; trust: string[] | null; sandboxNetwork: string; logger?: Logger },
  ) {
    const [network, prefix] = options.sandboxNetwork.split('/');
    this.sandboxRanges.addSubnet(network!, Number(prefix), 'ipv4');
    this.httpsAgent = new https.Agent({ keepAlive: true, maxFreeSockets: 64, ca: options.trust ? [...tls.rootCertificates, ...options.trust] : undefined });
    // Strict whatever NODE_OPTIONS say (--insecure-http-parser would take folded headers and CL with TE).
    // A request's headers must be in within HEADERS_TIMEOUT_MS (a silent or dripping connection
    // holds no slot for ever); a body may take its time (an upload). Node checks this only on a
    // server that listens: this one is handed its connections, so its checks are started here.
    this.parser = http.createServer({ requireHostHeader: false, insecureHTTPParser: false, headersTimeout: HEADERS_TIMEOUT_MS, requestTimeout: 0, connectionsCheckingInterval: 5_000 });
    this.parser.emit('listening');
    this.parser.on('request', (req, res) => void this.forward(req, res).catch((err) => this.fail(res, err)));
    this.parser.on('connect', (req: http.IncomingMessage, socket: net.Socket, head: Buffer) => void this.tunnel(req, socket, head).catch(() => socket.destroy()));
    this.parser.on('upgrade', (req: http.IncomingMessage, socket: net.Socket, head: Buffer) => void this.upgrade(req, socket, head).catch(() => socket.destroy()));
    this.parser.on('clientError', (err: NodeJS.ErrnoException, socket: Duplex) => this.unparsable(err, socket));
  }

  /** The runner's gateway as the settings say: the deployment's CA, the upstream resolver, the extra trust for upstreams. */
  static async open(config: Pick<Config, 'dataDir' | 'egressCaCert' | 'egressCaKey' | 'dnsUpstream' | 'egressTrust' | 'sandboxNetwork'>, logger?: Logger): Promise<EgressGateway> {
    const ca = await CertificateAuthority.open({ dir: path.join(config.dataDir, 'egress-ca'), certFile: config.egressCaCert, keyFile: config.egressCaKey });
    const trust = config.egressTrust ? [await fs.promises.readFile(config.egressTrust, 'utf8')] : null;
    const gateway = new EgressGateway({ ca, upstream: new UpstreamResolver(config.dnsUpstream), trust, sandboxNetwork: config.sandboxNetwork, logger });
    await gateway.start();
    return gateway;
  }

  /** The deployment's CA (PEM), which sandboxes trust. */
  get authority(): string {
    return this.options.ca.certPem;
  }

  private async start(): Promise<void> {
    const listen = async (handler: (socket: net.Socket) => void): Promise<number> => {
      const server = net.createServer({ allowHalfOpen: true, noDelay: true }, (socket) => {
        socket.on('error', () => socket.destroy());
        handler(socket);
      });
      this.servers.push(server);
      await new Promise<void>((resolve, reject) => server.once('error', reject).listen(0, '0.0.0.0', () => resolve()));
      return (server.address() as net.AddressInfo).port;
    };
    this.ports.http = await listen((socket) => this.acceptHttp(socket));
    this.ports.tls = await listen((socket) => this.acceptTls(socket));
    this.ports.tcp = await listen((socket) => void this.acceptTcp(socket));
    this.dns = await GatewayDnsServer.start({ host: '0.0.0.0', port: 0, answer: (source, name, type) => this.answer(source, name, type) });
    this.ports.dns = this.dns.port;
  }

  /** From now on the gateway serves the sandbox at `address` under its policy. */
  register(address: string, egress: SandboxEgress): void {
    this.sandboxes.set(address, { ...egress, resolved: new Map(), sockets: new Set(), inflight: 0, recent: new Map() });
  }

  /** Ends the sandbox's connections; its address is unknown again. */
  unregister(address: string): void {
    const sandbox = this.sandboxes.get(address);
    this.sandboxes.delete(address);
    for (const socket of sandbox?.sockets ?? []) socket.destroy();
  }

  async close(): Promise<void> {
    for (const address of [...this.sandboxes.keys()]) this.unregister(address);
    await Promise.all(this.servers.map((s) => new Promise<void>((resolve) => s.close(() => resolve()))));
    await this.dns?.close();
    this.parser.close();
    this.httpAgent.destroy();
    this.httpsAgent.destroy();
  }

  // --- who is asking ----------------------------------------------------------------------

  private sandboxOf(socket: net.Socket): Registered | null {
    const address = (socket.remoteAddress ?? '').replace(/^::ffff:/, '');
    const sandbox = this.sandboxes.get(address) ?? null;
    if (!sandbox) {
      socket.destroy();
      return null;
    }
    if (!this.room(sandbox, socket.localPort ?? 0)) {
      reset(socket);
      return null;
    }
    sandbox.sockets.add(socket);
    socket.once('close', () => sandbox.sockets.delete(socket));
    return sandbox;
  }

  /**
   * Whether the sandbox may open one more connection through the gateway: its own connections and
   * the requests the gateway has open upstream for it (pipelined ones too) count. Recorded, once a
   * second, when not.
   */
  private room(sandbox: Registered, port: number): boolean {
    if (sandbox.sockets.size + sandbox.inflight < MAX_CONNECTIONS_PER_SANDBOX) return true;
    if (firstThisSecond(sandbox, 'connections')) this.deny(sandbox, { protocol: 'tcp', host: null, ip: null, port, reason: FULL });
    return false;
  }

  /**
   * Holds one of the sandbox's slots while `upstream` is open; `from`, the connection it came on,
   * ends it when it closes (a pipelined request's answer waits its turn, with no 'close' of its own).
   */
  private hold(sandbox: Registered, upstream: http.ClientRequest, from?: Duplex): void {
    sandbox.inflight++;
    upstream.once('close', () => sandbox.inflight--);
    if (!from) return;
    let open = this.upstreams.get(from);
    if (!open) {
      const requests = (open = new Set());
      this.upstreams.set(from, requests);
      from.once('close', () => requests.forEach((request) => request.destroy()));
    }
    open.add(upstream);
    upstream.once('close', () => open.delete(upstream));
  }

  /** A `network_denied` record; `ip` is null where the name was refused before it resolved. */
  private deny(sandbox: Registered, details: { protocol: string; host?: string | null; ip?: string | null; port: number; reason: string; [more: string]: unknown }): void {
    sandbox.record('network_denied', { ...details, host: details.host ?? null, ip: details.ip ?? null });
  }

  // --- names ------------------------------------------------------------------------------

  /**
   * The decision for a name: allowed by an override or the policy, with the reason. A
   * `dns_overrides` name reaches a backing service on every port (it is the sandbox's own), an
   * outside replacement on 80 and 443 (what an override is for: a web API sent elsewhere) and on
   * the other ports `network.egress` allows for the replacement.
   */
  private decide(sandbox: Registered, host: string, port: number | null): { allowed: boolean; reason: string } {
    const name = normaliseHost(host);
    if (serviceNamed(sandbox, name)) return { allowed: true, reason: `${name} is a backing service of the sandbox` };
    const to = overrideOf(sandbox, name);
    if (to !== undefined) {
      const sends = `network.dns_overrides sends ${name} to ${to}`;
      if (port === null || port === 80 || port === 443 || serviceNamed(sandbox, to)) return { allowed: true, reason: sends };
      const byReplacement = sandbox.policy.decide(to, port);
      return { allowed: byReplacement.allowed, reason: `${sends}, reached on ports 80 and 443 and otherwise as network.egress allows ${to}: ${byReplacement.reason}` };
    }
    if (port !== null) return sandbox.policy.decide(name, port);
    return sandbox.policy.allowsHost(name)
      ? { allowed: true, reason: `${name} is allowed by network.egress` }
      : { allowed: false, reason: `${name} does not resolve: it matches no entry of network.egress.allow (default ${sandbox.policy.defaultPolicy})` };
  }

  /** The addresses `host` resolves to for this sandbox (override, literal or upstream); remembered. */
  private async resolve(sandbox: Registered, host: string): Promise<string[]> {
    const name = normaliseHost(host);
    if (net.isIP(name)) return [name];
    const target = overrideOf(sandbox, name) ?? name;
    const service = serviceNamed(sandbox, name) ?? serviceNamed(sandbox, target);
    if (service) return [service.address];
    const fixed = sandbox.hosts[target];
    const addresses = net.isIP(target) ? [target] : fixed ? [fixed] : (await this.options.upstream.lookup4(target)).addresses;
    for (const address of addresses) sandbox.resolved.set(address, name);
    return addresses;
  }

  /** The address to connect to for `host`, or why there is none: it does not resolve, or only to places a sandbox never reaches. */
  private async addressFor(sandbox: Registered, host: string): Promise<{ address: string } | { problem: string }> {
    const addresses = await this.resolve(sandbox, host);
    if (addresses.length === 0) return { problem: `${host} does not resolve` };
    const address = addresses.find((a) => this.unreachable(a) === null);
    return address ? { address } : { problem: `${host} resolves to ${addresses[0]}, which is ${this.unreachable(addresses[0]!)}` };
  }

  /**
   * Why a sandbox never reaches `address`, whatever its policy (a name may resolve anywhere, a
   * Host header may be an address): the service host itself, loopback, link-local (where clouds
   * serve instance credentials), multicast, or a sandbox network. Null when it may.
   */
  private unreachable(address: string): string | null {
    const family = net.isIP(address) === 6 ? 'ipv6' : 'ipv4';
    if (this.ownAddresses().has(address.replace(/^::ffff:/, ''))) return 'the service host itself: never reachable from a sandbox';
    for (const [what, list] of NEVER) if (list.check(address, family)) return `${what}: never reachable from a sandbox`;
    if (this.sandboxRanges.check(address, family)) return 'a sandbox network: never reachable from a sandbox';
    return null;
  }

  /** The host's own addresses (read again at most once a second: interfaces come and go). */
  private ownAddresses(): Set<string> {
    if (Date.now() - this.own.at > 1000) {
      this.own = { at: Date.now(), addresses: new Set(Object.values(os.networkInterfaces()).flatMap((list) => (list ?? []).map((i) => i.address))) };
    }
    return this.own.addresses;
  }

  private async answer(source: string, name: string, type: string): Promise<DnsAnswer> {
    const sandbox = this.sandboxes.get(source);
    if (!sandbox) return { kind: 'nxdomain', reason: 'unknown source' };
    const decision = this.decide(sandbox, name, null);
    if (!decision.allowed) {
      if (firstThisSecond(sandbox, `dns ${normaliseHost(name)}`)) this.deny(sandbox, { protocol: 'dns', host: normaliseHost(name), port: 53, reason: decision.reason, query: type });
      return { kind: 'nxdomain', reason: decision.reason };
    }
    if (type !== 'A') return { kind: 'empty' };
    const addresses = await this.resolve(sandbox, name);
    return addresses.length > 0 ? { kind: 'addresses', addresses, ttl: 30 } : { kind: 'nxdomain', reason: `${name} does not resolve upstream` };
  }

  // --- HTTP -------------------------------------------------------------------------------

  private acceptHttp(socket: net.Socket): void {
    const sandbox = this.sandboxOf(socket);
    if (!sandbox) return;
    this.via.set(socket, { sandbox, scheme: 'http', port: 80, serverName: null });
    this.parser.emit('connection', socket);
  }

  /** The host and port a request is for, and what it was checked against. */
  private target(req: http.IncomingMessage, via: Via): { host: string; port: number; path: string } | { problem: string } {
    // A Host without a port names the port the connection came to.
    const defaultPort = via.port;
    const hostHeader = req.headers.host ? splitHostPort(req.headers.host, defaultPort) : null;
    // Never sent on unread: a Host that is not host[:port] (`denied.test:`) may name another host to the upstream.
    if (req.headers.host !== undefined && !hostHeader) return { problem: `the request's Host header ${JSON.stringify(req.headers.host)} is not host[:port]` };
    let url: URL | null = null;
    if (/^[a-z][a-z0-9+.-]*:\/\//i.test(req.url ?? '')) {
      try {
        url = new URL(req.url!);
      } catch {
        return { problem: `the request's URL ${JSON.stringify(req.url)} is not valid` };
      }
    }
    // Two Host headers may be read two ways (RFC 9112 §3.2: a 400); the parser would keep the first.
    if (req.rawHeaders.filter((_v, i) => i % 2 === 0 && /^host$/i.test(req.rawHeaders[i]!)).length > 1) return { problem: 'the request has more than one Host header' };
    const fromUrl = url ? { host: normaliseHost(url.hostname.replace(/^\[|\]$/g, '')), port: Number(url.port) || (url.protocol === 'https:' ? 443 : 80) } : null;
    const where = fromUrl ?? hostHeader;
    if (!where) return { problem: 'the request names no host (no Host header)' };
    // Whatever the request claims, it must agree with where it was sent.
    if (fromUrl && hostHeader && fromUrl.host !== hostHeader.host) return { problem: `the request's URL names ${fromUrl.host} but its Host header ${hostHeader.host}` };
    if (via.serverName && where.host !== via.serverName) return { problem: `the Host ${where.host} is not the TLS server name ${via.serverName} (domain fronting)` };
    const path = url ? `${url.pathname}${url.search}` : (req.url ?? '/');
    return { host: where.host, port: via.serverName ? via.port : where.port, path };
  }

  private async forward(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
    const via = this.via.get(req.socket)!;
    const { sandbox } = via;
    const started = Date.now();
    const target = this.target(req, via);
    const protocol = via.scheme;
    if ('problem' in target) {
      this.deny(sandbox, { protocol, method: req.method, host: req.headers.host ?? null, port: via.port, reason: target.problem });
      return refuse(res, target.problem);
    }
    const service = serviceFor(sandbox, target.host);
    if (service) return this.toService(sandbox, service, req, res, protocol, target, started);
    const decision = this.decide(sandbox, target.host, target.port);
    if (!decision.allowed) {
      this.deny(sandbox, { protocol, method: req.method, host: target.host, port: target.port, path: target.path, reason: decision.reason });
      return refuse(res, decision.reason);
    }
    const reached = await this.addressFor(sandbox, target.host);
    if ('problem' in reached) {
      this.deny(sandbox, { protocol, method: req.method, host: target.host, port: target.port, path: target.path, reason: reached.problem });
      return refuse(res, reached.problem);
    }
    const { address } = reached;
    if (!this.room(sandbox, target.port)) return refuse(res, FULL, 503);
    const headers = upstreamHeaders(sandbox, req, target);
    const call = new HttpCall(sandbox, req, protocol, target, started);
    req.on('data', (chunk: Buffer) => (call.requestBytes += chunk.length));
    const upstream = (protocol === 'https' ? https : http).request({
      host: address,
      port: target.port,
      method: req.method,
      path: target.path,
      headers,
      servername: net.isIP(target.host) ? undefined : target.host,
      agent: protocol === 'https' ? this.httpsAgent : this.httpAgent,
      timeout: UPSTREAM_TIMEOUT_MS,
    });
    this.hold(sandbox, upstream, req.socket);
    upstream.on('timeout', () => upstream.destroy(new Error(`no answer from ${target.host} within ${UPSTREAM_TIMEOUT_MS} ms`)));
    upstream.on('response', (answer) => {
      const out: http.OutgoingHttpHeaders = {};
      for (const [name, value] of Object.entries(answer.headers)) if (!HOP_BY_HOP.has(name)) out[name] = value;
      call.status = answer.statusCode ?? null;
      res.writeHead(answer.statusCode ?? 502, answer.statusMessage, out);
      answer.on('data', (chunk: Buffer) => (call.responseBytes += chunk.length));
      answer.pipe(res);
      answer.on('error', () => res.destroy());
    });
    upstream.on('error', (err) => {
      call.done(err.message);
      if (!res.headersSent) refuse(res, `${target.host}:${target.port} could not be reached: ${err.message}`, 502);
      else res.destroy();
    });
    // Node drops, without an error, an upstream that answers 101 to a request that asked no upgrade: a 502, not a hang.
    upstream.on('close', () => {
      if (res.headersSent || !res.socket || res.socket.destroyed) return;
      call.done('the upstream switched protocols unasked');
      refuse(res, `${target.host}:${target.port} answered 101 to a request that asked no upgrade`, 502);
    });
    // Recorded once the answer reached the sandbox, or when the sandbox went away first (then the
    // upstream goes too: a client that leaves does not keep the runner downloading).
    res.on('finish', () => call.done());
    res.on('close', () => {
      if (res.writableFinished) return;
      upstream.destroy();
      call.done('the sandbox closed the connection before the answer was complete');
    });
    req.pipe(upstream);
  }

  /** A request to a backing service: an http_mock answers it; recorded with the service's name as its host. */
  private toService(sandbox: Registered, service: ServiceEndpoint, req: http.IncomingMessage, res: http.ServerResponse, protocol: 'http' | 'https', target: { host: string; port: number; path: string }, started: number): void {
    const call = new HttpCall(sandbox, req, protocol, { ...target, host: service.name }, started);
    if (!service.http) {
      call.done(`${service.name} does not speak HTTP`);
      return refuse(res, `${service.name} is a backing service that does not speak HTTP`, 502);
    }
    // The mock reads the body itself (it must be the stream's only reader); whole bodies both ways, with their lengths.
    call.requestBytes = Number(req.headers['content-length']) || 0;
    res.on('finish', () => {
      call.status = res.statusCode;
      call.responseBytes = Number(res.getHeader('content-length')) || 0;
      call.done();
    });
    res.on('close', () => call.done(res.writableFinished ? undefined : 'the sandbox closed the connection before the answer was complete'));
    service.http(req, res, target.host);
  }

  /**
   * Record mode of an http_mock: the real host's answer to a request the mock has no route for,
   * under the sandbox's egress policy (never its overrides, which sent the request to the mock),
   * recorded like the sandbox's own calls with the service it came through.
   */
  async fetchOutside(address: string, via: string, request: { method: string; host: string; path: string; headers: Record<string, string>; body: Buffer }, maxBodyBytes: number): Promise<{ status: number; headers: Record<string, string>; body: Buffer; refused?: boolean }> {
    const sandbox = this.sandboxes.get(address);
    if (!sandbox) throw new Error('the sandbox is gone');
    const where = splitHostPort(request.host, 443);
    if (!where) throw new Error(`the request names no valid host (${JSON.stringify(request.host)})`);
    const decision = sandbox.policy.decide(where.host, where.port);
    if (!decision.allowed) {
      this.deny(sandbox, { protocol: 'https', method: request.method, host: where.host, port: where.port, path: request.path, reason: decision.reason, via });
      return { status: 403, headers: { 'content-type': 'text/plain; charset=utf-8' }, body: Buffer.from(`${decision.reason}\n`), refused: true };
    }
    const addresses = net.isIP(where.host) ? [where.host] : (await this.options.upstream.lookup4(where.host)).addresses;
    const target = addresses.find((a) => this.unreachable(a) === null);
    if (!target) throw new Error(`${where.host} does not resolve to a reachable address`);
    if (!this.room(sandbox, where.port)) throw new Error(FULL);
    const started = Date.now();
    const headers: Record<string, string> = {};
    for (const [name, value] of Object.entries(request.headers)) if (!HOP_BY_HOP.has(name.toLowerCase()) && name.toLowerCase() !== 'content-length') headers[name] = value;
    // Framed by its length whatever the method: node frames no GET body by itself (it would read as a second request).
    if (request.body.length > 0) headers['content-length'] = String(request.body.length);
    return new Promise((resolve, reject) => {
      const upstream = https.request({ host: target, port: where.port, method: request.method, path: request.path, headers, servername: net.isIP(where.host) ? undefined : where.host, agent: this.httpsAgent, timeout: UPSTREAM_TIMEOUT_MS }, (answer) => {
        const chunks: Buffer[] = [];
        let size = 0;
        answer.on('data', (chunk: Buffer) => {
          size += chunk.length;
          if (size > maxBodyBytes) return void answer.destroy(new Error(`${where.host}'s answer is over ${maxBodyBytes} bytes`));
          chunks.push(chunk);
        });
        answer.on('error', reject);
        answer.on('end', () => {
          if (sandbox.inspect) sandbox.record('http_call', { method: request.method, scheme: 'https', host: where.host, port: where.port, path: request.path, status: answer.statusCode ?? null, duration_ms: Date.now() - started, request_bytes: request.body.length, response_bytes: size, headers: redactHeaders(request.headers), via });
          const out: Record<string, string> = {};
          for (const [name, value] of Object.entries(answer.headers)) if (!HOP_BY_HOP.has(name) && value !== undefined) out[name] = Array.isArray(value) ? value.join(', ') : value;
          resolve({ status: answer.statusCode ?? 502, headers: out, body: Buffer.concat(chunks) });
        });
      });
      this.hold(sandbox, upstream);
      upstream.on('timeout', () => upstream.destroy(new Error(`no answer from ${where.host} within ${UPSTREAM_TIMEOUT_MS} ms`)));
      upstream.on('error', reject);
      upstream.end(request.body);
    });
  }

  private fail(res: http.ServerResponse, err: Error): void {
    this.options.logger?.warn({ err }, 'egress request failed');
    if (!res.headersSent) refuse(res, `the egress gateway failed: ${err.message}`, 502);
    else res.destroy();
  }

  /**
   * A request the parser refused: malformed, or framed two ways (Content-Length with
   * Transfer-Encoding, two Content-Lengths, a folded header: the stuff of request smuggling).
   * Answered 400 (431 for headers too large), recorded, and the connection ends: nothing after it
   * is read. A request cut short by the sandbox is no refusal (its call is recorded as cut).
   */
  private unparsable(err: NodeJS.ErrnoException & { reason?: string }, socket: Duplex): void {
    const via = this.via.get(socket);
    if (!via || !err.code?.startsWith('HPE_') || err.code === 'HPE_INVALID_EOF_STATE') return void socket.destroy();
    const reason = `the request is not well-formed HTTP/1.1 (${err.reason ?? err.message}); nothing was sent on`;
    this.deny(via.sandbox, { protocol: via.scheme, host: via.serverName, port: via.port, reason });
    rawAnswer(socket, err.code === 'HPE_HEADER_OVERFLOW' ? 431 : 400, reason);
  }

  /** CONNECT host:port (a proxy request, or one relayed through an allowed host): checked like a connection to it. */
  private async tunnel(req: http.IncomingMessage, socket: net.Socket, head: Buffer): Promise<void> {
    const via = this.via.get(req.socket) ?? this.via.get(socket)!;
    const { sandbox } = via;
    const where = splitHostPort(req.url ?? '', 443);
    if (!where) {
      this.deny(sandbox, { protocol: 'connect', host: req.url ?? null, port: 0, reason: 'the CONNECT target is not host:port' });
      return void socket.end('HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n');
    }
    const decision = this.decide(sandbox, where.host, where.port);
    if (!decision.allowed) {
      this.deny(sandbox, { protocol: 'connect', host: where.host, port: where.port, reason: decision.reason });
      return void socket.end(`HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n${decision.reason}\n`);
    }
    socket.write('HTTP/1.1 200 Connection Established\r\n\r\n');
    await this.relay(sandbox, socket, head, where);
  }

  /** A tunnel's bytes: TLS goes through the TLS path for that host, HTTP through the parser, the rest is piped. */
  private async relay(sandbox: Registered, socket: Duplex, head: Buffer, where: { host: string; port: number }): Promise<void> {
    const first = await firstBytes(socket, head);
    if (first === null) return void socket.destroy();
    const hello = readClientHello(first);
    if (hello.state === 'tls') return this.onHello(sandbox, socket, first, hello.serverName ?? where.host, where.port, where.host);
    if (firstKind(first) !== 'other') return this.toParser(socket, first, { sandbox, scheme: 'http', port: where.port, serverName: null });
    await this.pipeTo(sandbox, socket, first, where.host, where.port);
  }

  /**
   * A request to switch protocols. Only to a WebSocket (GET, `Upgrade: websocket`, no body);
   * checked like any request, it goes upstream as a fresh one (upgradeUpstream), and the two
   * connections are joined only once the upstream answers 101. Any other upgrade is refused.
   */
  private async upgrade(req: http.IncomingMessage, socket: Duplex, head: Buffer): Promise<void> {
    const via = this.via.get(req.socket) ?? this.via.get(socket)!;
    const { sandbox } = via;
    const target = this.target(req, via);
    const where = 'problem' in target ? { host: req.headers.host ?? null, port: via.port, path: req.url } : target;
    const refuseWith = (reason: string, status = 403) => {
      this.deny(sandbox, { protocol: via.scheme, method: req.method, ...where, upgrade: req.headers.upgrade, reason });
      rawAnswer(socket, status, reason);
    };
    if ('problem' in target) return refuseWith(target.problem);
    const protocol = String(req.headers.upgrade).trim().toLowerCase();
    if (protocol !== 'websocket') return refuseWith(`the egress gateway upgrades a connection only to a WebSocket, not to ${JSON.stringify(req.headers.upgrade)}`);
    if (req.method !== 'GET') return refuseWith(`a WebSocket opens with a GET, not a ${req.method}`, 400);
    if (req.headers['transfer-encoding'] !== undefined || Number(req.headers['content-length'] ?? 0) !== 0) return refuseWith('a WebSocket handshake has no body', 400);
    if (serviceFor(sandbox, target.host)) return rawAnswer(socket, 501, 'backing services do not upgrade connections');
    const decision = this.decide(sandbox, target.host, target.port);
    if (!decision.allowed) return refuseWith(decision.reason);
    const reached = await this.addressFor(sandbox, target.host);
    if ('problem' in reached) return refuseWith(reached.problem);
    this.upgradeUpstream(via, req, socket, head, target, reached.address);
  }

  /**
   * The WebSocket handshake upstream, as a request of its own. On its 101 the two connections
   * are joined (the WebSocket's frames are not read; the http_call, status 101, is recorded with
   * its bytes both ways when it closes). Any other answer is relayed, and the connection goes
   * back to the parser: nothing the sandbox sent after the handshake leaves without being parsed.
   */
  private upgradeUpstream(via: Via, req: http.IncomingMessage, socket: Duplex, head: Buffer, target: { host: string; port: number; path: string }, address: string): void {
    const { sandbox } = via;
    const call = new HttpCall(sandbox, req, via.scheme, target, Date.now(), { upgrade: 'websocket' });
    const headers = { ...upstreamHeaders(sandbox, req, target), connection: 'Upgrade', upgrade: 'websocket' };
    const upstream = (via.scheme === 'https' ? https : http).request({
      host: address,
      port: target.port,
      method: 'GET',
      path: target.path,
      headers,
      servername: net.isIP(target.host) ? undefined : target.host,
      ca: this.httpsAgent.options.ca,
      agent: false,
      timeout: UPSTREAM_TIMEOUT_MS,
    });
    upstream.on('timeout', () => upstream.destroy(new Error(`no answer from ${target.host} within ${UPSTREAM_TIMEOUT_MS} ms`)));
    let answered = false;
    let joined = false;
    // Until joined nothing went back: a failure (the declined answer over its cap too) is one 502, whichever end reports it first.
    const failed = (message: string) => (joined ? socket.destroy() : socket.writable && rawAnswer(socket, 502, message));
    upstream.on('error', (err) => {
      call.done(err.message);
      failed(answered ? err.message : `${target.host}:${target.port} could not be reached: ${err.message}`);
    });
    upstream.on('upgrade', (answer: http.IncomingMessage, tunnel: net.Socket, upstreamHead: Buffer) => {
      answered = joined = true;
      call.status = 101;
      socket.write(`HTTP/1.1 101 ${answer.statusMessage || 'Switching Protocols'}\r\n${rawHeaderLines(answer.rawHeaders)}\r\n`);
      if (upstreamHead.length > 0) socket.write(upstreamHead);
      if (head.length > 0) tunnel.write(head);
      call.requestBytes = head.length;
      call.responseBytes = upstreamHead.length;
      tunnel.on('data', (chunk: Buffer) => (call.responseBytes += chunk.length));
      socket.on('data', (chunk: Buffer) => (call.requestBytes += chunk.length));
      tunnel.on('error', (err) => call.done(err.message));
      socket.once('close', () => call.done());
      join(socket, tunnel, sandbox);
    });
    upstream.on('response', (answer: http.IncomingMessage) => {
      // Declined: the answer goes back whole, with its length, and the connection goes on as
      // HTTP/1.1 (as with a server that declines an upgrade): what the sandbox sends next is
      // parsed and checked like any request, never piped.
      answered = true;
      call.status = answer.statusCode ?? null;
      const chunks: Buffer[] = [];
      answer.on('data', (chunk: Buffer) => {
        call.responseBytes += chunk.length;
        if (call.responseBytes <= MAX_DECLINED_ANSWER) return void chunks.push(chunk);
        answer.destroy(new Error(`the answer to a WebSocket handshake ${target.host} declined is over ${MAX_DECLINED_ANSWER} bytes`));
      });
      answer.on('error', (err) => {
        call.done(err.message);
        failed(err.message);
      });
      answer.once('close', () => call.done(answer.complete ? undefined : 'the sandbox closed the connection before the answer was complete'));
      socket.once('close', () => answer.destroy());
      answer.on('end', () => {
        call.done();
        if (socket.destroyed) return;
        const kept: string[] = [];
        for (let i = 0; i < answer.rawHeaders.length; i += 2) if (!HOP_BY_HOP.has(answer.rawHeaders[i]!.toLowerCase()) && answer.rawHeaders[i]!.toLowerCase() !== 'content-length') kept.push(answer.rawHeaders[i]!, answer.rawHeaders[i + 1]!);
        const body = Buffer.concat(chunks);
        socket.write(`HTTP/1.1 ${answer.statusCode} ${answer.statusMessage ?? ''}\r\n${rawHeaderLines([...kept, 'Content-Length', String(body.length)])}\r\n`);
        socket.write(body);
        this.toParser(socket, head, via);
      });
    });
    socket.once('close', () => {
      if (answered) return;
      upstream.destroy();
      call.done('the sandbox closed the connection before the answer was complete');
    });
    upstream.end();
  }

  // --- TLS --------------------------------------------------------------------------------

  private acceptTls(socket: net.Socket): void {
    const sandbox = this.sandboxOf(socket);
    if (!sandbox) return;
    void (async () => {
      const first = await firstBytes(socket, Buffer.alloc(0));
      if (first === null) return void socket.destroy();
      const hello = readClientHello(first);
      if (hello.state !== 'tls' || !hello.serverName) {
        const destination = await originalDestination(peerOf(socket), localOf(socket), 'tcp');
        if (!destination) return void socket.destroy();
        if (hello.state === 'tls') return this.namelessHello(sandbox, socket, first, destination);
        return this.byDestination(sandbox, socket, first, destination, 'tcp');
      }
      await this.onHello(sandbox, socket, first, hello.serverName, 443, null);
    })().catch(() => socket.destroy());
  }

  /** A ClientHello for `serverName`: refused, passed through, or terminated to see the HTTP inside. */
  private async onHello(sandbox: Registered, socket: Duplex, first: Buffer, serverName: string, port: number, tunnelHost: string | null): Promise<void> {
    const name = normaliseHost(serverName);
    if (tunnelHost !== null && normaliseHost(tunnelHost) !== name) {
      const reason = `the TLS server name ${name} is not the tunnel's host ${tunnelHost} (domain fronting)`;
      this.deny(sandbox, { protocol: 'tls', host: name, port, reason });
      return void reset(socket);
    }
    const decision = this.decide(sandbox, name, port);
    const brokered = sandbox.brokered.some((b) => b.hosts.decide(name, port).allowed);
    if (!decision.allowed) {
      this.deny(sandbox, { protocol: 'tls', host: name, port, reason: decision.reason });
      // Inspecting, the refusal can be said in HTTP; otherwise the connection is reset.
      if (!sandbox.inspect) return void reset(socket);
    }
    // A backing service's HTTPS is always terminated: the service is the gateway's own to answer.
    const service = serviceFor(sandbox, name);
    if (service && !service.http) return void reset(socket);
    if (!sandbox.inspect && !brokered && !service) return this.pipeTo(sandbox, socket, first, name, port);
    const secureContext = await this.options.ca.secureContextFor(name);
    const terminated = new tls.TLSSocket(wrap(socket, first), { isServer: true, secureContext, ALPNProtocols: ['http/1.1'] });
    terminated.on('error', () => socket.destroy());
    if (!decision.allowed) {
      terminated.once('secure', () => terminated.end(`HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: ${Buffer.byteLength(decision.reason) + 1}\r\n\r\n${decision.reason}\n`));
      return;
    }
    this.via.set(terminated, { sandbox, scheme: 'https', port, serverName: name });
    this.parser.emit('connection', terminated);
  }

  /**
   * A ClientHello without a server name: known by where it was sent. The name the sandbox resolved
   * to that address (or the service there) stands for the server name, so the connection is
   * checked, inspected and recorded as a named one would be; with inspection, one to a literal
   * address is inspected under that address. Otherwise it goes the way of any TCP.
   */
  private namelessHello(sandbox: Registered, socket: Duplex, first: Buffer, destination: { address: string; port: number }): Promise<void> {
    const service = sandbox.services.find((s) => s.address === destination.address);
    if (service?.connect) return Promise.resolve(this.connectService(sandbox, service, socket, first, destination));
    const name = service?.name ?? sandbox.resolved.get(destination.address) ?? (sandbox.inspect ? destination.address : null);
    if (name === null) return this.byDestination(sandbox, socket, first, destination, 'tls');
    return this.onHello(sandbox, socket, first, name, destination.port, null);
  }

  // --- other TCP and UDP ------------------------------------------------------------------

  private async acceptTcp(socket: net.Socket): Promise<void> {
    const sandbox = this.sandboxOf(socket);
    if (!sandbox) return;
    const destination = await originalDestination(peerOf(socket), localOf(socket), 'tcp');
    if (!destination) return void reset(socket);
    await this.byDestination(sandbox, socket, Buffer.alloc(0), destination, 'tcp');
  }

  /** A connection known only by the address it was sent to: by the name that address was resolved for, if any. */
  private async byDestination(sandbox: Registered, socket: Duplex, first: Buffer, destination: { address: string; port: number }, protocol: string): Promise<void> {
    const service = sandbox.services.find((s) => s.address === destination.address);
    if (service) return this.connectService(sandbox, service, socket, first, destination);
    const name = sandbox.resolved.get(destination.address) ?? null;
    const never = this.unreachable(destination.address);
    if (never) {
      this.deny(sandbox, { protocol, host: name, ip: destination.address, port: destination.port, reason: `${destination.address} is ${never}` });
      return void reset(socket);
    }
    const decision = name === null
      ? { allowed: sandbox.policy.decide(destination.address, destination.port).allowed, reason: sandbox.policy.decide(destination.address, destination.port).reason }
      : this.decide(sandbox, name, destination.port);
    if (!decision.allowed) {
      this.deny(sandbox, { protocol, host: name, ip: destination.address, port: destination.port, reason: name === null ? `${destination.address} was not resolved for an allowed name, and ${decision.reason}` : decision.reason });
      return void reset(socket);
    }
    if (first.length === 0) return this.sniff(sandbox, socket, destination);
    // HTTP sent to the TLS port is read as HTTP too (and what never told): checked and recorded, never piped unseen.
    if (['http', 'incomplete'].includes(firstKind(first))) return this.toParser(socket, first, { sandbox, scheme: 'http', port: destination.port, serverName: null });
    const upstream = net.connect({ host: destination.address, port: destination.port });
    upstream.write(first);
    join(socket, upstream, sandbox);
  }

  /** Hands a connection (its `first` bytes ahead) to the HTTP parser: each request is checked and recorded. */
  private toParser(socket: Duplex, first: Buffer, via: Via): void {
    const plain = wrap(socket, first);
    this.via.set(plain, via);
    this.parser.emit('connection', plain);
  }

  /** A connection to a backing service's address: a database gets its bytes (observed), an http_mock its requests. */
  private connectService(sandbox: Registered, service: ServiceEndpoint, socket: Duplex, first: Buffer, destination: { address: string; port: number }): void {
    if (!service.connect && first.length > 0) return firstKind(first) === 'other' ? reset(socket) : this.toParser(socket, first, { sandbox, scheme: 'http', port: destination.port, serverName: null });
    if (!service.connect) return this.sniff(sandbox, socket, destination, service);
    const upstream = service.connect();
    const observer = service.observe?.() ?? null;
    if (observer) {
      if (first.length > 0) observer.fromClient(first);
      socket.on('data', (chunk: Buffer) => observer.fromClient(chunk));
      upstream.on('data', (chunk: Buffer) => observer.fromServer(chunk));
      upstream.once('close', () => observer.close());
    }
    if (first.length > 0) upstream.write(first);
    join(socket, upstream, sandbox);
  }

  /**
   * Whoever speaks first on an allowed connection says what it is. The sandbox's first bytes, read
   * until they tell (firstKind): an HTTP request or a ClientHello goes the way of ports 80 and 443
   * (checked by its host, and recorded), whatever the port; anything else is piped. A sandbox
   * silent for SERVER_FIRST_MS may be waiting for a server that greets first (SMTP, MySQL): the
   * connection is made then, and piped if the server speaks before the sandbox. An HTTP server
   * never does, so neither silence nor a request line split over packets gets HTTP past the parser.
   */
  private sniff(sandbox: Registered, socket: Duplex, destination: { address: string; port: number }, service?: ServiceEndpoint): void {
    const greeted = new AbortController();
    let upstream: net.Socket | null = null;
    const onGreeting = (greeting: Buffer) => {
      upstream!.pause();
      upstream!.unshift(greeting);
      greeted.abort();
    };
    // An http_mock's address is not a place outside: nothing there greets, and what is not HTTP goes nowhere.
    const greet = service ? undefined : setTimeout(() => {
      upstream = net.connect({ host: destination.address, port: destination.port });
      upstream.on('error', () => socket.destroy()).once('data', onGreeting);
    }, SERVER_FIRST_MS);
    void firstBytes(socket, Buffer.alloc(0), { patient: true, stop: greeted.signal }).then((first) => {
      clearTimeout(greet);
      upstream?.off('data', onGreeting);
      const kind = first === null ? null : greeted.signal.aborted ? 'other' : firstKind(first);
      if (kind !== 'other') upstream?.destroy();
      if (first === null) return void socket.destroy();
      if (kind === 'tls') {
        const { serverName } = readClientHello(first) as { serverName: string | null };
        return serverName ? this.onHello(sandbox, socket, first, serverName, destination.port, null) : this.namelessHello(sandbox, socket, first, destination);
      }
      if (kind !== 'other') return this.toParser(socket, first, { sandbox, scheme: 'http', port: destination.port, serverName: null });
      if (service) return reset(socket);
      const to = upstream ?? net.connect({ host: destination.address, port: destination.port });
      if (first.length > 0) to.write(first);
      join(socket, to, sandbox);
    }).catch(() => socket.destroy());
  }

  /**
   * Pipes to `host`:`port` as this sandbox resolves it, `first` ahead of the rest. A backing
   * service's name (a CONNECT to `db:5432`) goes to the service, never to its address outside.
   */
  private async pipeTo(sandbox: Registered, socket: Duplex, first: Buffer, host: string, port: number): Promise<void> {
    const service = serviceFor(sandbox, host);
    if (service?.connect) return this.connectService(sandbox, service, socket, first, { address: service.address, port });
    if (service) return void reset(socket);
    const reached = await this.addressFor(sandbox, host);
    if ('problem' in reached) {
      this.deny(sandbox, { protocol: 'tls', host, port, reason: reached.problem });
      return void reset(socket);
    }
    const upstream = net.connect({ host: reached.address, port });
    if (first.length > 0) upstream.write(first);
    join(socket, upstream, sandbox);
  }

  /** UDP the runtime refused (anything but DNS never leaves): recorded, once per destination and second. */
  refusedUdp(source: string, destination: { address: string; port: number }): void {
    const sandbox = this.sandboxes.get(source);
    if (!sandbox || !firstThisSecond(sandbox, `udp ${destination.address}:${destination.port}`)) return;
    this.deny(sandbox, { protocol: 'udp', host: sandbox.resolved.get(destination.address) ?? null, ip: destination.address, port: destination.port, reason: 'UDP leaves a sandbox only as DNS to its own resolver' });
  }

}

/** One HTTP request of a sandbox, recorded once (`audit.http_calls`) when it is done, however it ended. */
class HttpCall {
  requestBytes = 0;
  responseBytes = 0;
  status: number | null = null;
  private recorded = false;

  constructor(
    private readonly sandbox: Registered,
    private readonly req: http.IncomingMessage,
    private readonly scheme: 'http' | 'https',
    private readonly target: { host: string; port: number; path: string },
    private readonly started: number,
    private readonly extra: Record<string, unknown> = {},
  ) {}

  done(error?: string): void {
    if (this.recorded || !this.sandbox.inspect) return;
    this.recorded = true;
    this.sandbox.record('http_call', {
      method: this.req.method,
      scheme: this.scheme,
      host: this.target.host,
      port: this.target.port,
      path: this.target.path,
      status: this.status,
      duration_ms: Date.now() - this.started,
      request_bytes: this.requestBytes,
      response_bytes: this.responseBytes,
      headers: redactHeaders(this.req.headers),
      ...this.extra,
      ...(error ? { error } : {}),
    });
  }
}

/**
 * A request's headers as they go upstream, in a fresh request of their own: without hop-by-hop
 * ones (nor those its Connection header names), with the brokered credentials for its host, and
 * the body framed again as the parser read it (its Content-Length, or chunked when it came
 * chunked), so that the upstream reads one request where the sandbox sent one, whatever the
 * method (node frames no body of a GET it was not told the length of: it would read as a second
 * request).
 */
function upstreamHeaders(sandbox: Registered, req: http.IncomingMessage, target: { host: string; port: number }): http.OutgoingHttpHeaders {
  const named = new Set(String(req.headers.connection ?? '').toLowerCase().split(',').map((name) => name.trim()));
  const headers: http.OutgoingHttpHeaders = {};
  for (const [name, value] of Object.entries(req.headers)) if (!HOP_BY_HOP.has(name) && !named.has(name)) headers[name] = value;
  for (const broker of sandbox.brokered) if (broker.hosts.decide(target.host, target.port).allowed) headers[broker.header.toLowerCase()] = broker.value;
  delete headers['content-length'];
  // The parser refused both at once, and a request's Transfer-Encoding that does not end in chunked.
  if (req.headers['transfer-encoding'] !== undefined) headers['transfer-encoding'] = 'chunked';
  else if (req.headers['content-length'] !== undefined) headers['content-length'] = req.headers['content-length'];
  const authority = net.isIPv6(target.host) ? `[${target.host}]` : target.host;
  headers.host = req.headers.host ?? (target.port === 80 || target.port === 443 ? authority : `${authority}:${target.port}`);
  return headers;
}

/** The backing service of this name, if any. */
function serviceNamed(sandbox: Registered, name: string): ServiceEndpoint | undefined {
  return sandbox.services.find((s) => s.name === name);
}

/** The backing service a request's host reaches: by its name, a dns override sending a name to it, or its address. */
function serviceFor(sandbox: Registered, host: string): ServiceEndpoint | undefined {
  const name = normaliseHost(host);
  return serviceNamed(sandbox, name) ?? serviceNamed(sandbox, overrideOf(sandbox, name) ?? name) ?? sandbox.services.find((s) => s.address === name);
}

/** Where `dns_overrides` sends `name`, if anywhere (its own entries only: `constructor` is no override). */
function overrideOf(sandbox: Registered, name: string): string | undefined {
  return Object.hasOwn(sandbox.dnsOverrides, name) ? sandbox.dnsOverrides[name] : undefined;
}

/** Whether `what` was not yet refused this second: a flood of datagrams or lookups is not a flood of records. */
function firstThisSecond(sandbox: Registered, what: string): boolean {
  const second = Math.floor(Date.now() / 1000);
  if (sandbox.recent.get(what) === second) return false;
  if (sandbox.recent.size > 1000) sandbox.recent.clear();
  sandbox.recent.set(what, second);
  return true;
}

/** A refused connection: a TCP reset where the socket is a real one. */
function reset(socket: Duplex): void {
  if (socket instanceof net.Socket && !socket.destroyed) socket.resetAndDestroy();
  else socket.destroy();
}

/** An answer written on a connection the parser let go of (an upgrade's, or one it could not parse); the connection ends with it. */
function rawAnswer(socket: Duplex, status: number, reason: string): void {
  const body = `${reason}\n`;
  const lines = rawHeaderLines(['Content-Type', 'text/plain; charset=utf-8', 'Content-Length', String(Buffer.byteLength(body)), 'X-Svc-Egress', status < 500 ? 'denied' : 'failed', 'Connection', 'close']);
  if (!socket.writable) return void socket.destroy();
  socket.write(`HTTP/1.1 ${status} ${http.STATUS_CODES[status] ?? ''}\r\n${lines}\r\n${body}`);
  endAnswered(socket);
}

/** Ends a connection after its last answer: what the sandbox still sends is read and dropped (never sent on), and it is closed soon whatever the sandbox does. */
function endAnswered(socket: Duplex): void {
  socket.end();
  socket.resume();
  setTimeout(() => socket.destroy(), ANSWERED_LINGER_MS).unref();
}

/** `[name, value, name, value...]` as header lines, each ending in CRLF (node's parser let no CR or LF into them). */
function rawHeaderLines(raw: string[]): string {
  let lines = '';
  for (let i = 0; i + 1 < raw.length; i += 2) lines += `${raw[i]}: ${raw[i + 1]}\r\n`;
  return lines;
}

function refuse(res: http.ServerResponse, reason: string, status = 403): void {
  const body = `${reason}\n`;
  res.writeHead(status, { 'content-type': 'text/plain; charset=utf-8', 'content-length': Buffer.byteLength(body), 'x-svc-egress': status === 403 ? 'denied' : 'failed' });
  res.end(body);
}

function splitHostPort(value: string, defaultPort: number): { host: string; port: number } | null {
  const match = /^(?:\[([0-9a-fA-F:.]+)\]|([^:\s/]+))(?::(\d{1,5}))?$/.exec(value.trim());
  if (!match) return null;
  const port = match[3] ? Number(match[3]) : defaultPort;
  if (port < 1 || port > 65535) return null;
  return { host: normaliseHost(match[1] ?? match[2]!), port };
}

/** The two ends of an accepted connection, as connection tracking names them. */
const peerOf = (socket: net.Socket) => ({ address: socket.remoteAddress ?? '', port: socket.remotePort ?? 0 });
const localOf = (socket: net.Socket) => ({ address: socket.localAddress ?? '', port: socket.localPort ?? 0 });

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
function firstKind(buf: Buffer): 'tls' | 'http' | 'other' | 'incomplete' {
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
function firstBytes(socket: Duplex, head: Buffer, options: { patient?: boolean; stop?: AbortSignal } = {}): Promise<Buffer | null> {
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
function wrap(socket: Duplex, first: Buffer): Duplex {
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

/** Both ways, half-open, ended together; the upstream is counted among the sandbox's sockets. */
function join(inbound: Duplex, upstream: net.Socket, sandbox: Registered): void {
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
