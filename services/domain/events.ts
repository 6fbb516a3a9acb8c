/**
 * TypeScript shapes of the Avro event values in schemas/ that more than one service handles.
 * The .avsc files are the source of truth; these types must follow them.
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

/** A value of svc.dead-letters (schemas/dead-lettered.avsc). */
export interface DeadLettered {
  tenant: string;
  event_id: string;
  ts: number;
  group_id: string;
  topic: string;
  partition: number;
  offset: number;
  key: string | null;
  value: Buffer | null;
  error: string;
  attempts: number;
}

/** A value of svc.agents (schemas/agent-snapshot-changed.avsc). */
export interface AgentSnapshotChanged {
  tenant: string;
  event_id: string;
  ts: number;
  id: string;
  name: string;
  version: number;
  tag: string | null;
  digest: string;
  size_bytes: number;
  storage_path: string;
  runtime: string | null;
  entrypoint: string[];
  /** AgentAuth as JSON. */
  auth: string | null;
  created_at: number;
  deleted: boolean;
}

/** A value of svc.specs (schemas/spec-stored.avsc). */
export interface SpecStored {
  tenant: string;
  event_id: string;
  ts: number;
  spec_id: string;
  version: number;
  yaml: string;
  deleted: boolean;
}

/** A value of svc.sandbox-requests (schemas/sandbox-requested.avsc). */
export interface SandboxRequested {
  tenant: string;
  event_id: string;
  ts: number;
  correlation_id: string;
  sandbox_id: string;
  op: string;
  /** JSON; empty when sealed */
  payload: string;
  payload_sealed: Buffer | null;
}

/** A value of svc.sandbox-replies (schemas/sandbox-replied.avsc). */
export interface SandboxReplied {
  tenant: string;
  event_id: string;
  ts: number;
  correlation_id: string;
  sandbox_id: string;
  status: number;
  error: string | null;
  content_type: string;
  /** empty when sealed */
  body: Buffer;
  body_sealed: Buffer | null;
}

/** A value of svc.sandboxes (schemas/sandbox-changed.avsc). */
export interface SandboxChanged {
  tenant: string;
  event_id: string;
  ts: number;
  sandbox_id: string;
  spec_id: string;
  spec_version: number;
  state: 'creating' | 'ready' | 'running' | 'stopped' | 'error';
  path: string;
  created_at: number;
  expires_at: number;
  metadata: Record<string, string>;
  services: string;
  runner_id: string;
  token_hash: string;
  error: string | null;
  secrets_sealed: Buffer | null;
}

/** A value of svc.sandbox-events (schemas/sandbox-event.avsc). */
export interface SandboxEvent {
  tenant: string;
  event_id: string;
  ts: number;
  sandbox_id: string;
  seq: number;
  event_type: string;
  data: string;
}

/** A value of svc.audit (schemas/audit-recorded.avsc). */
export interface AuditRecorded {
  tenant: string;
  event_id: string;
  ts: number;
  sandbox_id: string;
  record_ts: number;
  type: string;
  details: string;
}

/** A value of svc.tenant-secrets (schemas/tenant-secret-changed.avsc). */
export interface TenantSecretChanged {
  tenant: string;
  event_id: string;
  ts: number;
  name: string;
  ciphertext: Buffer | null;
}
