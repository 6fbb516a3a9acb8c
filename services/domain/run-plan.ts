/**
 * Run planning: the spec a run executes (its matrix entry applied), how long its sandbox may
 * live, and the metadata keys that tag its sandbox.
 */
import type { Config } from '../kernel/config.ts';
import { applyParams, type Params } from './params.ts';
import { specFromDocument, type SpecDocument } from './spec.ts';
import { specTree } from './spec-cache.ts';

/** Room for boot, checks and teardown beyond the sandbox's and the agent's timeouts. */
const RUN_LIFETIME_MARGIN_MS = 10 * 60_000;

/**
 * How long a run's sandbox may live: the sandbox timeout plus the agent's, plus room for boot,
 * checks and teardown. The runner gives it to the sandbox; the aggregator's lease on the run
 * is derived from it, so a run still within its lifetime is never dispatched again.
 */
export function runLifetimeMs(spec: SpecDocument, config: Pick<Config, 'sandboxTimeout' | 'agentTimeout'>): number {
  return (spec.resources.timeoutMs ?? config.sandboxTimeout) + (spec.agent?.timeoutMs ?? config.agentTimeout) + RUN_LIFETIME_MARGIN_MS;
}

/** Reserved sandbox metadata keys a run's sandbox carries; trace ingest tags events from them. */
export const RUN_METADATA = {
  experimentId: 'svc.experiment_id',
  scenarioId: 'svc.scenario_id',
  runId: 'svc.run_id',
  agent: 'svc.agent',
  agentVersion: 'svc.agent_version',
  agentSnapshotId: 'svc.agent_snapshot_id',
} as const;

/** The spec of one run: `{{ params.NAME }}` in every string of the document replaced by the run's matrix entry. */
export function specForRun(yaml: string, params: Params): SpecDocument {
  // Every run of an experiment shares the text's tree (a 200-entry matrix takes ms to parse).
  const raw = specTree(yaml);
  const substitute = (node: unknown): unknown => {
    if (typeof node === 'string') return applyParams(node, params);
    if (Array.isArray(node)) return node.map(substitute);
    if (node !== null && typeof node === 'object') return Object.fromEntries(Object.entries(node).map(([k, v]) => [k, substitute(v)]));
    return node;
  };
  return specFromDocument(substitute(raw) as Record<string, unknown>, { applied: true });
}
