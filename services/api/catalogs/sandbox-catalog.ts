/**
 * What the api knows of sandboxes, from the log: the entity view of svc.sandboxes (live state,
 * owner, token hash) and the event streams of svc.sandbox-events for SSE. Streams of destroyed
 * sandboxes are dropped a while after their last event, so memory follows the live sandboxes.
 */
import { subscribe, type Kernel } from '../../kernel/actor.ts';
import { EntityCatalog } from '../../kernel/entity-view.ts';
import { AppError, notFound } from '../../kernel/errors.ts';
import { eventIds } from '../../kernel/ids.ts';
import type { SandboxChanged, SandboxEvent } from '../../domain/events/sandbox-events.ts';
import type { Consumer, RecordPosition } from '../../kernel/log/event-log.ts';
import type { Principal } from '../../kernel/auth.ts';
import { Sealer, secretsKey } from '../../kernel/tenant-secrets.ts';
import { TOPICS } from '../../kernel/topics.ts';
import { Watermark } from '../../kernel/watermark.ts';
import { RUN_METADATA } from '../../domain/run-plan.ts';
import type { TraceSource } from '../traces/ingest.ts';

/** How long a destroyed sandbox's stream stays available (a late or reconnecting client). */
const STREAM_GRACE_MS = 5 * 60_000;

export interface SandboxStream {
  events: SandboxEvent[];
  listeners: Set<(event: SandboxEvent) => void>;
  endedAt: number | null;
}

export class SandboxCatalog extends EntityCatalog<SandboxChanged> {
  private readonly byToken = new Map<string, SandboxChanged>();
  private readonly endListeners = new Set<(sandbox: SandboxChanged) => void>();
  private readonly streams = new Map<string, SandboxStream>();
  private readonly streamWatermark = new Watermark('the sandbox event streams');
  private consumer: Consumer | null = null;
  private sweeper: NodeJS.Timeout | null = null;
  private sealer: Sealer | null = null;

  constructor(kernel: Kernel) {
    super(kernel, TOPICS.sandboxes);
  }

  override async start(): Promise<void> {
    await super.start();
    this.consumer = await subscribe<SandboxEvent>(this.kernel, {
      groupId: `streams.${this.kernel.instanceId}`,
      topics: [TOPICS.sandboxEvents],
      fromBeginning: true,
      commit: false,
      watermark: this.streamWatermark,
      handle: async (events) => {
        for (const { value } of events) if (value) this.addEvent(value);
      },
    });
    this.sweeper = setInterval(() => this.sweep(), 60_000);
    this.sweeper.unref();
  }

  override async stop(): Promise<void> {
    if (this.sweeper) clearInterval(this.sweeper);
    await this.consumer?.stop();
    await super.stop();
  }

  /** A live sandbox's token hash finds it; a stopped or failed one's no longer does. */
  protected override changed(previous: SandboxChanged | undefined, next: SandboxChanged | null): void {
    if (previous) this.byToken.delete(previous.token_hash);
    if (next && next.state !== 'stopped' && next.state !== 'error') this.byToken.set(next.token_hash, next);
    const ended = (s: SandboxChanged | null | undefined) => s?.state === 'stopped' || s?.state === 'error';
    if (next && ended(next) && !ended(previous)) for (const listener of this.endListeners) listener(next);
  }

  /** Calls `listener` with each sandbox that ends (stopped or error: destroyed, timed out, its runner dead) from now on; returns how to stop. */
  onEnded(listener: (sandbox: SandboxChanged) => void): () => void {
    this.endListeners.add(listener);
    return () => this.endListeners.delete(listener);
  }

  waitFor(positions: RecordPosition[]): Promise<void> {
    return this.view.waitFor(positions, this.kernel.config.replyTimeout);
  }

  /**
   * Resolves once the view shows the sandbox in one of `states` (read-your-writes after the
   * runner's reply: the runner wrote the entity event before replying), or after the timeout.
   */
  async waitForState(id: string, states: Array<SandboxChanged['state']>): Promise<void> {
    await this.waitUntil(id, (sandbox) => states.includes(sandbox.state));
  }

  /**
   * Where the trace events a sandbox posts come from: its tenant, the tags a run's sandbox
   * carries in reserved metadata keys, and its secret values (sealed on its entity by the
   * runner) to redact.
   */
  traceSource(sandbox: SandboxChanged): TraceSource {
    const tag = (key: string) => sandbox.metadata[key] || null;
    const version = tag(RUN_METADATA.agentVersion);
    let secrets: Record<string, string> = {};
    if (sandbox.secrets_sealed) {
      this.sealer ??= new Sealer(secretsKey(this.kernel.config));
      secrets = JSON.parse(this.sealer.open(sandbox.secrets_sealed, `sandbox/${sandbox.sandbox_id}`)) as Record<string, string>;
    }
    return {
      tenant: sandbox.tenant,
      context: {
        sandbox_id: sandbox.sandbox_id,
        experiment_id: tag(RUN_METADATA.experimentId),
        scenario_id: tag(RUN_METADATA.scenarioId),
        run_id: tag(RUN_METADATA.runId),
        agent: tag(RUN_METADATA.agent),
        agent_version: version === null ? null : Number(version),
        agent_snapshot_id: tag(RUN_METADATA.agentSnapshotId),
      },
      secrets,
    };
  }

  /** The sandbox a `svc_sb_` token belongs to, while the sandbox lives. */
  byTokenHash(hash: string): SandboxChanged | undefined {
    return this.byToken.get(hash);
  }

  /**
   * A live sandbox the caller may use: 404 when unknown or gone, 403 when another tenant's
   * (server-made ids are global: docs/decisions.md, "Names and ids"), 403 for a sandbox token of
   * another sandbox.
   */
  owned(principal: Principal, id: string, options: { allowGone?: boolean } = {}): SandboxChanged {
    const sandbox = this.view.entities.get(id);
    if (!sandbox) throw notFound('sandbox', id);
    if (sandbox.tenant !== principal.tenant || (principal.kind === 'sandbox' && principal.keyId !== id)) {
      throw new AppError('forbidden', `sandbox ${id} belongs to another ${principal.kind === 'sandbox' ? 'sandbox' : 'tenant'}`);
    }
    if (!options.allowGone && (sandbox.state === 'stopped' || sandbox.state === 'error')) throw notFound('sandbox', id);
    return sandbox;
  }

  /**
   * Ends the live sandboxes of a dead runner in `error` (they died with it). The event ids derive
   * from the runner's last heartbeat, so several api processes doing it write the same events.
   */
  async endOwnedBy(runnerId: string, lastBeat: number, reason: string, only?: string): Promise<void> {
    const ids = eventIds(`runner-dead/${runnerId}/${lastBeat}`);
    const ended = [...this.view.entities.values()].filter(
      (s) =>
        s.runner_id === runnerId && (only === undefined || s.sandbox_id === only) && (s.state === 'creating' || s.state === 'ready' || s.state === 'running'),
    );
    if (ended.length === 0) return;
    this.kernel.logger.warn({ runner_id: runnerId, sandboxes: ended.length }, 'ending the sandboxes of a dead runner');
    await this.append(
      ended.map((s) => ({
        key: s.sandbox_id,
        tenant: s.tenant,
        value: { ...s, event_id: ids(s.sandbox_id), ts: Math.max(Date.now(), s.ts + 1), state: 'error', error: reason },
      })),
    );
  }

  /** Whether the view holds sandbox `id`, in any state. */
  has(id: string): boolean {
    return this.view.entities.has(id);
  }

  live(tenant: string): SandboxChanged[] {
    return [...this.view.entities.values()]
      .filter((s) => s.tenant === tenant && (s.state === 'creating' || s.state === 'ready' || s.state === 'running'))
      .sort((a, b) => a.created_at - b.created_at || a.sandbox_id.localeCompare(b.sandbox_id));
  }

  stream(id: string): SandboxStream | undefined {
    return this.streams.get(id);
  }

  private addEvent(event: SandboxEvent): void {
    let stream = this.streams.get(event.sandbox_id);
    if (!stream) this.streams.set(event.sandbox_id, (stream = { events: [], listeners: new Set(), endedAt: null }));
    if (stream.events.length > 0 && stream.events[stream.events.length - 1].seq >= event.seq) return; // a redelivery
    stream.events.push(event);
    if (event.event_type === 'status' && JSON.parse(event.data).state === 'destroyed') {
      stream.endedAt = event.ts;
      // Replaying history at start: a stream that ended long ago is not kept at all.
      if (Date.now() - event.ts > STREAM_GRACE_MS && stream.listeners.size === 0) {
        this.streams.delete(event.sandbox_id);
        return;
      }
    }
    for (const listener of stream.listeners) listener(event);
  }

  private sweep(): void {
    const now = Date.now();
    for (const [id, stream] of this.streams) {
      if (stream.endedAt !== null && now - stream.endedAt > STREAM_GRACE_MS && stream.listeners.size === 0) this.streams.delete(id);
    }
  }
}

/** The Sandbox object of the spec from the entity. */
export function sandboxView(s: SandboxChanged, baseUrl: string) {
  return {
    id: s.sandbox_id,
    spec_id: s.spec_id,
    state: s.state,
    path: s.path,
    url: `${baseUrl}/v1/sandboxes/${s.sandbox_id}`,
    created_at: new Date(s.created_at).toISOString(),
    expires_at: new Date(s.expires_at).toISOString(),
    metadata: s.metadata,
    services: JSON.parse(s.services) as Record<string, { host: string; port: number; ready: boolean }>,
    network: JSON.parse(s.network ?? 'null') as {
      name: string;
      address: string;
      egress: string;
      ingress: Array<{ to_port: number; host: string; port: number }>;
    } | null,
  };
}
