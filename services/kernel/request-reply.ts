/**
 * Request/reply over the log. The api appends a request with a correlation id to
 * svc.sandbox-requests (keyed by sandbox id, so one sandbox's requests stay in order on one
 * partition) and awaits the reply with that id on svc.sandbox-replies, which every api process
 * follows from its tail. No reply in time is a 504 `timeout`, a clear HTTP error. Payloads and
 * bodies carry exact bytes that may hold secrets (command text, file contents, a create's
 * secrets), so they are sealed on the log with the server's secrets key.
 */
import { subscribe, publish, type Kernel } from './actor.ts';
import { AppError } from './errors.ts';
import type { SandboxReplied, SandboxRequested } from '../domain/events/sandbox-events.ts';
import { newEventId } from './ids.ts';
import type { Consumer } from './log/event-log.ts';
import { Sealer, secretsKey } from './tenant-secrets.ts';
import { TOPICS } from './topics.ts';

/** One sealer per kernel: the api and the runners of one process share it. */
const sealers = new WeakMap<Kernel, Sealer>();

function sealer(kernel: Kernel): Sealer {
  let s = sealers.get(kernel);
  if (!s) sealers.set(kernel, (s = new Sealer(secretsKey(kernel.config))));
  return s;
}

const requestContext = (r: { sandbox_id: string; correlation_id: string }) => `sandbox-request/${r.sandbox_id}/${r.correlation_id}`;
const replyContext = (r: { sandbox_id: string; correlation_id: string }) => `sandbox-reply/${r.sandbox_id}/${r.correlation_id}`;

/** The runner's side: a request's payload, unsealed. */
export function requestPayload(kernel: Kernel, request: SandboxRequested): Record<string, unknown> {
  const json = request.payload_sealed ? sealer(kernel).open(request.payload_sealed, requestContext(request)) : request.payload;
  return JSON.parse(json) as Record<string, unknown>;
}

export class Requester {
  private readonly pending = new Map<string, (reply: SandboxReplied) => void>();
  private consumer: Consumer | null = null;

  constructor(private readonly kernel: Kernel) {}

  async start(): Promise<void> {
    this.consumer = await subscribe<SandboxReplied>(this.kernel, {
      groupId: `replies.${this.kernel.instanceId}`,
      topics: [TOPICS.sandboxReplies],
      fromBeginning: false,
      commit: false,
      handle: async (events) => {
        for (const { value } of events) {
          const waiting = value && this.pending.get(value.correlation_id);
          if (waiting) waiting(value.body_sealed ? { ...value, body: sealer(this.kernel).openBytes(value.body_sealed, replyContext(value)), body_sealed: null } : value);
        }
      },
    });
  }

  async stop(): Promise<void> {
    await this.consumer?.stop();
    this.consumer = null;
  }

  /** Sends one request and resolves with its reply. */
  async request(tenant: string, sandboxId: string, op: string, payload: object, timeoutMs = this.kernel.config.replyTimeout): Promise<SandboxReplied> {
    const correlationId = newEventId();
    const reply = new Promise<SandboxReplied>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(correlationId);
        reject(new AppError('timeout', `the sandbox runner did not answer ${op} for ${sandboxId} within ${Math.round(timeoutMs / 1000)} s`));
      }, timeoutMs);
      this.pending.set(correlationId, (r) => {
        clearTimeout(timer);
        this.pending.delete(correlationId);
        resolve(r);
      });
    });
    const ids = { sandbox_id: sandboxId, correlation_id: correlationId };
    const request: SandboxRequested = { tenant, event_id: newEventId(), ts: Date.now(), ...ids, op, payload: '', payload_sealed: sealer(this.kernel).seal(JSON.stringify(payload), requestContext(ids)) };
    await publish(this.kernel, TOPICS.sandboxRequests, [{ key: sandboxId, tenant, value: request }]);
    return reply;
  }
}

/** The runner's side: answers one request. */
export async function reply(kernel: Kernel, request: SandboxRequested, status: number, body: unknown, options: { error?: string; contentType?: string } = {}): Promise<void> {
  const value: SandboxReplied = {
    tenant: request.tenant,
    event_id: newEventId(),
    ts: Date.now(),
    correlation_id: request.correlation_id,
    sandbox_id: request.sandbox_id,
    status,
    error: options.error ?? null,
    content_type: options.contentType ?? 'application/json',
    body: Buffer.alloc(0),
    body_sealed: sealer(kernel).seal(Buffer.isBuffer(body) ? body : JSON.stringify(body ?? null), replyContext(request)),
  };
  await publish(kernel, TOPICS.sandboxReplies, [{ key: request.correlation_id, tenant: request.tenant, value }]);
}
