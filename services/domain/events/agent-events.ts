/**
 * Event shapes of svc.agents: agent snapshot rows.
 * The .avsc files in schemas/ are the source of truth; these types follow them.
 */

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
