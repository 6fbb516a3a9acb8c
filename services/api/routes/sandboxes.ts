/**
 * Sandboxes. Creation and every operation on a live sandbox go to its runner over the log
 * (sandboxes/sandbox-operations.ts); reads of its state come from the api's view of
 * svc.sandboxes; the event stream is SSE from svc.sandbox-events (sandboxes/event-stream.ts);
 * the audit log is read from ClickHouse (sandboxes/audit-reads.ts), also after the sandbox ended.
 */
import Router from '@koa/router';
import type { Context } from 'koa';
import type { Kernel } from '../../kernel/actor.ts';
import type { Auth, Principal } from '../../kernel/auth.ts';
import { AppError } from '../../kernel/errors.ts';
import { sandboxView, type SandboxCatalog } from '../catalogs/sandbox-catalog.ts';
import type { RunnerRoster } from '../catalogs/runner-roster.ts';
import type { SpecCatalog } from '../catalogs/spec-catalog.ts';
import type { AgentCatalog } from '../catalogs/agent-catalog.ts';
import { MAX_INGEST_BODY_BYTES, type TraceIngest } from '../traces/ingest.ts';
import { ingestAnswer, postedBody, prefersRespondAsync, requireJson } from '../traces/ingest-http.ts';
import { sandboxTrace } from '../traces/trace-event-reads.ts';
import { jsonBody } from '../request-body.ts';
import { idempotencySeed } from '../middleware/idempotency.ts';
import { checkQueryParams } from '../pagination.ts';
import { answerPages } from '../traces/paged-answer.ts';
import { AUDIT_CURSOR_ARITY, AUDIT_FILTERS, auditFilters, auditPages, auditSubject } from '../sandboxes/audit-reads.ts';
import { eventStream, lastEventId, serveEvents } from '../sandboxes/event-stream.ts';
import { commandInput, createInput, fileEncoding, fileJson, filePath, fileWriteInput, timeoutChange } from '../sandboxes/sandbox-input.ts';
import { SandboxOperations, type SandboxAnswer } from '../sandboxes/sandbox-operations.ts';
import type { SandboxOp, SandboxPayload } from '../../domain/sandbox-ops.ts';
import type { SandboxRequester } from '../sandboxes/sandbox-requester.ts';

/** Renders an operation's answer: the runner's status and content type when it gave them, and the body. */
function render(ctx: Context, answer: SandboxAnswer): void {
  if (answer.status !== undefined) ctx.status = answer.status;
  if (answer.type !== undefined) ctx.type = answer.type;
  ctx.body = answer.body;
}

// long: a router, one short handler per route of the sandbox API
export function sandboxesRouter(deps: {
  kernel: Kernel;
  auth: Auth;
  specs: SpecCatalog;
  agents: AgentCatalog;
  sandboxes: SandboxCatalog;
  runners: RunnerRoster;
  requester: SandboxRequester;
  ingest: TraceIngest;
}): Router {
  const { kernel, sandboxes, ingest } = deps;
  const { config } = kernel;
  const operations = new SandboxOperations({ ...deps, config });
  const router = new Router({ prefix: '/v1/sandboxes' });
  const principal = (ctx: Context) => ctx.state.principal as Principal;
  const maxLifetime = config.sandboxMaxLifetime;
  const send = async <K extends SandboxOp>(ctx: Context, op: K, payload: SandboxPayload<K>) =>
    render(ctx, await operations.send(principal(ctx), ctx.params.id, op, payload));

  router.post('/', async (ctx) => {
    if (principal(ctx).kind === 'sandbox') throw new AppError('forbidden', 'a sandbox token cannot create sandboxes');
    render(ctx, await operations.create(principal(ctx), createInput(jsonBody(ctx), maxLifetime), idempotencySeed(ctx)));
  });

  router.get('/', (ctx) => {
    const p = principal(ctx);
    const list = p.kind === 'sandbox' ? sandboxes.live(p.tenant).filter((s) => s.sandbox_id === p.keyId) : sandboxes.live(p.tenant);
    ctx.body = list.map((s) => sandboxView(s, config.baseUrl));
  });

  router.get('/:id', (ctx) => {
    ctx.body = sandboxView(sandboxes.owned(principal(ctx), ctx.params.id), config.baseUrl);
  });

  router.delete('/:id', async (ctx) => render(ctx, await operations.destroy(principal(ctx), ctx.params.id)));
  router.post('/:id/commands', async (ctx) => send(ctx, 'command', commandInput(jsonBody(ctx), maxLifetime)));
  router.post('/:id/files', async (ctx) => send(ctx, 'file_write', fileWriteInput(jsonBody(ctx))));
  // The bytes as they are; with ?encoding=base64 (or utf8), JSON {path, bytes, encoding, content} (docs/sandboxes.md).
  router.get('/:id/files/*path', async (ctx) => {
    const path = filePath(ctx.params.path);
    const encoding = ctx.query.encoding === undefined ? null : fileEncoding(ctx.query.encoding);
    const answer = await operations.send(principal(ctx), ctx.params.id, 'file_read', { path });
    if (encoding === null) return render(ctx, answer);
    ctx.body = fileJson(path, answer.body, encoding);
  });
  router.delete('/:id/files/*path', async (ctx) => send(ctx, 'file_delete', { path: filePath(ctx.params.path) }));
  router.get('/:id/state', async (ctx) => send(ctx, 'state', {}));
  router.get('/:id/diff', async (ctx) => send(ctx, 'diff', {}));
  // An http_mock's journal, and what its record mode saw as routes (docs/sandboxes.md "Backing services").
  router.get('/:id/services/:name/requests', async (ctx) => send(ctx, 'service_requests', { service: ctx.params.name }));
  router.get('/:id/services/:name/recording', async (ctx) => send(ctx, 'service_recording', { service: ctx.params.name }));

  router.post('/:id/timeout', async (ctx) => {
    const sandbox = sandboxes.owned(principal(ctx), ctx.params.id);
    // The lifetime is its owner's to change, not the agent's inside (docs/sandboxes.md).
    if (principal(ctx).kind === 'sandbox') throw new AppError('forbidden', "a sandbox token cannot change its sandbox's timeout; the owner's API key can");
    render(ctx, await operations.changeTimeout(sandbox, timeoutChange(jsonBody(ctx), maxLifetime)));
  });

  router.post('/:id/trace', async (ctx) => {
    const sandbox = sandboxes.owned(principal(ctx), ctx.params.id);
    requireJson(ctx);
    const respondAsync = prefersRespondAsync(ctx);
    const decoded = await ingest.ingest(postedBody(ctx), {
      endpoint: '/v1/sandboxes/:id/trace',
      format: 'trace-json',
      maxBodyBytes: MAX_INGEST_BODY_BYTES,
      keyId: principal(ctx).keyId,
      source: sandboxes.traceSource(sandbox),
      respondAsync,
    });
    ctx.body = ingestAnswer(ctx, decoded, respondAsync);
  });

  router.get('/:id/trace', async (ctx) => {
    const sandbox = sandboxes.owned(principal(ctx), ctx.params.id, { allowGone: true });
    ctx.body = await sandboxTrace(kernel.store, sandbox.tenant, sandbox.sandbox_id);
  });

  router.get('/:id/audit', async (ctx) => {
    checkQueryParams(ctx, AUDIT_FILTERS);
    const filters = auditFilters(ctx.query);
    const subject = await auditSubject(kernel.store, sandboxes, principal(ctx), ctx.params.id);
    await answerPages(ctx, config, await auditPages(kernel, subject, filters), undefined, AUDIT_CURSOR_ARITY);
  });

  router.get('/:id/events', async (ctx) => {
    const sandbox = sandboxes.owned(principal(ctx), ctx.params.id, { allowGone: true });
    serveEvents(ctx, eventStream(sandboxes, sandbox), lastEventId(ctx));
  });

  return router;
}
