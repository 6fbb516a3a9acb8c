/** GET /v1/experiments: a tenant's experiments as summaries, newest first, from the experiments table. */
import type { VerdictCounts } from '../../domain/experiment-metrics.ts';
import type { Store } from '../../kernel/store/store.ts';
import { experimentRows, type ExperimentRow } from './experiment-rows.ts';
import { countsOf, type ExperimentSummary, iso } from './summary.ts';

function summaryOfRow(r: ExperimentRow, counts: VerdictCounts): ExperimentSummary {
  return {
    id: r.ExperimentId,
    name: r.Name,
    spec_id: r.SpecId,
    spec_version: Number(r.SpecVersion),
    status: r.Status,
    created_at: iso(r.created_ms)!,
    queued_at: iso(r.queued_ms),
    started_at: iso(r.started_ms),
    completed_at: iso(r.completed_ms),
    total_runs: Number(r.TotalRuns),
    scored_runs: Number(r.ScoredRuns),
    counts,
    error: r.Error === '' ? null : r.Error,
  };
}

/** A tenant's experiments after the cursor's, newest first, and the cursor after them. */
export async function listExperiments(
  store: Store,
  tenant: string,
  after: [number, string] | null,
  limit: number,
): Promise<{ items: ExperimentSummary[]; next: string | null }> {
  const { rows, next } = await experimentRows(store, { where: ['TenantId = {tenant:String}'], params: { tenant }, newestFirst: true }, after, limit);
  const counts = await countsOf(
    store,
    tenant,
    rows.map((r) => r.ExperimentId),
  );
  return { items: rows.map((r) => summaryOfRow(r, counts.get(r.ExperimentId)!)), next };
}
