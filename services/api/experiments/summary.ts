/**
 * The experiment summary: the shape every experiment endpoint answers with or embeds (create,
 * run, cancel, the list, the head of RunResults), with its scenarios counted by verdict from
 * run_scores. docs/experiments.md documents it.
 */
import type { VerdictCounts } from '../../domain/experiment-metrics.ts';
import type { ExperimentChanged } from '../../domain/events/experiment-events.ts';
import { scenarioVerdict } from '../../domain/stats.ts';
import type { Store } from '../../kernel/store/store.ts';

/** An epoch-ms time (a number, or a ClickHouse Int64 as a string) as ISO 8601; null stays null. */
export const iso = (ms: number | string | null): string | null => (ms === null ? null : new Date(Number(ms)).toISOString());

const noCounts = (): VerdictCounts => ({ pass: 0, fail: 0, flaky: 0, error: 0 });

export interface ExperimentSummary {
  id: string;
  name: string;
  spec_id: string;
  spec_version: number;
  status: string;
  created_at: string;
  queued_at: string | null;
  started_at: string | null;
  completed_at: string | null;
  total_runs: number;
  scored_runs: number;
  /** Scenarios by verdict so far. */
  counts: VerdictCounts;
  /** Why it failed or was cancelled. */
  error: string | null;
}

export function experimentSummary(e: ExperimentChanged, counts: VerdictCounts = noCounts()): ExperimentSummary {
  return {
    id: e.experiment_id,
    name: e.name,
    spec_id: e.spec_id,
    spec_version: e.spec_version,
    status: e.status,
    created_at: iso(e.created_at)!,
    queued_at: iso(e.queued_at),
    started_at: iso(e.started_at),
    completed_at: iso(e.completed_at),
    total_runs: e.total_runs,
    scored_runs: e.scored_runs,
    counts,
    error: e.error,
  };
}

/** Scenario verdict counts of several experiments of one tenant, in one query. */
export async function countsOf(store: Store, tenant: string, ids: string[]): Promise<Map<string, VerdictCounts>> {
  const out = new Map(ids.map((id) => [id, noCounts()]));
  if (ids.length === 0) return out;
  const rows = await store.query<{ ExperimentId: string; passed: string; failed: string }>(
    `SELECT ExperimentId, ScenarioIndex, countIf(Verdict = 'pass') AS passed, countIf(Verdict = 'fail') AS failed
     FROM run_scores FINAL WHERE TenantId = {tenant:String} AND ExperimentId IN {ids:Array(String)}
     GROUP BY ExperimentId, ScenarioIndex`,
    { tenant, ids },
  );
  for (const r of rows) out.get(r.ExperimentId)![scenarioVerdict(Number(r.passed), Number(r.failed))]++;
  return out;
}
