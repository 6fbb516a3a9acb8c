/**
 * WebSocket upgrades through the gateway: checked like any request, the handshake goes upstream
 * as a fresh request, and the sandbox's connection is joined to the upstream's only on its 101;
 * a declined handshake is answered and the connection goes back to the HTTP parser.
 */
import type { Duplex } from 'node:stream';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import { decide, type Destinations } from './destinations.ts';
import { HOP_BY_HOP, HttpCall, requestTarget, UPSTREAM_TIMEOUT_MS, upstreamHeaders } from './http-request.ts';
import { deny, serviceFor, type Via } from './sandbox-egress.ts';
import { join, rawAnswer, rawHeaderLines } from './sockets.ts';

/** The most of an answer to a declined WebSocket handshake relayed (it is read whole to be sent with its length); past it, a 502. */
const MAX_DECLINED_ANSWER = 1024 * 1024;

export class WebSocketUpgrades {
  constructor(
    private readonly destinations: Destinations,
    /** what the upstream's certificate is checked against (the gateway's HTTPS agent's trust) */
    private readonly ca: https.AgentOptions['ca'],
    /** hands a connection back to the HTTP parser, its `first` bytes ahead */
    private readonly toParser: (socket: Duplex, first: Buffer, via: Via) => void,
  ) {}

  /**
   * A request to switch protocols. Only to a WebSocket (GET, `Upgrade: websocket`, no body);
   * checked like any request, it goes upstream as a fresh one (upgradeUpstream), and the two
   * connections are joined only once the upstream answers 101. Any other upgrade is refused.
   */
  async upgrade(req: http.IncomingMessage, socket: Duplex, head: Buffer, via: Via): Promise<void> {
    const { sandbox } = via;
    const target = requestTarget(req, via);
    const where = 'problem' in target ? { host: req.headers.host ?? null, port: via.port, path: req.url } : target;
    const refuseWith = (reason: string, status = 403) => {
      deny(sandbox, { protocol: via.scheme, method: req.method, ...where, upgrade: req.headers.upgrade, reason });
      rawAnswer(socket, status, reason);
    };
    if ('problem' in target) return refuseWith(target.problem);
    const protocol = String(req.headers.upgrade).trim().toLowerCase();
    if (protocol !== 'websocket')
      return refuseWith(`the egress gateway upgrades a connection only to a WebSocket, not to ${JSON.stringify(req.headers.upgrade)}`);
    if (req.method !== 'GET') return refuseWith(`a WebSocket opens with a GET, not a ${req.method}`, 400);
    if (req.headers['transfer-encoding'] !== undefined || Number(req.headers['content-length'] ?? 0) !== 0)
      return refuseWith('a WebSocket handshake has no body', 400);
    if (serviceFor(sandbox, target.host)) return rawAnswer(socket, 501, 'backing services do not upgrade connections');
    const decision = decide(sandbox, target.host, target.port);
    if (!decision.allowed) return refuseWith(decision.reason);
    const reached = await this.destinations.addressFor(sandbox, target.host);
    if ('problem' in reached) return refuseWith(reached.problem);
    this.upgradeUpstream(via, req, socket, head, target, reached.address);
  }

  /**
   * The WebSocket handshake upstream, as a request of its own. On its 101 the two connections
   * are joined (the WebSocket's frames are not read; the http_call, status 101, is recorded with
   * its bytes both ways when it closes). Any other answer is relayed, and the connection goes
   * back to the parser: nothing the sandbox sent after the handshake leaves without being parsed.
   */
  private upgradeUpstream(
    via: Via,
    req: http.IncomingMessage,
    socket: Duplex,
    head: Buffer,
    target: { host: string; port: number; path: string },
    address: string,
  ): void {
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
      ca: this.ca,
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
        for (let i = 0; i < answer.rawHeaders.length; i += 2)
          if (!HOP_BY_HOP.has(answer.rawHeaders[i]!.toLowerCase()) && answer.rawHeaders[i]!.toLowerCase() !== 'content-length')
            kept.push(answer.rawHeaders[i]!, answer.rawHeaders[i + 1]!);
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
}
