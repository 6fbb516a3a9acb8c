/**
 * Event shapes of svc.traces: the trace events agents report.
 * The .avsc files in schemas/ are the source of truth; these types follow them.
 */

/** One trace event inside svc.traces (schemas/trace-events-ingested.avsc, TraceEvent). */
export interface TraceEvent {
  event_id: string;
  ts_us: number;
  event_type: string;
  tool: string;
  phase: string;
  trace_id: string;
  span_id: string;
  parent_span_id: string | null;
  duration_ms: number;
  status: string;
  input: string | null;
  output: string | null;
  cost: {
    input_tokens: number;
    output_tokens: number;
    cache_read_tokens: number;
    reasoning_tokens: number;
    model: string;
    estimated_usd: number;
  } | null;
  metadata: Record<string, string>;
}

/** A value of svc.traces (schemas/trace-events-ingested.avsc). */
export interface TraceEventsIngested {
  tenant: string;
  event_id: string;
  ts: number;
  sandbox_id: string | null;
  experiment_id: string | null;
  agent: string | null;
  agent_snapshot_id: string | null;
  agent_version: number | null;
  /** Tags of events from an experiment's run sandbox. */
  scenario_id: string | null;
  run_id: string | null;
  events: TraceEvent[];
}
