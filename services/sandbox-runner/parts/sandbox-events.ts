/**
 * A sandbox's stream, svc.sandbox-events: its events in order (seq), redacted, appended in
 * batches. Every part of the sandbox writes its events here.
 */
import { publish, type Kernel } from '../../kernel/actor.ts';
import type { SandboxEvent } from '../../domain/events/sandbox-events.ts';
import { newEventId } from '../../kernel/ids.ts';
import { TOPICS } from '../../kernel/topics.ts';

/** Appends one event of the sandbox's stream; resolves once it is on the log, never rejects. */
export type EmitEvent = (eventType: string, data: object) => Promise<void>;

export class SandboxEvents {
  private seq = 0;
  private eventChain: Promise<unknown> = Promise.resolve();
  private queuedEvents: SandboxEvent[] = [];

  constructor(
    private readonly kernel: Kernel,
    private readonly tenant: string,
    private readonly id: string,
    /** Replaces every secret value with [REDACTED:<NAME>] (SandboxEnv.redact). */
    private readonly redact: (text: string) => string,
  ) {}

  /**
   * Appends one event of the sandbox's stream. Events keep their order (seq); the ones queued
   * while an append runs go together in the next one, so the boot's steps need not wait for
   * each other's fsync. Resolves once this event is on the log.
   */
  event(eventType: string, data: object): Promise<void> {
    this.queuedEvents.push({
      tenant: this.tenant,
      event_id: newEventId(),
      ts: Date.now(),
      sandbox_id: this.id,
      seq: ++this.seq,
      event_type: eventType,
      data: this.redact(JSON.stringify(data)),
    });
    const next = this.eventChain.then(async () => {
      const batch = this.queuedEvents.splice(0);
      if (batch.length > 0)
        await publish(
          this.kernel,
          TOPICS.sandboxEvents,
          batch.map((value) => ({ key: this.id, tenant: this.tenant, value })),
        );
    });
    // A failed append is logged once here; callers (many do not await) never see a rejection.
    this.eventChain = next.catch((err) => this.kernel.logger.error({ err, sandbox_id: this.id }, 'sandbox events lost'));
    return this.eventChain.then(() => undefined);
  }
}
