/**
 * Requests to the sandbox runner and its replies, as an exchange of the log's request/reply
 * (kernel/request-reply.ts): svc.sandbox-requests, keyed by sandbox id so one sandbox's requests
 * stay in order on one partition, each naming the runner it is for, and svc.sandbox-replies. Payloads and bodies carry exact bytes
 * that may hold secrets (command text, file contents, a create's secrets), so they are sealed on
 * the log with the server's secrets key, bound to the sandbox and the correlation id (the
 * schemas' `payload_sealed` and `body_sealed`). Pure: the api and the runner build and open them
 * here, each with its own Sealer.
 */
import { newEventId } from '../kernel/ids.ts';
import type { Exchange } from '../kernel/request-reply.ts';
import type { Sealer } from '../kernel/tenant-secrets.ts';
import { TOPICS } from '../kernel/topics.ts';
import type { SandboxReplied, SandboxRequested } from './events/sandbox-events.ts';

type Correlated = { sandbox_id: string; correlation_id: string };

const requestContext = (r: Correlated) => `sandbox-request/${r.sandbox_id}/${r.correlation_id}`;
const replyContext = (r: Correlated) => `sandbox-reply/${r.sandbox_id}/${r.correlation_id}`;

/** The sandbox topics as an exchange; a reply's body is opened as it arrives. */
export function sandboxExchange(sealer: Sealer): Exchange<SandboxReplied> {
  return {
    requests: TOPICS.sandboxRequests,
    replies: TOPICS.sandboxReplies,
    correlationOf: (reply) => reply.correlation_id,
    receive: (reply) => openReply(sealer, reply),
  };
}

/** A request for operation `op` on a sandbox, its payload sealed. */
export function sealedRequest(sealer: Sealer, to: Correlated & { tenant: string; runner_id: string }, op: string, payload: object): SandboxRequested {
  const ids = { sandbox_id: to.sandbox_id, correlation_id: to.correlation_id };
  return {
    tenant: to.tenant,
    event_id: newEventId(),
    ts: Date.now(),
    ...ids,
    op,
    payload: '',
    payload_sealed: sealer.seal(JSON.stringify(payload), requestContext(ids)),
    runner_id: to.runner_id,
  };
}

/** The runner's side: a request's payload, unsealed. */
export function requestPayload(sealer: Sealer, request: SandboxRequested): Record<string, unknown> {
  const json = request.payload_sealed ? sealer.open(request.payload_sealed, requestContext(request)) : request.payload;
  return JSON.parse(json) as Record<string, unknown>;
}

/** The runner's side: the reply to one request, its body (bytes as they are, anything else as JSON) sealed. */
export function sealedReply(
  sealer: Sealer,
  request: SandboxRequested,
  status: number,
  body: unknown,
  options: { error?: string; contentType?: string } = {},
): SandboxReplied {
  return {
    tenant: request.tenant,
    event_id: newEventId(),
    ts: Date.now(),
    correlation_id: request.correlation_id,
    sandbox_id: request.sandbox_id,
    status,
    error: options.error ?? null,
    content_type: options.contentType ?? 'application/json',
    body: Buffer.alloc(0),
    body_sealed: sealer.seal(Buffer.isBuffer(body) ? body : JSON.stringify(body ?? null), replyContext(request)),
  };
}

/** A reply with its body opened; a reply without a sealed body is returned as it came. */
function openReply(sealer: Sealer, reply: SandboxReplied): SandboxReplied {
  return reply.body_sealed ? { ...reply, body: sealer.openBytes(reply.body_sealed, replyContext(reply)), body_sealed: null } : reply;
}
