/**
 * An experiment's plan: the request's overrides (ExperimentOptions) over its pinned spec, resolved
 * here once for the api (the run command's count, the results) and the aggregator (the runs it
 * dispatches), so they cannot disagree on what an experiment runs.
 */
import { createHash } from 'node:crypto';
import { runIdOf, scenarioIdOf } from '../kernel/ids.ts';
import { scenarioCount } from './datasets.ts';
import type { ExperimentDataset, ExperimentOptions } from './events/experiment-events.ts';
import type { Params } from './params.ts';
import { SPEC_DEFAULTS, type SpecDocument } from './spec.ts';

/** What of the spec a plan reads. */
export type PlanSpec = Pick<SpecDocument, 'parallelism' | 'determinism'>;

export interface ExperimentPlan {
  /** The matrix entries: the request's, else the spec's. Over a dataset each runs with every selected record. */
  matrix: Params[];
  /** The dataset it runs, pinned at creation. */
  dataset: ExperimentDataset | null;
  /** How many scenarios it runs: matrix entries x dataset records. */
  scenarios: number;
  /** The request's, else the spec's. */
  replicas: number;
  /** scenarios x replicas. */
  totalRuns: number;
  /** The seed of every run: the request's, else the spec's; null when each run derives its own from its id. */
  seed: number | null;
}

/**
 * The plan of an experiment whose spec is gone (deleted before it was queued): the request's
 * overrides and the spec defaults are known, its matrix is not (unless the request gave one).
 */
export type PlanWithoutMatrix = Omit<ExperimentPlan, 'matrix' | 'scenarios' | 'totalRuns'> & { matrix: null; scenarios: null; totalRuns: null };

/** The request's overrides over the spec (null: the spec is gone). */
export function experimentPlan(options: ExperimentOptions, spec: PlanSpec): ExperimentPlan;
export function experimentPlan(options: ExperimentOptions, spec: PlanSpec | null): ExperimentPlan | PlanWithoutMatrix;
export function experimentPlan(options: ExperimentOptions, spec: PlanSpec | null): ExperimentPlan | PlanWithoutMatrix {
  const matrix = options.matrix ?? spec?.parallelism.matrix ?? null;
  const dataset = options.dataset ?? null;
  const replicas = options.replicas ?? spec?.parallelism.replicas ?? SPEC_DEFAULTS.replicas;
  const seed = options.seed ?? spec?.determinism.seed ?? null;
  if (matrix === null) return { matrix, dataset, scenarios: null, replicas, totalRuns: null, seed };
  const scenarios = scenarioCount(matrix.length, options.dataset);
  return { matrix, dataset, scenarios, replicas, totalRuns: scenarios * replicas, seed };
}

export interface PlannedRun {
  runId: string;
  scenarioId: string;
  index: number;
  replica: number;
  params: Params;
  seed: number;
}

/**
 * The runs of a plan: replicas x scenarios, replica-major (every scenario's first replica before
 * any second), so early results cover every scenario. `scenarioParams` are the params of each
 * scenario: the matrix entries, or over a dataset the scenarios the api wrote. A run's seed is the
 * plan's, else one derived from its run id (stable across attempts).
 */
export function planRuns(experimentId: string, plan: Pick<ExperimentPlan, 'replicas' | 'seed'>, scenarioParams: Params[]): PlannedRun[] {
  const runs: PlannedRun[] = [];
  for (let replica = 1; replica <= plan.replicas; replica++) {
    for (const [index, params] of scenarioParams.entries()) {
      const runId = runIdOf(experimentId, index, replica);
      const seed = plan.seed ?? createHash('sha256').update(runId).digest().readUInt32BE(0) % 2 ** 31;
      runs.push({ runId, scenarioId: scenarioIdOf(experimentId, index), index, replica, params, seed });
    }
  }
  return runs;
}
