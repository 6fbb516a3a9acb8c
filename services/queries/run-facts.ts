/**
 * The ClickHouse reads behind the metrics of one experiment (domain/experiment-metrics.ts holds the
 * math): the latest score of every run (run_scores) and the trace events its sandbox reported
 * (trace_events, tagged with the experiment and, in ResourceAttributes, the run).
 */
import { computeMetrics, type ExperimentMetrics, type RunFact, type RunTraceStats } from '../domain/experiment-metrics.ts';
import type { ReplicaAggregation } from '../domain/stats.ts';
import type { Store } from '../kernel/store/store.ts';

/**
 * Trace totals by run id of one experiment ('' holds events without a run tag), or of only the
 * runs `runIds` names (the scorer's, for the runs it scores). Events are deduplicated by EventId:
 * a replayed batch the ReplacingMergeTree has not merged yet counts once.
 */
export async function runTraceStats(store: Store, tenant: string, experimentId: string, runIds?: readonly string[]): Promise<Map<string, RunTraceStats>> {
  const onlyRuns = runIds === undefined ? '' : " AND ResourceAttributes['svc.run_id'] IN {runs:Array(String)}";
  const rows = await store.query<{
    run_id: string;
    cost: number;
    input: string;
    output: string;
    cache_read: string;
    reasoning: string;
    llm: string;
    tools: string;
    tool_errors: string;
  }>(
    `SELECT ResourceAttributes['svc.run_id'] AS run_id, sum(EstimatedUsd) AS cost, sum(InputTokens) AS input, sum(OutputTokens) AS output,
            sum(CacheReadTokens) AS cache_read, sum(ReasoningTokens) AS reasoning,
            countIf(EventType = 'llm_call' AND Phase != 'start') AS llm,
            countIf(EventType IN ('tool_use', 'tool_call') AND Phase != 'start') AS tools,
            countIf(EventType IN ('tool_use', 'tool_call') AND Phase != 'start' AND StatusCode = 'Error') AS tool_errors
     FROM (SELECT * FROM trace_events WHERE TenantId = {tenant:String} AND ExperimentId = {experiment:String}${onlyRuns} LIMIT 1 BY EventId)
     GROUP BY run_id`,
    { tenant, experiment: experimentId, ...(runIds === undefined ? {} : { runs: runIds }) },
  );
  return new Map(
    rows.map((r) => [
      r.run_id,
      {
        cost_usd: r.cost,
        input_tokens: Number(r.input),
        output_tokens: Number(r.output),
        cache_read_tokens: Number(r.cache_read),
        reasoning_tokens: Number(r.reasoning),
        llm_calls: Number(r.llm),
        tool_calls: Number(r.tools),
        tool_errors: Number(r.tool_errors),
      },
    ]),
  );
}

/** The latest score of every run of an experiment, reduced to what the metrics need. */
export async function runFacts(store: Store, tenant: string, experimentId: string): Promise<RunFact[]> {
  const rows = await store.query<{ RunId: string; ScenarioIndex: number; Params: string; Verdict: string; WallMs: string; violations: string }>(
    `SELECT RunId, ScenarioIndex, Params, Verdict, WallMs, JSONLength(Violations) AS violations
     FROM run_scores FINAL WHERE TenantId = {tenant:String} AND ExperimentId = {experiment:String}`,
    { tenant, experiment: experimentId },
  );
  return rows.map((r) => ({
    run_id: r.RunId,
    scenario_index: Number(r.ScenarioIndex),
    params: r.Params,
    verdict: r.Verdict as RunFact['verdict'],
    wall_ms: Number(r.WallMs),
    violations: Number(r.violations),
  }));
}

/**
 * The metrics of one experiment of `tenant` as the store holds them now. `scoring` is the spec's
 * (its replica_aggregation decides which scenarios count as passing).
 */
export async function experimentMetrics(
  store: Store,
  tenant: string,
  experimentId: string,
  scoring: { replica_aggregation: ReplicaAggregation },
): Promise<ExperimentMetrics> {
  const [runs, traces] = await Promise.all([runFacts(store, tenant, experimentId), runTraceStats(store, tenant, experimentId)]);
  return computeMetrics(experimentId, runs, traces, scoring.replica_aggregation);
}
