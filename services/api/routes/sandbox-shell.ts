/**
 * An interactive shell into a sandbox over a WebSocket: `GET /v1/sandboxes/:id/shell` with
 * `Upgrade: websocket` (docs/sandboxes.md, "Shell"; `svc sandboxes shell` is its client).
 *
 * The upgrade goes through the whole Koa app like any request (upgradeThroughApp): request id,
 * the key's authentication and the sandbox-token rules, rate limits, and the error catalog, so a
 * bad key, another tenant's sandbox or a bad `timeout` is one ordinary JSON error answer before any
 * WebSocket exists. Only then does the handler take the socket over.
 *
 * Each line the client sends runs through the runner's existing command path (the same request
 * as `POST /v1/sandboxes/:id/commands`: audited, redacted, within the sandbox's limits), one at a
 * time. The session keeps the working directory between lines: each command starts with a `cd`
 * to where the last one ended and reports `$PWD` after it on stderr behind a marker that is
 * stripped here. Programs that read a terminal (editors, REPLs) are not supported: a command's
 * stdin is empty; this is a line shell, not a PTY (the runner has no PTY operation).
 *
 * Frames are JSON text. Client: `{type: "run", command}`. Server: `{type: "ready", sandbox_id,
 * cwd}` once, then per command `{type: "result", command, stdout, stderr, exit_code, duration_ms,
 * cwd, timed_out?}`, or `{type: "error", error, message}` for a bad frame or a failed command
 * (the session goes on; it closes when the sandbox is gone).
 */
import http from 'node:http';
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import Router from '@koa/router';
import type Koa from 'koa';
import { WebSocketServer, type WebSocket } from 'ws';
import type { Kernel } from '../../kernel/actor.ts';
import type { Principal } from '../../kernel/auth.ts';
import { AppError, badRequest } from '../../kernel/errors.ts';
import { sandboxDuration } from '../../domain/sandbox-lifetime.ts';
import { commandSizeProblem } from '../../domain/sandbox-limits.ts';
import { checkQueryParams } from '../pagination.ts';
import { SandboxOperations, type SandboxOperationsDeps } from '../sandboxes/sandbox-operations.ts';

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

/** The most a client frame may hold: a command is at most 128 KiB (domain/sandbox-limits.ts). */
const MAX_FRAME_BYTES = 256 * 1024;
const CWD_MARKER = '\x1eSVC_CWD=';
const CWD_AT_END = /\x1eSVC_CWD=([^\n\x1e]*)$/;

const shellQuote = (text: string) => `'${text.replace(/'/g, `'\\''`)}'`;

/** A line wrapped to start in `cwd` and report where it ended, keeping its exit status. */
function wrapped(line: string, cwd: string): string {
  return `cd -- ${shellQuote(cwd)} 2>/dev/null\n${line}\n__svc_status=$?; printf '${CWD_MARKER.replace('\x1e', '\\036')}%s' "$PWD" >&2; exit $__svc_status`;
}

type Deps = Omit<SandboxOperationsDeps, 'config'> & { kernel: Kernel };

export function sandboxShellRouter(deps: Deps): Router {
  const { config } = deps.kernel;
  const operations = new SandboxOperations({ ...deps, config });
  const wss = new WebSocketServer({ noServer: true, maxPayload: MAX_FRAME_BYTES });
  const router = new Router();

  router.get('/v1/sandboxes/:id/shell', (ctx) => {
    checkQueryParams(ctx, ['timeout']);
    const principal = ctx.state.principal as Principal;
    if (principal.kind === 'sandbox') throw new AppError('forbidden', 'a sandbox token cannot open a shell; the owner\'s API key can');
    const sandbox = deps.sandboxes.owned(principal, ctx.params.id);
    if (sandbox.state !== 'ready' && sandbox.state !== 'running') throw new AppError('conflict', `sandbox ${sandbox.sandbox_id} is ${sandbox.state}; a shell needs a ready or running sandbox`);
    const timeoutMs = ctx.query.timeout === undefined ? null : sandboxDuration(ctx.query.timeout, 'timeout', config.sandboxMaxLifetime);
    const pending = (ctx.req as UpgradingRequest)[UPGRADE];
    if (!pending || ctx.get('upgrade').toLowerCase() !== 'websocket') {
      throw badRequest('upgrade', 'this endpoint is a WebSocket: connect with "Connection: Upgrade" and "Upgrade: websocket" (as `svc sandboxes shell` does)');
    }
    ctx.respond = false;
    ctx.status = 101;
    pending.res.detachSocket(pending.socket as Socket);
    wss.handleUpgrade(ctx.req, pending.socket, pending.head, (ws) => {
      new ShellSession(ws, operations, principal, sandbox.sandbox_id, timeoutMs).start();
    });
  });

  return router;
}

/** One client's shell: runs its lines one at a time and keeps the working directory. */
class ShellSession {
  private cwd = '/workspace';
  private busy = false;

  constructor(
    private readonly ws: WebSocket,
    private readonly operations: SandboxOperations,
    private readonly principal: Principal,
    private readonly sandboxId: string,
    private readonly timeoutMs: number | null,
  ) {}

  start(): void {
    this.send({ type: 'ready', sandbox_id: this.sandboxId, cwd: this.cwd });
    this.ws.on('message', (data, isBinary) => void this.onFrame(isBinary ? null : String(data)));
    this.ws.on('error', () => this.ws.terminate());
  }

  private send(frame: Record<string, unknown>): void {
    if (this.ws.readyState === this.ws.OPEN) this.ws.send(JSON.stringify(frame));
  }

  private async onFrame(text: string | null): Promise<void> {
    let frame: { type?: unknown; command?: unknown } | null = null;
    try {
      frame = text === null ? null : (JSON.parse(text) as { type?: unknown; command?: unknown });
    } catch {
      // answered below
    }
    if (frame === null || typeof frame !== 'object' || frame.type !== 'run' || typeof frame.command !== 'string') {
      return this.send({ type: 'error', error: 'bad_request', message: 'frame: expected JSON text {"type": "run", "command": "<shell line>"}' });
    }
    if (this.busy) return this.send({ type: 'error', error: 'conflict', message: 'a command is still running in this shell; wait for its result' });
    const tooLong = frame.command.trim() === '' ? 'is empty' : commandSizeProblem(frame.command);
    if (tooLong) return this.send({ type: 'error', error: 'bad_request', message: `command: ${tooLong}` });
    this.busy = true;
    try {
      await this.run(frame.command);
    } finally {
      this.busy = false;
    }
  }

  private async run(line: string): Promise<void> {
    try {
      const answer = await this.operations.send(this.principal, this.sandboxId, 'command', { command: wrapped(line, this.cwd), timeout_ms: this.timeoutMs, background: false });
      const result = answer.body as { stdout: string; stderr: string; exit_code: number; duration_ms: number; timed_out?: boolean };
      const cwd = CWD_AT_END.exec(result.stderr);
      if (cwd) this.cwd = cwd[1];
      const stderr = cwd ? result.stderr.slice(0, cwd.index) : result.stderr;
      this.send({ type: 'result', command: line, stdout: result.stdout, stderr, exit_code: result.exit_code, duration_ms: result.duration_ms, cwd: this.cwd, ...(result.timed_out && { timed_out: true }) });
    } catch (err) {
      const error = err instanceof AppError ? err : new AppError('internal', 'the command failed', { cause: err });
      this.send({ type: 'error', error: error.code, message: error.code === 'internal' ? 'internal error running the command' : error.message });
      // The sandbox is gone (destroyed, timed out, its runner dead): nothing more can run.
      if (error.code === 'not_found') this.ws.close(1000, 'the sandbox is gone');
    }
  }
}
