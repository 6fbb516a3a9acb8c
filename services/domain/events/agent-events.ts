/**
 * Event shapes of svc.agents (agent snapshot rows) and svc.bundles (task-file bundles: what the
 * agent works on and what grades it, uploaded like an agent's bundle).
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

/** A value of svc.bundles (schemas/bundle-stored.avsc), keyed by `tenant/digest`: a task-file bundle a tenant uploaded. */
export interface BundleStored {
  tenant: string;
  event_id: string;
  ts: number;
  /** `sha256:<hex>` of the uploaded .tar.gz */
  digest: string;
  size_bytes: number;
  entries: number;
  /** relative to the task-file store (SVC_BLOB_DIR/task-files) */
  storage_path: string;
  created_at: number;
}
