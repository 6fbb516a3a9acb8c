/**
 * Event shapes of svc.experiments (entity) and svc.experiment-commands (run, cancel).
 * The .avsc files in schemas/ are the source of truth; these types follow them.
 */
import type { Params } from '../params.ts';

export type ExperimentStatus = 'created' | 'queued' | 'running' | 'completed' | 'failed' | 'cancelled';

/** A value of svc.experiments (schemas/experiment-changed.avsc). */
export interface ExperimentChanged {
  tenant: string;
  event_id: string;
  ts: number;
  experiment_id: string;
  name: string;
  spec_id: string;
  spec_version: number;
  status: ExperimentStatus;
  created_at: number;
  queued_at: number | null;
  started_at: number | null;
  completed_at: number | null;
  /** replicas x matrix entries; 0 until queued. */
  total_runs: number;
  scored_runs: number;
  /** Runs in flight at most: resources.concurrency_limit bounded by the tenant's sandbox quota. */
  concurrency: number;
  /** ExperimentOptions as JSON. */
  options: string;
  /** The request secrets, sealed (Sealer, context = experiment id); empty when none. */
  secrets: Buffer;
  yaml: string | null;
  /** ResolvedAgent JSON, pinned when queued. */
  agent: string | null;
  /** Why the experiment failed or was cancelled. */
  error: string | null;
  /** ExperimentMetrics JSON, set when completed. */
  metrics: string | null;
}

/** What POST /v1/experiments may override: what a reproducer pins. */
export interface ExperimentOptions {
  spec_version?: number;
  agent_snapshot_id?: string;
  /** Replaces the spec's parallelism.matrix. */
  matrix?: Params[];
  /** Replaces the spec's parallelism.replicas. */
  replicas?: number;
  /** Replaces the spec's determinism.seed for every run. */
  seed?: number;
  /** The dataset the experiment runs, pinned when it was created: one scenario per record and matrix entry. */
  dataset?: ExperimentDataset;
}

/**
 * The dataset an experiment runs (docs/datasets.md), as pinned at creation: with the spec version
 * and the agent snapshot, it names exactly what each scenario ran, so a reproducer can run one again.
 */
export interface ExperimentDataset {
  id: string;
  name: string;
  version: number;
  /** Records with any of these tags only. */
  tags?: string[];
  /** These records only (a reproducer's). */
  record_ids?: string[];
  /** How many records were selected: the experiment's scenarios are records x matrix entries, record-major. */
  records: number;
}

/**
 * A value of svc.experiment-scenarios (schemas/experiment-scenario.avsc): one scenario of an
 * experiment over a dataset, written by the api before the experiment itself.
 */
export interface ExperimentScenario {
  tenant: string;
  event_id: string;
  ts: number;
  experiment_id: string;
  scenario_index: number;
  scenario_count: number;
  /** Params JSON: the matrix entry with the record (domain/params.ts, RECORD_PARAM). */
  params: string;
}

/** A value of svc.experiment-commands (schemas/experiment-command.avsc): the api asks the aggregator. */
export interface ExperimentCommand {
  tenant: string;
  event_id: string;
  ts: number;
  experiment_id: string;
  command: 'run' | 'cancel';
  yaml: string | null;
  agent: string | null;
  total_runs: number;
  concurrency: number;
}
