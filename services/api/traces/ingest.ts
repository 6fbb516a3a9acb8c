/**
 * The one way trace events enter the service, whatever the endpoint (POST /v1/traces,
 * POST /v1/sandboxes/:id/trace, POST /otel/v1/traces): stamped with the tenant and the tags of
 * where they came from, appended to svc.traces, and answered once the sink made them queryable
 * (read-your-writes).
 */
import { publish, type Kernel } from '../../kernel/actor.ts';
import type { SandboxChanged, TraceEvent, TraceEventsIngested } from '../../kernel/events.ts';
import { newEventId } from '../../kernel/ids.ts';
import { RUN_METADATA } from '../../kernel/runs.ts';
import { redactSecrets } from '../../kernel/tenant-secrets.ts';
import { TOPICS } from '../../kernel/topics.ts';

/** Most bytes of trace events per log record; a larger batch is split (Kafka's default limit is 1 MiB). */
const MAX_RECORD_BYTES = 900 * 1024;

/** Where ingested events came from: the tags every event of a batch shares. */
export type IngestContext = Omit<TraceEventsIngested, 'tenant' | 'event_id' | 'ts' | 'events'>;

/** Trace events from no sandbox carry no tags. */
export const UNTAGGED: IngestContext = { sandbox_id: null, experiment_id: null, agent: null, agent_snapshot_id: null, agent_version: null, scenario_id: null, run_id: null };

/** The tags of a sandbox's events: a run's sandbox carries its experiment, scenario, run and agent in reserved metadata keys. */
export function sandboxContext(sandbox: SandboxChanged): IngestContext {
  const tag = (key: string) => sandbox.metadata[key] || null;
  const version = tag(RUN_METADATA.agentVersion);
  return {
    sandbox_id: sandbox.sandbox_id,
    experiment_id: tag(RUN_METADATA.experimentId),
    scenario_id: tag(RUN_METADATA.scenarioId),
    run_id: tag(RUN_METADATA.runId),
    agent: tag(RUN_METADATA.agent),
    agent_version: version === null ? null : Number(version),
    agent_snapshot_id: tag(RUN_METADATA.agentSnapshotId),
  };
}

/** Secret values never reach the trace store (DECISIONS.md): replaced in input, output and metadata. */
export function redactTraceEvents(events: TraceEvent[], secrets: Record<string, string>): void {
  if (Object.keys(secrets).length === 0) return;
  for (const e of events) {
    if (e.input !== null) e.input = redactSecrets(e.input, secrets);
    if (e.output !== null) e.output = redactSecrets(e.output, secrets);
    for (const k of Object.keys(e.metadata)) e.metadata[k] = redactSecrets(e.metadata[k], secrets);
  }
}

/** Appends validated events for one tenant and waits until they are queryable. */
export async function ingestTraceEvents(kernel: Kernel, tenant: string, events: TraceEvent[], context: IngestContext): Promise<void> {
  if (events.length === 0) return;
  const records: TraceEvent[][] = [[]];
  let bytes = 0;
  for (const event of events) {
    let size = 300 + (event.input?.length ?? 0) + (event.output?.length ?? 0);
    for (const key in event.metadata) size += key.length + event.metadata[key].length + 4;
    if (bytes + size > MAX_RECORD_BYTES && records[records.length - 1].length > 0) {
      records.push([]);
      bytes = 0;
    }
    records[records.length - 1].push(event);
    bytes += size;
  }
  const ts = Date.now();
  const positions = await publish(
    kernel,
    TOPICS.traces,
    records.map((chunk) => {
      const id = newEventId();
      return { key: id, tenant, value: { tenant, event_id: id, ts, ...context, events: chunk } };
    }),
  );
  await kernel.visibility.waitFor(positions, kernel.config.replyTimeout);
}
