/**
 * The api's side of the sandbox request/reply (domain/sandbox-requests.ts): creation and every
 * operation on a live sandbox go to its runner over the log, the payload sealed, and the reply
 * comes back with its body opened. A runner that does not answer in SVC_REPLY_TIMEOUT is a 504.
 */
import type { Kernel } from '../../kernel/actor.ts';
import { Requester } from '../../kernel/request-reply.ts';
import { Sealer, secretsKey } from '../../kernel/tenant-secrets.ts';
import type { SandboxReplied, SandboxRequested } from '../../domain/events/sandbox-events.ts';
import { sandboxExchange, sealedRequest } from '../../domain/sandbox-requests.ts';
import type { SandboxOp, SandboxPayload, SandboxReply } from '../../domain/sandbox-ops.ts';

/** A runner's reply to operation `K`: its body, once opened and parsed, is a `SandboxReply<K>` (domain/sandbox-ops.ts). */
export type ReplyTo<K extends SandboxOp> = SandboxReplied & { readonly answers?: SandboxReply<K> };

export class SandboxRequester {
  private sealer: Sealer | null = null;
  private requester: Requester<SandboxRequested, SandboxReplied> | null = null;

  constructor(private readonly kernel: Kernel) {}

  async start(): Promise<void> {
    const sealer = (this.sealer = new Sealer(secretsKey(this.kernel.config)));
    this.requester = new Requester(this.kernel, sandboxExchange(sealer));
    await this.requester.start();
  }

  async stop(): Promise<void> {
    await this.requester?.stop();
    this.requester = null;
  }

  /**
   * Sends operation `op` on a sandbox to runner `runnerId` (its owner, or for a create the one
   * picked) and resolves with its reply, waiting `waitMs` for it (default: the reply timeout).
   * `op` and its payload are the contract's (domain/sandbox-ops.ts), checked by the compiler.
   */
  request<K extends SandboxOp>(tenant: string, sandboxId: string, runnerId: string, op: K, payload: SandboxPayload<K>, waitMs?: number): Promise<ReplyTo<K>> {
    const sealer = this.sealer!;
    return this.requester!.request(
      { key: sandboxId, tenant, unanswered: `the sandbox runner ${runnerId} did not answer ${op} for ${sandboxId}` },
      (correlationId) => sealedRequest(sealer, { tenant, sandbox_id: sandboxId, correlation_id: correlationId, runner_id: runnerId }, op, payload),
      waitMs,
    );
  }
}
