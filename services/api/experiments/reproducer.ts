/**
 * Reproducer: for a run that failed or errored, and every run of a flaky scenario, one shell
 * command that re-runs it alone (RunResult.reproducer). docs/experiments.md documents it.
 */
import type { ExperimentChanged, ExperimentOptions } from '../../domain/events/experiment-events.ts';
import { matrixPart, type Params, scenarioRecord } from '../../domain/params.ts';
import { shellQuote } from '../../kernel/shell.ts';

/**
 * One shell command that creates and runs an experiment of just this run: the same spec version,
 * agent snapshot, matrix entry and seed, one replica, and, over a dataset, the same record of the
 * same dataset version. Request secrets are not carried (they are never returned); add them to
 * the body when the spec needs them.
 */
export function reproducer(
  baseUrl: string,
  experiment: Pick<ExperimentChanged, 'spec_id' | 'spec_version' | 'options'>,
  run: { run_id: string; params: Params; seed: number; agent_snapshot_id: string | null },
): string {
  const record = scenarioRecord(run.params);
  const pinned = record === null ? undefined : (JSON.parse(experiment.options) as ExperimentOptions).dataset;
  const body = {
    name: `reproduce ${run.run_id}`,
    spec_id: experiment.spec_id,
    spec_version: experiment.spec_version,
    ...(run.agent_snapshot_id !== null ? { agent_snapshot_id: run.agent_snapshot_id } : {}),
    matrix: [matrixPart(run.params)],
    ...(record && { dataset: { id: record.dataset_id, version: pinned?.version ?? record.version, record_ids: [record.id] } }),
    replicas: 1,
    seed: run.seed,
    run: true,
  };
  return `curl -sS -X POST ${shellQuote(`${baseUrl}/v1/experiments`)} -H "Authorization: Bearer $SVC_API_KEY" -H 'Content-Type: application/json' -d ${shellQuote(JSON.stringify(body))}`;
}
