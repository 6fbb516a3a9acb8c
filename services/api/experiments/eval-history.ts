/**
 * GET /v1/evals/:id/history: the history of an eval (a spec id), its completed experiments
 * oldest first, each with its metrics (the snapshot taken at completion, else computed now).
 */
import type { ExperimentMetrics } from '../../domain/experiment-metrics.ts';
import { parsedSpec } from '../../domain/spec-cache.ts';
import { AppError } from '../../kernel/errors.ts';
import type { Store } from '../../kernel/store/store.ts';
import { experimentMetrics } from '../../queries/run-facts.ts';
import type { SpecCatalog } from '../catalogs/spec-catalog.ts';
import { specOrElse } from '../spec-lookup.ts';
import { experimentRows, type ExperimentRow } from './experiment-rows.ts';
import { iso } from './summary.ts';

export interface HistoryItem {
  experiment_id: string;
  name: string;
  spec_version: number;
  created_at: string;
  completed_at: string | null;
  pass_rate: number | null;
  metrics: ExperimentMetrics;
}

type HistoryRow = ExperimentRow & { Metrics: string; Yaml: string };

async function historyItem(store: Store, tenant: string, r: HistoryRow): Promise<HistoryItem> {
  const metrics =
    r.Metrics !== '' ? (JSON.parse(r.Metrics) as ExperimentMetrics) : await experimentMetrics(store, tenant, r.ExperimentId, parsedSpec(r.Yaml).scoring);
  return {
    experiment_id: r.ExperimentId,
    name: r.Name,
    spec_version: Number(r.SpecVersion),
    created_at: iso(r.created_ms)!,
    completed_at: iso(r.completed_ms),
    pass_rate: metrics.pass_rate,
    metrics,
  };
}

/** The page of the history after the cursor's experiment. A spec id the tenant never had is a 404; a deleted spec keeps its history. */
export async function evalHistory(
  store: Store,
  specs: SpecCatalog,
  tenant: string,
  specId: string,
  after: [number, string] | null,
  limit: number,
): Promise<{ items: HistoryItem[]; next: string | null }> {
  const { rows, next } = await experimentRows<HistoryRow>(
    store,
    {
      where: ['TenantId = {tenant:String}', 'SpecId = {spec:String}', "Status = 'completed'"],
      params: { tenant, spec: specId },
      extraColumns: ', Metrics, Yaml',
      newestFirst: false,
    },
    after,
    limit,
  );
  const items = await Promise.all(rows.map((r) => historyItem(store, tenant, r)));
  if (items.length === 0 && after === null) {
    specOrElse(specs, tenant, specId, undefined, () => new AppError('not_found', `eval ${specId} not found: no spec and no completed experiment of that id`));
  }
  return { items, next };
}
