/**
 * Trace events as svc.traces log records: the tags of where they came from, secrets redacted,
 * split so no record passes Kafka's default 1 MiB limit. Pure, so the api's event loop and the
 * ingest workers (ingest-worker.ts) build records the same way.
 */
import type { TraceEvent, TraceEventsIngested } from '../../domain/events/trace-events.ts';
import { eventIds } from '../../kernel/ids.ts';
import { redactSecrets } from '../../kernel/tenant-secrets.ts';

/** Most bytes of trace events per log record; a larger batch is split (Kafka's default limit is 1 MiB). */
const MAX_RECORD_BYTES = 900 * 1024;

/** Where ingested events came from: the tags every event of a batch shares. */
export type IngestContext = Omit<TraceEventsIngested, 'tenant' | 'event_id' | 'ts' | 'events'>;

/** Trace events from no sandbox carry no tags. */
export const UNTAGGED: IngestContext = {
  sandbox_id: null,
  experiment_id: null,
  agent: null,
  agent_snapshot_id: null,
  agent_version: null,
  scenario_id: null,
  run_id: null,
};

/**
 * Secret values never reach the trace store (docs/decisions.md): replaced in every string of an event,
 * metadata keys included. Fields cut at a limit were redacted before the cut, in validation.
 */
export function redactTraceEvents(events: TraceEvent[], secrets: Record<string, string>): void {
  if (Object.keys(secrets).length === 0) return;
  const redact = (text: string) => redactSecrets(text, secrets);
  for (const e of events) {
    e.event_id = redact(e.event_id);
    e.tool = redact(e.tool);
    e.trace_id = redact(e.trace_id);
    e.span_id = redact(e.span_id);
    if (e.parent_span_id !== null) e.parent_span_id = redact(e.parent_span_id);
    if (e.input !== null) e.input = redact(e.input);
    if (e.output !== null) e.output = redact(e.output);
    if (e.cost !== null) e.cost.model = redact(e.cost.model);
    const metadata: Record<string, string> = {};
    for (const [k, v] of Object.entries(e.metadata)) metadata[redact(k)] = redact(v);
    e.metadata = metadata;
  }
}

/** The record values of one tenant's events: a TraceEventsIngested per chunk, keyed by its id (`idOf('record <n>')`). */
export function traceRecords(
  tenant: string,
  events: TraceEvent[],
  context: IngestContext,
  ts: number,
  idOf = eventIds(null),
): Array<{ key: string; value: TraceEventsIngested }> {
  const chunks: TraceEvent[][] = [[]];
  let bytes = 0;
  for (const event of events) {
    let size = 300 + (event.input?.length ?? 0) + (event.output?.length ?? 0);
    for (const key in event.metadata) size += key.length + event.metadata[key].length + 4;
    if (bytes + size > MAX_RECORD_BYTES && chunks[chunks.length - 1].length > 0) {
      chunks.push([]);
      bytes = 0;
    }
    chunks[chunks.length - 1].push(event);
    bytes += size;
  }
  return chunks.map((chunk, n) => {
    const id = idOf(`record ${n}`);
    return { key: id, value: { tenant, event_id: id, ts, ...context, events: chunk } };
  });
}
