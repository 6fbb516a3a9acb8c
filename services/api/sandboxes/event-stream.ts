/**
 * GET /v1/sandboxes/:id/events as Server-Sent Events: the sandbox's events of svc.sandbox-events
 * (kept by the SandboxCatalog) from after `Last-Event-ID`, then each new one as it comes, a
 * heartbeat comment every 15 s, and the end of the stream after the `destroyed` status.
 */
import type { Context } from 'koa';
import { PassThrough } from 'node:stream';
import { AppError } from '../../kernel/errors.ts';
import type { SandboxChanged, SandboxEvent } from '../../domain/events/sandbox-events.ts';
import type { SandboxCatalog, SandboxStream } from '../catalogs/sandbox-catalog.ts';

const HEARTBEAT_MS = 15_000;

/** A sandbox's event stream; 404 when none is kept, or when an ended sandbox's stream holds nothing. */
export function eventStream(sandboxes: SandboxCatalog, sandbox: SandboxChanged): SandboxStream {
  const stream = sandboxes.stream(sandbox.sandbox_id);
  if (!stream || ((sandbox.state === 'stopped' || sandbox.state === 'error') && stream.endedAt === null && stream.events.length === 0)) {
    throw new AppError('not_found', `sandbox ${sandbox.sandbox_id} not found`);
  }
  return stream;
}

/** The last event the client has: `Last-Event-ID`, else `?last_event_id=`, else 0. */
export function lastEventId(ctx: Context): number {
  return Number(ctx.get('Last-Event-ID') || (typeof ctx.query.last_event_id === 'string' ? ctx.query.last_event_id : '0'));
}

/** Answers with the stream's events after `lastId`, and keeps the response open for the next ones. */
export function serveEvents(ctx: Context, stream: SandboxStream, lastId: number): void {
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
  const write = (e: SandboxEvent) => {
    if (closed || e.seq <= lastId) return;
    out.write(`id: ${e.seq}\ndata: ${JSON.stringify({ event_type: e.event_type, data: JSON.parse(e.data) })}\n\n`);
    if (e.event_type === 'status' && (JSON.parse(e.data) as { state?: string }).state === 'destroyed') close();
  };
  const listener = (e: SandboxEvent) => write(e);
  const heartbeat = setInterval(() => out.write(': heartbeat\n\n'), HEARTBEAT_MS);
  out.write(': connected\n\n');
  stream.listeners.add(listener);
  for (const e of [...stream.events]) write(e);
  ctx.req.on('close', close);
}
