/**
 * Event shapes of svc.runners (schemas/runner-heartbeat.avsc): the sandbox runners' heartbeats.
 */

/** A value of svc.runners. */
export interface RunnerHeartbeat {
  tenant: string;
  event_id: string;
  ts: number;
  runner_id: string;
  started_at: number;
  sandboxes: number;
  capacity: number;
  available: boolean;
  stopping: boolean;
}
