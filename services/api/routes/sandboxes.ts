/**
 * Sandboxes. Creation and every operation on a live sandbox go to its runner over the log
 * (request/reply); reads of its state come from the api's view of svc.sandboxes; the event
 * stream is SSE from svc.sandbox-events.
 */
import Router from '@koa/router';
import type { Context } from 'koa';
import { PassThrough } from 'node:stream';
import type { Kernel } from '../../kernel/actor.ts';
import type { Auth, Principal } from '../../kernel/auth.ts';
import { changedExpiry, lifetimeProblem, sandboxDuration } from '../../domain/sandbox-lifetime.ts';
import { AppError, badRequest, type ErrorCode } from '../../kernel/errors.ts';
import type { SandboxReplied } from '../../domain/events/sandbox-events.ts';
import { newSandboxId } from '../../kernel/ids.ts';
import { commandSizeProblem } from '../../domain/sandbox-limits.ts';
import type { Requester } from '../../kernel/request-reply.ts';
import { SECRET_NAME } from '../../domain/spec.ts';
import { sandboxView, type SandboxCatalog } from '../catalogs/sandbox-catalog.ts';
import type { SpecCatalog } from '../catalogs/spec-catalog.ts';
import type { AgentCatalog } from '../catalogs/agent-catalog.ts';
import { refuseUnsupported } from '../../domain/capabilities.ts';
import { MAX_INGEST_BODY_BYTES, requireJson, type TraceIngest } from '../traces/ingest.ts';
import { sandboxTrace } from './traces.ts';
import { jsonBody } from '../request-body.ts';

const HEARTBEAT_MS = 15_000;


function stringMap(value: unknown, field: string, key?: RegExp): Record<string, string> {
  if (value === undefined || value === null) return {};
  if (typeof value !== 'object' || Array.isArray(value)) throw badRequest(field, 'must be an object of string values');
  for (const [k, v] of Object.entries(value)) {
    if (typeof v !== 'string') throw badRequest(`${field}.${k}`, 'must be a string');
    if (key && !key.test(k)) throw badRequest(`${field}.${k}`, 'is not a valid name (letters, digits and _)');
  }
  return value as Record<string, string>;
}


/** Renders a runner reply: its status and body, or the error it carries. */
function answer(ctx: Context, reply: SandboxReplied): void {
  if (reply.status >= 400) {
    const parsed = JSON.parse(reply.body.toString('utf8')) as { message?: string };
    throw new AppError((reply.error ?? 'internal') as ErrorCode, parsed.message ?? 'sandbox operation failed');
  }
  ctx.status = reply.status;
  ctx.type = reply.content_type;
  ctx.body = reply.content_type === 'application/json' ? JSON.parse(reply.body.toString('utf8')) : reply.body;
}

/** `/workspace/foo` and `foo` are one file; the runner checks the rest of the rules. */
function filePath(ctx: Context): string {
  const raw = ctx.params.path as unknown;
  const joined = Array.isArray(raw) ? raw.join('/') : raw;
  if (typeof joined !== 'string' || joined === '') throw badRequest('path', 'is required');
  return joined;
}

export function sandboxesRouter(deps: { kernel: Kernel; auth: Auth; specs: SpecCatalog; agents: AgentCatalog; sandboxes: SandboxCatalog; requester: Requester; ingest: TraceIngest }): Router {
  const { kernel, auth, specs, agents, sandboxes, requester, ingest } = deps;
  const { config } = kernel;
  const router = new Router({ prefix: '/v1/sandboxes' });
  const principal = (ctx: Context) => ctx.state.principal as Principal;
  /** A request's duration, bounded by the maximum sandbox lifetime (sandbox-lifetime.ts); null when absent. */
  const duration = (value: unknown, field: string) => (value === undefined || value === null ? null : sandboxDuration(value, field, config.sandboxMaxLifetime));
  const send = async (ctx: Context, op: string, payload: object = {}) => {
    const sandbox = sandboxes.owned(principal(ctx), ctx.params.id);
    answer(ctx, await requester.request(sandbox.tenant, sandbox.sandbox_id, op, payload));
  };

  router.post('/', async (ctx) => {
    const p = principal(ctx);
    if (p.kind === 'sandbox') throw new AppError('forbidden', 'a sandbox token cannot create sandboxes');
    const b = jsonBody(ctx);
    if (typeof b.spec_id !== 'string' || b.spec_id === '') throw badRequest('spec_id', 'is required: the id of a stored spec');
    const timeoutMs = duration(b.timeout, 'timeout');
    const metadata = stringMap(b.metadata, 'metadata');
    const reserved = Object.keys(metadata).find((k) => k.startsWith('svc.'));
    if (reserved) throw badRequest(`metadata.${reserved}`, 'keys starting with "svc." are reserved for the service');
    const secrets = stringMap(b.secrets, 'secrets', SECRET_NAME);
    let spec;
    try {
      spec = specs.get(p.tenant, b.spec_id);
    } catch (err) {
      // An unknown spec id is a validation failure of this request (DECISIONS.md).
      if (err instanceof AppError && err.code === 'not_found') throw badRequest('spec_id', `no spec "${b.spec_id}" is stored`);
      throw err;
    }
    refuseUnsupported(spec.doc, 'sandbox', 'spec_id');
    // A spec stored before the maximum was lowered: its lifetime is refused, not cut short.
    const tooLong = timeoutMs === null && spec.doc.resources.timeoutMs !== null ? lifetimeProblem(spec.doc.resources.timeoutMs, config.sandboxMaxLifetime) : null;
    if (tooLong) throw badRequest('spec_id', `the spec's resources.timeout ${tooLong}; give a shorter timeout`);
    const agent = agents.resolveForSpec(p.tenant, spec.doc);
    const { plan, quota } = auth.sandboxQuota(p.tenant);
    if (sandboxes.live(p.tenant).length >= quota) {
      throw new AppError('rate_limited', `concurrent sandbox quota reached: ${quota} for the ${plan} plan`, { retryAfter: 5 });
    }
    const id = newSandboxId();
    const reply = await requester.request(p.tenant, id, 'create', {
      spec_id: spec.stored.spec_id,
      spec_version: spec.stored.version,
      yaml: spec.stored.yaml,
      timeout_ms: timeoutMs,
      metadata,
      // Sealed on the log with the rest of the request (request-reply.ts).
      secrets,
      agent,
    });
    answer(ctx, reply);
    // The next GET must see it ready: wait for the entity event the runner wrote before replying.
    await sandboxes.waitForState(id, ['ready', 'running', 'stopped']);
  });

  router.get('/', (ctx) => {
    const p = principal(ctx);
    const list = p.kind === 'sandbox' ? sandboxes.live(p.tenant).filter((s) => s.sandbox_id === p.keyId) : sandboxes.live(p.tenant);
    ctx.body = list.map((s) => sandboxView(s, config.baseUrl));
  });

  router.get('/:id', (ctx) => {
    ctx.body = sandboxView(sandboxes.owned(principal(ctx), ctx.params.id), config.baseUrl);
  });

  router.delete('/:id', async (ctx) => {
    const sandbox = sandboxes.owned(principal(ctx), ctx.params.id, { allowGone: true });
    if (sandbox.state === 'stopped' || sandbox.state === 'error') {
      ctx.body = { id: sandbox.sandbox_id, state: 'stopped' };
      return;
    }
    answer(ctx, await requester.request(sandbox.tenant, sandbox.sandbox_id, 'destroy', {}));
    await sandboxes.waitForState(sandbox.sandbox_id, ['stopped', 'error']);
  });

  router.post('/:id/commands', async (ctx) => {
    const b = jsonBody(ctx);
    if (typeof b.command !== 'string' || b.command.trim() === '') throw badRequest('command', 'is required: a shell command string');
    const tooLong = commandSizeProblem(b.command);
    if (tooLong) throw badRequest('command', tooLong);
    if (b.background !== undefined && typeof b.background !== 'boolean') throw badRequest('background', 'must be true or false');
    await send(ctx, 'command', { command: b.command, timeout_ms: duration(b.timeout, 'timeout'), background: b.background === true });
  });

  router.post('/:id/files', async (ctx) => {
    const b = jsonBody(ctx);
    if (typeof b.path !== 'string' || b.path === '') throw badRequest('path', 'is required');
    if (typeof b.content !== 'string') throw badRequest('content', 'is required: the file content as a string');
    await send(ctx, 'file_write', { path: b.path, content: b.content });
  });

  router.get('/:id/files/*path', async (ctx) => send(ctx, 'file_read', { path: filePath(ctx) }));
  router.delete('/:id/files/*path', async (ctx) => send(ctx, 'file_delete', { path: filePath(ctx) }));
  router.get('/:id/state', async (ctx) => send(ctx, 'state'));
  router.get('/:id/diff', async (ctx) => send(ctx, 'diff'));

  router.post('/:id/timeout', async (ctx) => {
    const sandbox = sandboxes.owned(principal(ctx), ctx.params.id);
    // The lifetime is its owner's to change, not the agent's inside (docs/sandboxes.md).
    if (principal(ctx).kind === 'sandbox') throw new AppError('forbidden', 'a sandbox token cannot change its sandbox\'s timeout; the owner\'s API key can');
    const b = jsonBody(ctx);
    if ((b.timeout === undefined) === (b.extend === undefined)) throw badRequest('timeout', 'give either timeout (reset the timer to this long from now) or extend (add this much)');
    const field = b.timeout !== undefined ? 'timeout' : 'extend';
    const change = { [`${field}_ms`]: sandboxDuration(b[field], field, config.sandboxMaxLifetime) };
    // The runner checks again (sandbox-lifetime.ts): two changes at once would each pass this view.
    changedExpiry({ createdAt: sandbox.created_at, expiresAt: sandbox.expires_at }, change, config.sandboxMaxLifetime);
    answer(ctx, await requester.request(sandbox.tenant, sandbox.sandbox_id, 'timeout', change));
  });

  router.post('/:id/trace', async (ctx) => {
    const p = principal(ctx);
    const sandbox = sandboxes.owned(p, ctx.params.id);
    requireJson(ctx);
    const decoded = await ingest.ingest(ctx, { endpoint: '/v1/sandboxes/:id/trace', format: 'trace-json', maxBodyBytes: MAX_INGEST_BODY_BYTES, keyId: p.keyId, source: sandboxes.traceSource(sandbox) });
    ctx.body = { ingested: decoded.count };
  });

  router.get('/:id/trace', async (ctx) => {
    const sandbox = sandboxes.owned(principal(ctx), ctx.params.id, { allowGone: true });
    ctx.body = await sandboxTrace(kernel, sandbox.tenant, sandbox.sandbox_id);
  });

  router.get('/:id/events', async (ctx) => {
    const sandbox = sandboxes.owned(principal(ctx), ctx.params.id, { allowGone: true });
    const stream = sandboxes.stream(sandbox.sandbox_id);
    if (!stream || ((sandbox.state === 'stopped' || sandbox.state === 'error') && stream.endedAt === null && stream.events.length === 0)) {
      throw new AppError('not_found', `sandbox ${sandbox.sandbox_id} not found`);
    }
    const lastId = Number(ctx.get('Last-Event-ID') || (typeof ctx.query.last_event_id === 'string' ? ctx.query.last_event_id : '0'));
    const out = new PassThrough();
    ctx.req.socket.setTimeout(0);
    ctx.req.socket.setNoDelay(true);
    ctx.set({ 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache', Connection: 'keep-alive', 'X-Accel-Buffering': 'no' });
    ctx.status = 200;
    ctx.body = out;
    let closed = false;
    const close = () => {
      if (closed) return;
      closed = true;
      clearInterval(heartbeat);
      stream.listeners.delete(listener);
      out.end();
    };
    const write = (e: (typeof stream.events)[number]) => {
      if (closed || e.seq <= lastId) return;
      out.write(`id: ${e.seq}\ndata: ${JSON.stringify({ event_type: e.event_type, data: JSON.parse(e.data) })}\n\n`);
      if (e.event_type === 'status' && (JSON.parse(e.data) as { state?: string }).state === 'destroyed') close();
    };
    const listener = (e: (typeof stream.events)[number]) => write(e);
    const heartbeat = setInterval(() => out.write(': heartbeat\n\n'), HEARTBEAT_MS);
    out.write(': connected\n\n');
    stream.listeners.add(listener);
    for (const e of [...stream.events]) write(e);
    ctx.req.on('close', close);
  });

  return router;
}
