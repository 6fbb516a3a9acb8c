/** A record the actor runtime could not handle, as kept on svc.dead-letters (schemas/dead-lettered.avsc). */

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
