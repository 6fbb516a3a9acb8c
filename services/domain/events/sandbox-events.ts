/**
 * Event shapes of the sandbox topics: svc.sandbox-requests and svc.sandbox-replies (request/reply), svc.sandboxes (entity), svc.sandbox-events (the stream) and svc.audit.
 * The .avsc files in schemas/ are the source of truth; these types follow them.
 */

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
  /** the runner it is for (null: written before requests were addressed) */
  runner_id: string | null;
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
  /** JSON: {name, address, egress, ingress: [{to_port, host, port}]} or null (a sandbox without a network). */
  network: string;
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

/**
 * The types of audit records (the spec's "Audit event", docs/sandboxes.md "Audit"): what
 * `type` of a record of svc.audit, the audit_events table and `.svc/audit.jsonl` can be.
 * `http_call` is one HTTP(S) request through the egress proxy (`audit.http_calls`);
 * `network_denied` is traffic the egress policy refused (`{protocol, host, ip, port, reason, ...}`).
 */
export const AUDIT_TYPES = [
  'file_write',
  'file_read',
  'file_delete',
  'db_write',
  'http_call',
  'process_spawn',
  'stdout',
  'secret_finding',
  'warning',
  'network_denied',
] as const;

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
