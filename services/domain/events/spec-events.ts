/**
 * Event shapes of svc.specs: stored spec versions.
 * The .avsc files in schemas/ are the source of truth; these types follow them.
 */

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
