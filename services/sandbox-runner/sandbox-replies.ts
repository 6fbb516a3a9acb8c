/**
 * The runner's side of the sandbox request/reply (domain/sandbox-requests.ts): a reply sealed
 * with the runner's Sealer and appended to svc.sandbox-replies, keyed by the request's
 * correlation id.
 */
import type { Kernel } from '../kernel/actor.ts';
import { reply as appendReply } from '../kernel/request-reply.ts';
import type { Sealer } from '../kernel/tenant-secrets.ts';
import type { SandboxRequested } from '../domain/events/sandbox-events.ts';
import { sandboxExchange, sealedReply } from '../domain/sandbox-requests.ts';

/** Answers one request: `body` is sent as its bytes when a Buffer, as JSON otherwise. */
export async function reply(
  kernel: Kernel,
  sealer: Sealer,
  request: SandboxRequested,
  status: number,
  body: unknown,
  options: { error?: string; contentType?: string } = {},
): Promise<void> {
  await appendReply(kernel, sandboxExchange(sealer), request.tenant, sealedReply(sealer, request, status, body, options));
}
