/**
 * Experiments, runs and their outcomes: the shapes the api, the aggregator, the sandbox runner
 * and the scorer exchange through topics (docs/experiments.md documents them for users).
 *
 *   api        POST /v1/experiments            -> svc.experiments  (status created)
 *   api        POST /v1/experiments/:id/run    -> svc.experiment-commands (run; cancel likewise)
 *   aggregator queued, plans replicas x matrix -> svc.experiments, svc.run-requests (at most the concurrency in flight)
 *   runner     boots, runs the agent, checks   -> svc.run-events   (started, finished + RunOutcome)
 *   scorer     outcome -> scores, verdict      -> svc.run-scores
 *   aggregator scores -> scenario verdicts, metrics, completion -> svc.experiments
 *
 * The .avsc files in schemas/ are the source of truth; these types follow them.
 *
 * Scenario = one matrix entry; run = one replica of it (one sandbox, one agent execution).
 */

/** A value of svc.run-requests (schemas/run-requested.avsc): one run to execute. */
export interface RunRequested {
  tenant: string;
  event_id: string;
  ts: number;
  experiment_id: string;
  scenario_id: string;
  run_id: string;
  /** Index of the matrix entry (0-based) and of the replica (1-based). */
  scenario_index: number;
  replica: number;
  /** 1 on the first dispatch; a run whose runner was lost is dispatched again with attempt + 1. */
  attempt: number;
  spec_id: string;
  spec_version: number;
  yaml: string;
  /** The matrix entry as JSON (Params). */
  params: string;
  /** SVC_RANDOM_SEED of the run: the spec's determinism.seed, else derived from the run id. */
  seed: number;
  /** The resolved agent snapshot as JSON (ResolvedAgent), or null for other agent types. */
  agent: string | null;
  /** The experiment's request secrets, sealed (Sealer, context = experiment id); empty when none. */
  secrets: Buffer;
}

/** rejected: the runner had no free slot; the aggregator dispatches the run again later. */
export type RunEventKind = 'started' | 'finished' | 'rejected' | 'runner_started';

/** A value of svc.run-events (schemas/run-event.avsc). */
export interface RunEvent {
  tenant: string;
  event_id: string;
  ts: number;
  kind: RunEventKind;
  /** The runner process (its kernel instance id); for runner_started, the runner that (re)started. */
  runner_id: string;
  experiment_id: string | null;
  run_id: string | null;
  attempt: number;
  sandbox_id: string | null;
  /** The run's place in its experiment (copied from its RunRequested; null/0 for runner_started). */
  scenario_id: string | null;
  scenario_index: number;
  replica: number;
  /** Params JSON */
  params: string | null;
  seed: number | null;
  agent_snapshot_id: string | null;
  /** kind finished: the RunOutcome as JSON. */
  outcome: string | null;
}

/** What the runner observed; the scorer turns it into scores without re-running anything. */
export interface RunImage {
  reference: string;
  digest: string | null;
  replaced: string | null;
}

export interface RunOutcome {
  /**
   * completed: the agent ran (whatever its exit code) and the checks ran; boot_failed: the
   * sandbox did not boot; agent_timeout: the agent exceeded agent.timeout; error: anything
   * else that stopped the run (a refused capability, an infrastructure fault).
   */
  status: 'completed' | 'boot_failed' | 'agent_timeout' | 'error';
  /** Why, for every status but completed. */
  error: string | null;
  sandbox_id: string | null;
  /** ms since the epoch: from the run's start to its sandbox torn down. */
  started_at: number;
  ended_at: number;
  wall_ms: number;
  /**
   * The image the run's sandbox ran: the spec's `base`, the digest it resolved to (null for an
   * image imported without one), and what replaced it when it could not be had (the host's
   * system directories, SVC_SANDBOX_HOST_ROOTFS), else null. Absent when no sandbox booted, and
   * in outcomes of runners older than it.
   */
  image?: RunImage;
  /** The agent process: exit code, whether it was killed at its timeout, the tails of its output (4 KB each, secrets redacted). */
  agent: { exit_code: number | null; timed_out: boolean; duration_ms: number; stdout: string; stderr: string } | null;
  /** Invariant name -> what its check found in the workspace. */
  checks: Record<string, CheckResult>;
  /** The workspace diff against the ready snapshot. */
  diff: { added: string[]; modified: string[]; removed: string[] } | null;
  /** The audit facts the forbidden rules need, each with the audit record (seq) that shows it. */
  audit: {
    file_writes: Array<{ path: string; seq: number; ts: string }>;
    secret_findings: Array<{ name: string; seq: number; ts: string }>;
    /**
     * The `http_call` records (audit.http_calls): `host` is the service name for a call to a
     * backing service; `status` null when no answer came. Absent in outcomes of runners older
     * than HTTP capture.
     */
    http_calls?: Array<{ method: string; host: string; port?: number; path: string; status: number | null; seq: number; ts: string }>;
    /**
     * The `db_write` records (audit.db_writes): what each database committed, per table and
     * operation (`ddl`: a schema change, `command` its tag); `rolled_back` writes were undone and
     * count for no rule. Absent in outcomes of runners older than backing services.
     */
    db_writes?: Array<{
      service: string;
      table: string;
      operation: string;
      command?: string;
      row_count: number;
      rolled_back: boolean;
      seq: number;
      ts: string;
    }>;
    /** Records of these types the audit's limits dropped (absent in older outcomes): no rule reading them can hold. */
    dropped?: Record<string, number>;
  };
}

export interface CheckResult {
  type: string;
  /** null: not decided by the runner (llm_as_judge is graded by the scorer from judge_input). */
  passed: boolean | null;
  /** A score in [0, 1] when the check gives one (custom may); else the scorer uses passed ? 1 : 0. */
  score: number | null;
  /** Short: the verdict's reason, with at most a short excerpt of the output. */
  message: string;
  /** llm_as_judge: the text the judge grades (agent output, diff or a file), captured before teardown. */
  judge_input?: string;
  /** command_exit and custom: what the check printed (absent in outcomes of runners older than it). */
  output?: CheckOutput;
}

/** A check's stdout and stderr, each kept up to a bound (secret values redacted). */
export interface CheckOutput {
  stdout: CheckStream;
  stderr: CheckStream;
}

export interface CheckStream {
  /** The first bytes of the stream, as text. */
  text: string;
  /** How many bytes the check wrote to it, kept or not. */
  bytes: number;
  /** True when `text` is not all of it. */
  truncated: boolean;
}

/** One invariant's part of a run's score. */
export interface InvariantScore {
  name: string;
  type: string;
  /** In [0, 1]; null when it could not be graded (a judge call failure). */
  score: number | null;
  weight: number;
  gate: boolean;
  passed: boolean;
  message: string;
  /** True when an llm_as_judge check failed to reach its judge: infrastructure, not a 0. */
  judge_failure?: boolean;
}

export interface Violation {
  rule: 'file_writes_outside' | 'secrets_in_logs' | 'http_except' | 'db_writes_outside';
  message: string;
  /** The audit record that caused it. */
  audit: { seq: number; ts: string; path?: string; secret?: string; host?: string; method?: string; service?: string; table?: string };
}

/** A run's score: the scorer's answer to a RunOutcome. */
export interface RunScore {
  /** pass / fail by the spec's scoring rules; error when the run did not complete (boot, agent timeout, judge failure). */
  verdict: 'pass' | 'fail' | 'error';
  /** sum(weight x score) / sum(weight), 0 when a gate failed or a rule was violated; null for error. */
  composite: number | null;
  invariants: InvariantScore[];
  violations: Violation[];
  error: string | null;
}

/** A value of svc.run-scores (schemas/run-scored.avsc). */
export interface RunScored {
  tenant: string;
  event_id: string;
  ts: number;
  experiment_id: string;
  scenario_id: string;
  scenario_index: number;
  run_id: string;
  replica: number;
  attempt: number;
  params: string;
  seed: number;
  sandbox_id: string | null;
  agent_snapshot_id: string | null;
  verdict: RunScore['verdict'];
  composite: number | null;
  /** RunScore.invariants / violations as JSON. */
  invariants: string;
  violations: string;
  error: string | null;
  wall_ms: number;
  /** The RunOutcome as JSON, kept so offline scoring can re-grade without re-running. */
  outcome: string;
  /**
   * The run's trace totals (RunTraceStats JSON) as the store held them when the run was scored,
   * so the aggregator computes the experiment's metrics from the scores alone; null in scores
   * written before the field existed (counted as no traces).
   */
  traces: string | null;
}
