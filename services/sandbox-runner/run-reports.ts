/**
 * The runner's reports on svc.run-events: one builder for every kind (started, finished,
 * rejected, runner_started), so each event carries the same fields taken the same way.
 */
import { publish, type Kernel } from '../kernel/actor.ts';
import { newEventId } from '../kernel/ids.ts';
import { TOPICS } from '../kernel/topics.ts';
import type { RunEvent, RunOutcome, RunRequested } from '../domain/events/run-events.ts';

/** What a report says beyond its run: the sandbox and agent of a run in progress, its outcome once finished. */
export interface RunReport {
  sandboxId?: string;
  agentSnapshotId?: string | null;
  outcome?: RunOutcome | null;
}

/** Publishes one RunEvent of `kind` about `run` (null: about the runner itself, as `runner_started`) by runner `runnerId`. */
export async function reportRun(kernel: Kernel, runnerId: string, kind: RunEvent['kind'], run: RunRequested | null, report: RunReport = {}): Promise<void> {
  const tenant = run?.tenant ?? '';
  const event: RunEvent = {
    tenant,
    event_id: newEventId(),
    ts: Date.now(),
    kind,
    runner_id: runnerId,
    experiment_id: run?.experiment_id ?? null,
    run_id: run?.run_id ?? null,
    attempt: run?.attempt ?? 0,
    sandbox_id: report.sandboxId ?? null,
    scenario_id: run?.scenario_id ?? null,
    scenario_index: run?.scenario_index ?? 0,
    replica: run?.replica ?? 0,
    params: run?.params ?? null,
    seed: run?.seed ?? null,
    agent_snapshot_id: report.agentSnapshotId ?? null,
    outcome: report.outcome ? JSON.stringify(report.outcome) : null,
  };
  await publish(kernel, TOPICS.runEvents, [{ key: run?.run_id ?? null, tenant, value: event }]);
}
