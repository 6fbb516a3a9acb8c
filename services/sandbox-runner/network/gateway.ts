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
 *
 * This file takes the connections and routes them (CONNECT, TLS, any other TCP); its parts are
 * in gateway/: what is known of a sandbox (sandbox-egress.ts), names and decisions
 * (destinations.ts), what a connection's first bytes are (first-bytes.ts), HTTP requests
 * (http-relay.ts, http-request.ts), WebSocket upgrades (websocket-upgrade.ts) and the ends of a
 * connection (sockets.ts).
 */
import type { Duplex } from 'node:stream';
import fs from 'node:fs';
import path from 'node:path';
import type http from 'node:http';
import net from 'node:net';
import tls from 'node:tls';
import { normaliseHost } from '../../domain/egress-policy.ts';
import type { Logger } from '../../kernel/logger.ts';
import type { Config } from '../../kernel/config.ts';
import { CertificateAuthority } from './certificate-authority.ts';
import { readClientHello } from './client-hello.ts';
import { GatewayDnsServer, UpstreamResolver, type DnsAnswer } from './dns-server.ts';
import { decide, Destinations } from './gateway/destinations.ts';
import { firstBytes, firstKind, wrap } from './gateway/first-bytes.ts';
import { HttpRelay } from './gateway/http-relay.ts';
import { splitHostPort } from './gateway/http-request.ts';
import { deny, firstThisSecond, room, serviceFor, type Registered, type SandboxEgress, type ServiceEndpoint, type Via } from './gateway/sandbox-egress.ts';
import { join, localOf, peerOf, reset } from './gateway/sockets.ts';
import { originalDestination, type GatewayPorts } from '../runtimes/local/local-network.ts';

/** How long a sandbox's connection on another port may stay silent before it is taken for a protocol whose server speaks first. */
const SERVER_FIRST_MS = 50;

export class EgressGateway {
  private readonly sandboxes = new Map<string, Registered>();
  private readonly servers: net.Server[] = [];
  private dns: GatewayDnsServer | null = null;
  ports: GatewayPorts = { http: 0, tls: 0, tcp: 0, dns: 0 };
  private readonly destinations: Destinations;
  private readonly httpRelay: HttpRelay;

  constructor(
    private readonly options: { ca: CertificateAuthority; upstream: UpstreamResolver; trust: string[] | null; sandboxNetwork: string; logger?: Logger },
  ) {
    this.destinations = new Destinations(options.upstream, options.sandboxNetwork);
    this.httpRelay = new HttpRelay(this.destinations, {
      trust: options.trust,
      tunnel: (req, socket, head, via) => this.tunnel(req, socket, head, via),
      logger: options.logger,
    });
  }

  /** The runner's gateway as the settings say: the deployment's CA, the upstream resolver, the extra trust for upstreams. */
  static async open(
    config: Pick<Config, 'dataDir' | 'egressCaCert' | 'egressCaKey' | 'dnsUpstream' | 'egressTrust' | 'sandboxNetwork'>,
    logger?: Logger,
  ): Promise<EgressGateway> {
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
    this.httpRelay.close();
  }

  // --- who is asking ----------------------------------------------------------------------

  private sandboxOf(socket: net.Socket): Registered | null {
    const address = (socket.remoteAddress ?? '').replace(/^::ffff:/, '');
    const sandbox = this.sandboxes.get(address) ?? null;
    if (!sandbox) {
      socket.destroy();
      return null;
    }
    if (!room(sandbox, socket.localPort ?? 0)) {
      reset(socket);
      return null;
    }
    sandbox.sockets.add(socket);
    socket.once('close', () => sandbox.sockets.delete(socket));
    return sandbox;
  }

  // --- DNS --------------------------------------------------------------------------------

  private async answer(source: string, name: string, type: string): Promise<DnsAnswer> {
    const sandbox = this.sandboxes.get(source);
    if (!sandbox) return { kind: 'nxdomain', reason: 'unknown source' };
    const decision = decide(sandbox, name, null);
    if (!decision.allowed) {
      if (firstThisSecond(sandbox, `dns ${normaliseHost(name)}`))
        deny(sandbox, { protocol: 'dns', host: normaliseHost(name), port: 53, reason: decision.reason, query: type });
      return { kind: 'nxdomain', reason: decision.reason };
    }
    if (type !== 'A') return { kind: 'empty' };
    const addresses = await this.destinations.resolve(sandbox, name);
    return addresses.length > 0 ? { kind: 'addresses', addresses, ttl: 30 } : { kind: 'nxdomain', reason: `${name} does not resolve upstream` };
  }

  // --- HTTP -------------------------------------------------------------------------------

  private acceptHttp(socket: net.Socket): void {
    const sandbox = this.sandboxOf(socket);
    if (!sandbox) return;
    this.httpRelay.serve(socket, { sandbox, scheme: 'http', port: 80, serverName: null });
  }

  /**
   * Record mode of an http_mock: the real host's answer to a request the mock has no route for,
   * under the sandbox's egress policy (never its overrides, which sent the request to the mock),
   * recorded like the sandbox's own calls with the service it came through.
   */
  async fetchOutside(
    address: string,
    via: string,
    request: { method: string; host: string; path: string; headers: Record<string, string>; body: Buffer },
    maxBodyBytes: number,
  ): Promise<{ status: number; headers: Record<string, string>; body: Buffer; refused?: boolean }> {
    const sandbox = this.sandboxes.get(address);
    if (!sandbox) throw new Error('the sandbox is gone');
    return this.httpRelay.fetchOutside(sandbox, via, request, maxBodyBytes);
  }

  // --- CONNECT ----------------------------------------------------------------------------

  /** CONNECT host:port (a proxy request, or one relayed through an allowed host): checked like a connection to it. */
  private async tunnel(req: http.IncomingMessage, socket: net.Socket, head: Buffer, via: Via): Promise<void> {
    const { sandbox } = via;
    const where = splitHostPort(req.url ?? '', 443);
    if (!where) {
      deny(sandbox, { protocol: 'connect', host: req.url ?? null, port: 0, reason: 'the CONNECT target is not host:port' });
      return void socket.end('HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n');
    }
    const decision = decide(sandbox, where.host, where.port);
    if (!decision.allowed) {
      deny(sandbox, { protocol: 'connect', host: where.host, port: where.port, reason: decision.reason });
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
    if (firstKind(first) !== 'other') return this.httpRelay.toParser(socket, first, { sandbox, scheme: 'http', port: where.port, serverName: null });
    await this.pipeTo(sandbox, socket, first, where.host, where.port);
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
      deny(sandbox, { protocol: 'tls', host: name, port, reason });
      return void reset(socket);
    }
    const decision = decide(sandbox, name, port);
    const brokered = sandbox.brokered.some((b) => b.hosts.decide(name, port).allowed);
    if (!decision.allowed) {
      deny(sandbox, { protocol: 'tls', host: name, port, reason: decision.reason });
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
      terminated.once('secure', () =>
        terminated.end(
          `HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: ${Buffer.byteLength(decision.reason) + 1}\r\n\r\n${decision.reason}\n`,
        ),
      );
      return;
    }
    this.httpRelay.serve(terminated, { sandbox, scheme: 'https', port, serverName: name });
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
  private async byDestination(
    sandbox: Registered,
    socket: Duplex,
    first: Buffer,
    destination: { address: string; port: number },
    protocol: string,
  ): Promise<void> {
    const service = sandbox.services.find((s) => s.address === destination.address);
    if (service) return this.connectService(sandbox, service, socket, first, destination);
    const name = sandbox.resolved.get(destination.address) ?? null;
    const never = this.destinations.unreachable(destination.address);
    if (never) {
      deny(sandbox, { protocol, host: name, ip: destination.address, port: destination.port, reason: `${destination.address} is ${never}` });
      return void reset(socket);
    }
    const decision =
      name === null
        ? {
            allowed: sandbox.policy.decide(destination.address, destination.port).allowed,
            reason: sandbox.policy.decide(destination.address, destination.port).reason,
          }
        : decide(sandbox, name, destination.port);
    if (!decision.allowed) {
      deny(sandbox, {
        protocol,
        host: name,
        ip: destination.address,
        port: destination.port,
        reason: name === null ? `${destination.address} was not resolved for an allowed name, and ${decision.reason}` : decision.reason,
      });
      return void reset(socket);
    }
    if (first.length === 0) return this.sniff(sandbox, socket, destination);
    // HTTP sent to the TLS port is read as HTTP too (and what never told): checked and recorded, never piped unseen.
    if (['http', 'incomplete'].includes(firstKind(first)))
      return this.httpRelay.toParser(socket, first, { sandbox, scheme: 'http', port: destination.port, serverName: null });
    const upstream = net.connect({ host: destination.address, port: destination.port });
    upstream.write(first);
    join(socket, upstream, sandbox);
  }

  /** A connection to a backing service's address: a database gets its bytes (observed), an http_mock its requests. */
  private connectService(sandbox: Registered, service: ServiceEndpoint, socket: Duplex, first: Buffer, destination: { address: string; port: number }): void {
    if (!service.connect && first.length > 0)
      return firstKind(first) === 'other'
        ? reset(socket)
        : this.httpRelay.toParser(socket, first, { sandbox, scheme: 'http', port: destination.port, serverName: null });
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
    const greet = service
      ? undefined
      : setTimeout(() => {
          upstream = net.connect({ host: destination.address, port: destination.port });
          upstream.on('error', () => socket.destroy()).once('data', onGreeting);
        }, SERVER_FIRST_MS);
    void firstBytes(socket, Buffer.alloc(0), { patient: true, stop: greeted.signal })
      .then((first) => {
        clearTimeout(greet);
        upstream?.off('data', onGreeting);
        const kind = first === null ? null : greeted.signal.aborted ? 'other' : firstKind(first);
        if (kind !== 'other') upstream?.destroy();
        if (first === null) return void socket.destroy();
        if (kind === 'tls') {
          const { serverName } = readClientHello(first) as { serverName: string | null };
          return serverName
            ? this.onHello(sandbox, socket, first, serverName, destination.port, null)
            : this.namelessHello(sandbox, socket, first, destination);
        }
        if (kind !== 'other') return this.httpRelay.toParser(socket, first, { sandbox, scheme: 'http', port: destination.port, serverName: null });
        if (service) return reset(socket);
        const to = upstream ?? net.connect({ host: destination.address, port: destination.port });
        if (first.length > 0) to.write(first);
        join(socket, to, sandbox);
      })
      .catch(() => socket.destroy());
  }

  /**
   * Pipes to `host`:`port` as this sandbox resolves it, `first` ahead of the rest. A backing
   * service's name (a CONNECT to `db:5432`) goes to the service, never to its address outside.
   */
  private async pipeTo(sandbox: Registered, socket: Duplex, first: Buffer, host: string, port: number): Promise<void> {
    const service = serviceFor(sandbox, host);
    if (service?.connect) return this.connectService(sandbox, service, socket, first, { address: service.address, port });
    if (service) return void reset(socket);
    const reached = await this.destinations.addressFor(sandbox, host);
    if ('problem' in reached) {
      deny(sandbox, { protocol: 'tls', host, port, reason: reached.problem });
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
    deny(sandbox, {
      protocol: 'udp',
      host: sandbox.resolved.get(destination.address) ?? null,
      ip: destination.address,
      port: destination.port,
      reason: 'UDP leaves a sandbox only as DNS to its own resolver',
    });
  }
}
