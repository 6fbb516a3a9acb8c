/**
 * An interactive shell into a sandbox over a WebSocket: `GET /v1/sandboxes/:id/shell` with
 * `Upgrade: websocket` (docs/sandboxes.md, "Shell"; `svc sandboxes shell` is its client).
 *
 * The upgrade goes through the whole Koa app like any request (upgradeThroughApp): request id,
 * the key's authentication and the sandbox-token rules, rate limits, and the error catalog, so a
 * bad key, another tenant's sandbox, a bad `cols`, `rows`, `term` or `timeout`, or a shell that
 * cannot start is one ordinary JSON error answer before any WebSocket exists. The shell is
 * started (sandboxes/terminal-relay.ts: a terminal session on the sandbox's runner, over the
 * log) before the handler takes the socket over.
 *
 * It is a real terminal: a shell on a pseudo-terminal of the sandbox, so editors, REPLs, job
 * control, Ctrl-C and completion work. Binary frames carry the terminal's bytes both ways; text
 * frames are JSON control: the client's `{type: "resize", cols, rows}`; the server's
 * `{type: "ready", sandbox_id, session_id, shell}` first, `{type: "error", error, message}` for
 * a bad frame (the session goes on) or before the end when the service ended the session, and
 * `{type: "exit", exit_code}` when the shell's end is known; the socket then closes. Closing the
 * socket hangs the shell up.
 */
import http from 'node:http';
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import Router from '@koa/router';
import type Koa from 'koa';
import { WebSocketServer, type RawData, type WebSocket } from 'ws';
import type { Kernel } from '../../kernel/actor.ts';
import type { Principal } from '../../kernel/auth.ts';
import { AppError, badRequest, type ErrorCode } from '../../kernel/errors.ts';
import { isObject } from '../../kernel/is-object.ts';
import { sandboxDuration } from '../../domain/sandbox-lifetime.ts';
import { TERMINAL, termProblem, terminalSizeProblem, type TerminalOpen } from '../../domain/terminal-sessions.ts';
import { checkQueryParams } from '../pagination.ts';
import { SandboxOperations, type SandboxOperationsDeps } from '../sandboxes/sandbox-operations.ts';
import type { RelayedTerminal, TerminalClient, TerminalEnd, TerminalRelay } from '../sandboxes/terminal-relay.ts';

/** Where upgradeThroughApp leaves the raw socket for the handler that takes it. */
const UPGRADE = Symbol('svc.upgrade');

interface PendingUpgrade {
  socket: Duplex;
  head: Buffer;
  res: http.ServerResponse;
}

type UpgradingRequest = http.IncomingMessage & { [UPGRADE]?: PendingUpgrade };

/**
 * The http server's `upgrade` listener: runs the request through the app with a response bound
 * to the socket, so every middleware applies and errors are answered as usual. A handler that
 * accepts the upgrade sets `ctx.respond = false` and takes the socket; otherwise the answer is
 * written and the socket closed.
 */
export function upgradeThroughApp(app: Koa): (req: http.IncomingMessage, socket: Duplex, head: Buffer) => void {
  const handle = app.callback();
  return (req, socket, head) => {
    const res = new http.ServerResponse(req);
    res.shouldKeepAlive = false;
    res.assignSocket(socket as Socket);
    (req as UpgradingRequest)[UPGRADE] = { socket, head, res };
    res.on('finish', () => {
      res.detachSocket(socket as Socket);
      socket.end();
    });
    socket.on('error', () => socket.destroy());
    void handle(req, res);
  };
}

/** Past this a frame closes the socket (1009); a terminal frame past TERMINAL.recordBytes is refused with an error frame. */
const MAX_FRAME_BYTES = 1024 * 1024;
/** A control frame is a small JSON object. */
const MAX_CONTROL_BYTES = 4096;
/** Answers to bad frames the client may leave unread, on top of the output in flight. */
const UNREAD_ANSWERS_BYTES = 64 * 1024;
/**
 * A client that has answered no ping for this long is gone. Long: a client may stop reading a
 * while (its own output held, Ctrl-S), and cannot answer then.
 */
const CLIENT_SILENT_MS = 60_000;

type Deps = Omit<SandboxOperationsDeps, 'config'> & { kernel: Kernel; terminals: TerminalRelay };

export function sandboxShellRouter(deps: Deps): Router {
  const { config } = deps.kernel;
  const operations = new SandboxOperations({ ...deps, config });
  const wss = new WebSocketServer({ noServer: true, maxPayload: MAX_FRAME_BYTES });
  const router = new Router();

  router.get('/v1/sandboxes/:id/shell', async (ctx) => {
    const principal = ctx.state.principal as Principal;
    if (principal.kind === 'sandbox') throw new AppError('forbidden', "a sandbox token cannot open a shell; the owner's API key can");
    const sandbox = deps.sandboxes.owned(principal, ctx.params.id);
    if (sandbox.state !== 'ready' && sandbox.state !== 'running')
      throw new AppError('conflict', `sandbox ${sandbox.sandbox_id} is ${sandbox.state}; a shell needs a ready or running sandbox`);
    const options = terminalOptions(ctx, config.sandboxMaxLifetime);
    const pending = handshake(ctx);
    const client = new ShellSocket(sandbox.sandbox_id);
    const terminal = await deps.terminals.open(operations, principal, sandbox, options, client);
    ctx.respond = false;
    // A client gone before its socket was taken over (while the shell started, or in the handshake) leaves no shell behind.
    const leftEarly = () => {
      if (!client.attached) terminal.close('the client left before the shell started');
    };
    if (pending.socket.destroyed) return leftEarly();
    pending.socket.once('close', leftEarly);
    ctx.status = 101;
    pending.res.detachSocket(pending.socket as Socket);
    wss.handleUpgrade(ctx.req, pending.socket, pending.head, (ws) => client.attach(ws, terminal));
  });

  return router;
}

/** The terminal the query asks for: `cols`, `rows`, `term`, `timeout`, each optional. */
function terminalOptions(ctx: Koa.Context, maxLifetimeMs: number): Omit<TerminalOpen, 'session_id'> {
  checkQueryParams(ctx, ['cols', 'rows', 'term', 'timeout']);
  const { cols = TERMINAL.defaultSize.cols, rows = TERMINAL.defaultSize.rows, term = TERMINAL.defaultTerm } = ctx.query as Record<string, string | undefined>;
  const problem = terminalSizeProblem('cols', cols) ?? terminalSizeProblem('rows', rows) ?? termProblem(term);
  if (problem) throw new AppError('bad_request', problem);
  const timeoutMs = ctx.query.timeout === undefined ? null : sandboxDuration(ctx.query.timeout, 'timeout', maxLifetimeMs);
  return { cols: Number(cols), rows: Number(rows), term, timeout_ms: timeoutMs };
}

/** The upgrade's socket, once the request is a WebSocket handshake (what `ws` checks, checked before a shell starts for it). */
function handshake(ctx: Koa.Context): PendingUpgrade {
  const pending = (ctx.req as UpgradingRequest)[UPGRADE];
  if (!pending || ctx.get('upgrade').toLowerCase() !== 'websocket') {
    throw badRequest('upgrade', 'this endpoint is a WebSocket: connect with "Connection: Upgrade" and "Upgrade: websocket" (as `svc sandboxes shell` does)');
  }
  if (!/^[+/0-9A-Za-z]{22}==$/.test(ctx.get('sec-websocket-key')) || !['8', '13'].includes(ctx.get('sec-websocket-version'))) {
    throw badRequest('upgrade', 'not a WebSocket handshake: Sec-WebSocket-Key and Sec-WebSocket-Version 13 are required');
  }
  return pending;
}

/** One client's socket on its terminal session. */
class ShellSocket implements TerminalClient {
  private ws: WebSocket | null = null;
  private terminal: RelayedTerminal | null = null;
  /** output, and the end, that came before the socket did (at most the output window) */
  private early: Buffer[] = [];
  private earlyEnd: TerminalEnd | null = null;

  constructor(private readonly sandboxId: string) {}

  get attached(): boolean {
    return this.ws !== null;
  }

  attach(ws: WebSocket, terminal: RelayedTerminal): void {
    this.ws = ws;
    this.terminal = terminal;
    this.control({ type: 'ready', sandbox_id: this.sandboxId, session_id: terminal.id, shell: terminal.shell });
    for (const data of this.early.splice(0)) this.output(data);
    if (this.earlyEnd) return this.ended(this.earlyEnd);
    ws.on('message', (data, isBinary) => this.fromClient(data, isBinary));
    ws.on('close', () => {
      clearInterval(heartbeat);
      terminal.close('the client closed the connection');
    });
    ws.on('error', () => ws.terminate());
    // A client that vanished (no FIN) answers no ping for CLIENT_SILENT_MS; one that closed while
    // its socket was not read (input held back) fails a ping's write. Either way the socket goes,
    // and the shell with it. A pong cannot be read while the socket is paused: that time counts not.
    let heard = Date.now();
    ws.on('pong', () => (heard = Date.now()));
    const heartbeat = setInterval(() => {
      if (ws.readyState !== ws.OPEN) return;
      if (ws.isPaused) heard = Date.now();
      if (Date.now() - heard > CLIENT_SILENT_MS) return ws.terminate();
      ws.ping();
    }, TERMINAL.heartbeatMs);
    heartbeat.unref();
  }

  output(data: Buffer): void {
    const { ws } = this;
    if (!ws) return void this.early.push(data);
    if (ws.readyState !== ws.OPEN) return;
    ws.send(data, { binary: true }, (err) => {
      if (!err) this.terminal!.consumed(data.length);
    });
  }

  writable(): void {
    this.ws?.resume();
  }

  ended(end: TerminalEnd): void {
    const { ws } = this;
    if (!ws) return void (this.earlyEnd = end);
    if (end.error) this.control({ type: 'error', error: end.error, message: end.reason ?? 'the session ended' });
    if (end.exitCode !== null) this.control({ type: 'exit', exit_code: end.exitCode });
    if (ws.readyState === ws.OPEN) ws.close(end.error === 'unavailable' ? 1001 : 1000, end.error ? 'the session ended' : 'the shell exited');
  }

  private control(frame: Record<string, unknown>): void {
    if (this.ws?.readyState === this.ws?.OPEN) this.ws!.send(JSON.stringify(frame));
  }

  /**
   * Answers a bad frame. A client that sends them and reads none of the answers (each a hundred
   * bytes or more for a frame of a few) would have the api hold every one: past the output window
   * and UNREAD_ANSWERS_BYTES unread, it is cut off at once (a close frame would wait behind what it
   * does not read, and its frames would still be read meanwhile), and the shell with it.
   */
  private refuse(error: ErrorCode, message: string): void {
    if (this.ws!.bufferedAmount > TERMINAL.outputWindow + UNREAD_ANSWERS_BYTES) return this.ws!.terminate();
    this.control({ type: 'error', error, message });
  }

  /** A frame of the client's: bytes for the shell, or a control. Nothing it sends ends the session but its leaving. */
  private fromClient(data: RawData, isBinary: boolean): void {
    const bytes = Array.isArray(data) ? Buffer.concat(data) : Buffer.from(data as Buffer);
    if (isBinary) {
      if (bytes.length > TERMINAL.recordBytes)
        return this.refuse(
          'payload_too_large',
          `a binary frame is terminal input of at most ${TERMINAL.recordBytes} bytes; this one had ${bytes.length} and was dropped`,
        );
      // The runner is a window behind: read no more of the socket until it catches up.
      if (!this.terminal!.input(bytes)) this.ws!.pause();
      return;
    }
    if (bytes.length > MAX_CONTROL_BYTES) return this.refuse('payload_too_large', `a text frame is a JSON control of at most ${MAX_CONTROL_BYTES} bytes`);
    let frame: unknown = null;
    try {
      frame = JSON.parse(bytes.toString('utf8'));
    } catch {
      // answered below
    }
    if (!isObject(frame) || frame.type !== 'resize') {
      return this.refuse('bad_request', 'a text frame is JSON control: {"type": "resize", "cols", "rows"}; terminal input goes in binary frames');
    }
    const { cols, rows } = frame;
    if (typeof cols !== 'number' || typeof rows !== 'number') return this.refuse('bad_request', 'resize: cols and rows are numbers of characters');
    const problem = terminalSizeProblem('cols', cols) ?? terminalSizeProblem('rows', rows);
    if (problem) return this.refuse('bad_request', problem);
    this.terminal!.resize(cols, rows);
  }
}
