import { createHash, randomBytes, randomUUID } from 'node:crypto';

/** Ids in the forms of the spec. Random parts come from the CSPRNG. */
function hex(bytes: number): string {
  return randomBytes(bytes).toString('hex');
}

export const newEventId = (): string => randomUUID();
export const newRequestId = (): string => `req_${hex(8)}`;
export const newSandboxId = (seed: string | null = null): string => `sb-${seeded(seed, 'sandbox') ?? hex(8)}`;
export const newExperimentId = (seed: string | null = null): string => `exp-${seeded(seed, 'experiment') ?? hex(8)}`;

/** 8 bytes of hex derived from a seed (an idempotent request's), or null without one: the same request retried makes the same id. */
function seeded(seed: string | null, what: string): string | null {
  return seed === null ? null : createHash('sha256').update(`${seed}\n${what}`).digest('hex').slice(0, 16);
}
/** A scenario (matrix entry `index`, 0-based) of an experiment: `scn-<experiment hex>-<index + 1>`. */
export const scenarioIdOf = (experimentId: string, index: number): string => `scn-${experimentId.replace(/^exp-/, '')}-${index + 1}`;
/** A run (replica `replica`, 1-based) of a scenario: `run-<experiment hex>-<index + 1>-<replica>`. */
export const runIdOf = (experimentId: string, index: number, replica: number): string => `run-${experimentId.replace(/^exp-/, '')}-${index + 1}-${replica}`;
export const newScoreRuleId = (seed: string | null = null): string => `rule_${seeded(seed, 'score rule') ?? hex(8)}`;
export const newDatasetId = (seed: string | null = null): string => `ds_${seeded(seed, 'dataset') ?? hex(8)}`;
/** Record `index` of one add of records (the add's seed, when idempotent, makes the same ids again). */
export const newRecordId = (seed: string | null, index: number): string => `rec_${seeded(seed, `record ${index}`) ?? hex(8)}`;
export const newAlertId = (seed: string | null = null): string => `alert_${seeded(seed, 'alert rule') ?? hex(8)}`;
export const newKeyId = (seed: string | null = null): string => `key_${seeded(seed, 'api key') ?? hex(8)}`;
export const newLiveKey = (): string => `svc_live_${hex(24)}`;
export const newSandboxToken = (): string => `svc_sb_${hex(24)}`;
/** A terminal session of a sandbox (its shell): unguessable, as it addresses the session's bytes on the log. */
export const newTerminalSessionId = (): string => `term-${hex(12)}`;

export function sha256Hex(data: string | Buffer): string {
  return createHash('sha256').update(data).digest('hex');
}

/**
 * Makes the event ids of one piece of work, each named by its part (e.g. `event 3`): random, or,
 * with a seed, derived from it (a UUID-shaped sha256 of seed and part), so that doing the same
 * work again makes the same ids and consumers that deduplicate by id see one event.
 */
export function eventIds(seed: string | null): (part: string) => string {
  if (seed === null) return newEventId;
  return (part) => {
    const h = sha256Hex(`${seed}\n${part}`);
    return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20, 32)}`;
  };
}
