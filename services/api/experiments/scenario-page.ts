/**
 * GET /v1/scenarios: an experiment's scenarios in index order, each with its runs (as in
 * RunResults), filtered by verdict and id and paginated on the scenario index.
 */
import { tallyScenarios } from '../../domain/experiment-metrics.ts';
import type { ExperimentChanged } from '../../domain/events/experiment-events.ts';
import type { ScenarioVerdict } from '../../domain/stats.ts';
import type { Config } from '../../kernel/config.ts';
import { badRequest } from '../../kernel/errors.ts';
import { scenarioIdOf } from '../../kernel/ids.ts';
import type { Store } from '../../kernel/store/store.ts';
import { runFacts, runTraceStats } from '../../queries/run-facts.ts';
import type { PinnedPlan } from '../catalogs/experiment-catalog.ts';
import { decodeCursor, encodeCursor, parseLimit } from '../pagination.ts';
import { byIndex, loadRuns, scenarioIndices, scenarioResult, type ScenarioResult } from './run-results.ts';
import { scenarioParams } from './scenario-params.ts';

/** A scenario's verdict, or `pending` while no run of it is scored. */
export type ScenarioStatus = ScenarioVerdict | 'pending';

const SCENARIO_STATUSES: readonly ScenarioStatus[] = ['pass', 'fail', 'flaky', 'error', 'pending'];

/** The query parameters GET /v1/scenarios accepts besides limit and cursor. */
export const SCENARIO_PARAMS = ['experiment_id', 'status', 'scenario_id'];

export interface ScenarioQuery {
  experiment_id: string;
  filter: { status?: ScenarioStatus; scenario_id?: string };
  /** The index of the previous page's last scenario. */
  after: number | null;
  limit: number;
}

/** The query of GET /v1/scenarios, checked parameter by parameter (a 400 names the first bad one). */
export function parseScenarioQuery(q: Record<string, unknown>, config: Config): ScenarioQuery {
  const { experiment_id: experimentId, status, scenario_id: scenarioId } = q as Record<string, string | undefined>;
  if (experimentId === undefined || experimentId === '') throw badRequest('experiment_id', 'is required: the experiment whose scenarios to list');
  if (status !== undefined && !SCENARIO_STATUSES.includes(status as ScenarioStatus))
    throw badRequest('status', `must be one of ${SCENARIO_STATUSES.join(', ')}`);
  if (scenarioId === '') throw badRequest('scenario_id', 'must not be empty');
  const limit = parseLimit(q.limit, config);
  const cursor = decodeCursor(q.cursor, 1);
  if (cursor && !/^\d+$/.test(cursor[0])) throw badRequest('cursor', 'is not a cursor returned by this endpoint');
  return {
    experiment_id: experimentId,
    filter: { ...(status !== undefined && { status: status as ScenarioStatus }), ...(scenarioId !== undefined && { scenario_id: scenarioId }) },
    after: cursor ? Number(cursor[0]) : null,
    limit,
  };
}

/** The page of scenarios the query asks for, and the cursor after it (null on the last page). */
export async function scenarioPage(
  store: Store,
  experiment: ExperimentChanged,
  plan: PinnedPlan,
  baseUrl: string,
  { filter, after, limit }: ScenarioQuery,
): Promise<{ items: Array<ScenarioResult & { experiment_id: string }>; next: string | null }> {
  const { tenant, experiment_id: id } = experiment;
  // Verdicts first from the light columns, so only the page's runs are read in full.
  const tallies = new Map(tallyScenarios(await runFacts(store, tenant, id), plan.scoring.replica_aggregation).map((t) => [t.index, t]));
  const matching = scenarioIndices(plan, tallies.keys()).filter(
    (i) =>
      (after === null || i > after) &&
      (filter.status === undefined || (tallies.get(i)?.verdict ?? 'pending') === filter.status) &&
      (filter.scenario_id === undefined || scenarioIdOf(id, i) === filter.scenario_id),
  );
  const page = matching.slice(0, limit);
  if (page.length === 0) return { items: [], next: null };
  const [rows, traces, params] = await Promise.all([
    loadRuns(store, tenant, id, page),
    runTraceStats(store, tenant, id),
    plan.dataset ? scenarioParams(store, tenant, id, page) : undefined,
  ]);
  const groups = byIndex(rows);
  const ctx = { experiment, plan, baseUrl, scenarioParams: params };
  return {
    items: page.map((i) => ({ experiment_id: id, ...scenarioResult(ctx, i, groups.get(i) ?? [], traces) })),
    next: matching.length > limit ? encodeCursor([String(page[page.length - 1])]) : null,
  };
}
