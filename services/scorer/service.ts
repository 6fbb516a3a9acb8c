/**
 * The scorer turns what the runners observed into verdicts, and applies score rules to stored runs
 * (docs/scoring.md).
 *
 * - svc.run-events (group `scorer`): every `finished` run is scored by its spec's rules
 *   (score.ts) and its RunScored, with the run's trace totals (read from ClickHouse), published
 *   on svc.run-scores, keyed by experiment id. A
 *   re-delivered event publishes the same run's score again: the aggregator counts distinct runs
 *   and the run_scores table keeps one row per run.
 * - svc.score-requests (group `scorer.requests`): a request for a whole experiment is expanded
 *   into one request per stored run (read from ClickHouse); a run's request is graded by every
 *   rule it carries (offline.ts) into ScoreRecorded events on svc.scores, and a `rescore` rule's
 *   new RunScore supersedes the run's on svc.run-scores.
 *
 * Its only state is a view of svc.experiments (the pinned spec of each experiment) and a cache of
 * parsed run specs, both rebuilt from the log. Bad data never throws out of a handler: a run of an
 * unknown experiment is logged and skipped, an outcome or spec that cannot be read is scored
 * `error` saying why (so its experiment still completes).
 */
import { LRUCache } from 'lru-cache';
import pLimit from 'p-limit';
import { publish, subscribe, type Delivered, type Kernel, type OutgoingEvent, type Service } from '../kernel/actor.ts';
import { EntityView } from '../kernel/entity-view.ts';
import { newEventId } from '../kernel/ids.ts';
import type { Consumer } from '../kernel/log/event-log.ts';
import { runTraceStats } from '../queries/run-facts.ts';
import { NO_TRACES, type RunTraceStats } from '../domain/experiment-metrics.ts';
import { specForRun } from '../domain/run-plan.ts';
import type { ExperimentChanged } from '../domain/events/experiment-events.ts';
import type { Params } from '../domain/params.ts';
import type { RunEvent, RunOutcome, RunScore, RunScored } from '../domain/events/run-events.ts';
import type { ScoreRecorded, ScoreRequested } from '../domain/events/score-events.ts';
import type { ScoreRule, StoredRun } from '../domain/score-rules.ts';
import type { SpecDocument } from '../domain/spec.ts';
import { TOPICS } from '../kernel/topics.ts';
import { createJudge, type Judge } from './judge.ts';
import { gradeRun, storedRuns } from './offline.ts';
import { scoreRun } from './score.ts';

/** Runs scored at once: judge calls overlap, so a batch takes about its slowest call. */
const CONCURRENCY = 16;
/** Parsed run specs kept (a spec parse costs about a millisecond; a run's score, microseconds). */
const SPEC_CACHE_SIZE = 512;

interface PinnedExperiment {
  tenant: string;
  yaml: string | null;
}

export class ScorerService implements Service {
  readonly name = 'scorer';
  private kernel!: Kernel;
  private judge!: Judge;
  private readonly experiments = new Map<string, PinnedExperiment>();
  private readonly specs = new LRUCache<string, SpecDocument>({ max: SPEC_CACHE_SIZE });
  private view: EntityView<ExperimentChanged> | null = null;
  private consumers: Consumer[] = [];

  async start(kernel: Kernel): Promise<void> {
    this.kernel = kernel;
    this.judge = createJudge(kernel.config);
    this.view = new EntityView<ExperimentChanged>(TOPICS.experiments, (_entities, { record, value }) => {
      if (record.key === null) return;
      if (value === null) this.experiments.delete(record.key);
      // The yaml is pinned once queued and never changes: only the tenant and it are kept.
      else this.experiments.set(record.key, { tenant: value.tenant, yaml: value.yaml ?? this.experiments.get(record.key)?.yaml ?? null });
    });
    await this.view.start(kernel);
    this.consumers.push(
      await subscribe<RunEvent>(kernel, { groupId: 'scorer', topics: [TOPICS.runEvents], maxBatchSize: 256, handle: (events) => this.onRunEvents(events) }),
      await subscribe<ScoreRequested>(kernel, {
        groupId: 'scorer.requests',
        topics: [TOPICS.scoreRequests],
        maxBatchSize: 64,
        handle: (events) => this.onScoreRequests(events),
      }),
    );
  }

  async stop(): Promise<void> {
    await Promise.all(this.consumers.map((c) => c.stop()));
    this.consumers = [];
    await this.view?.stop();
  }

  // --- live scoring -------------------------------------------------------------------------

  private async onRunEvents(events: Array<Delivered<RunEvent>>): Promise<void> {
    const finished = events.flatMap(({ value }) => (value?.kind === 'finished' ? [value] : []));
    if (finished.length === 0) return;
    const traces = await this.traceTotals(finished);
    const scores = (await pLimit(CONCURRENCY).map(finished, (e) => this.scoreFinished(e, traces))).filter((s): s is RunScored => s !== null);
    if (scores.length > 0)
      await publish(
        this.kernel,
        TOPICS.runScores,
        scores.map((s) => ({ key: s.experiment_id, tenant: s.tenant, value: s })),
      );
  }

  /**
   * The trace totals of the finished runs, by run id (one read per experiment of the batch). The
   * score carries them, so the aggregator needs no store for the experiment's metrics. A run's
   * sandbox posted its traces before it was torn down, and each post returned once they were
   * stored, so the totals are complete by the time its `finished` event is here.
   */
  private async traceTotals(finished: RunEvent[]): Promise<Map<string, RunTraceStats>> {
    const byExperiment = new Map<string, { tenant: string; experimentId: string; runIds: string[] }>();
    for (const e of finished) {
      if (e.experiment_id === null || e.run_id === null) continue;
      const key = `${e.tenant}\n${e.experiment_id}`;
      const group = byExperiment.get(key) ?? { tenant: e.tenant, experimentId: e.experiment_id, runIds: [] };
      group.runIds.push(e.run_id);
      byExperiment.set(key, group);
    }
    const totals = new Map<string, RunTraceStats>();
    for (const { tenant, experimentId, runIds } of byExperiment.values()) {
      for (const [runId, stats] of await runTraceStats(this.kernel.store, tenant, experimentId, runIds)) totals.set(`${tenant}\n${runId}`, stats);
    }
    return totals;
  }

  private async scoreFinished(e: RunEvent, traces: ReadonlyMap<string, RunTraceStats>): Promise<RunScored | null> {
    const { logger } = this.kernel;
    const where = { tenant: e.tenant, experiment_id: e.experiment_id, run_id: e.run_id };
    if (e.experiment_id === null || e.run_id === null || e.scenario_id === null) {
      logger.warn(where, 'a finished run event without its experiment, run or scenario id: skipped');
      return null;
    }
    const experiment = await this.experiment(e.experiment_id);
    if (!experiment || experiment.yaml === null || experiment.tenant !== e.tenant) {
      logger.warn(where, 'a finished run of an unknown (or not queued) experiment: skipped');
      return null;
    }
    const outcomeJson = e.outcome ?? '';
    let outcome: RunOutcome | null = null;
    let score: RunScore;
    try {
      outcome = JSON.parse(outcomeJson) as RunOutcome;
      score = await scoreRun(this.specFor(e.experiment_id, experiment.yaml, e.params ?? '{}'), outcome, this.judge);
    } catch (err) {
      // Only data this code cannot read gets here (the judge's failures are part of the score).
      logger.error({ ...where, err: (err as Error).message }, 'a finished run cannot be scored');
      score = { verdict: 'error', composite: null, invariants: [], violations: [], error: `the run cannot be scored: ${(err as Error).message}` };
    }
    return {
      tenant: e.tenant,
      event_id: newEventId(),
      ts: Date.now(),
      experiment_id: e.experiment_id,
      scenario_id: e.scenario_id,
      scenario_index: e.scenario_index,
      run_id: e.run_id,
      replica: e.replica,
      attempt: e.attempt,
      params: e.params ?? '{}',
      seed: e.seed ?? 0,
      sandbox_id: e.sandbox_id ?? outcome?.sandbox_id ?? null,
      agent_snapshot_id: e.agent_snapshot_id,
      verdict: score.verdict,
      composite: score.composite,
      invariants: JSON.stringify(score.invariants),
      violations: JSON.stringify(score.violations),
      error: score.error,
      wall_ms: Number.isFinite(outcome?.wall_ms) ? Math.max(0, Math.round(outcome!.wall_ms)) : 0,
      outcome: outcomeJson,
      traces: JSON.stringify(traces.get(`${e.tenant}\n${e.run_id}`) ?? NO_TRACES),
    };
  }

  /** The experiment's pinned spec; the view may trail the run events (separate consumers), so an unknown id waits for it to catch up once. */
  private async experiment(id: string): Promise<PinnedExperiment | undefined> {
    const known = this.experiments.get(id);
    if (known?.yaml) return known;
    const ends = await this.kernel.log.endOffsets(TOPICS.experiments);
    const positions = ends.flatMap((end, partition) => (end > 0 ? [{ topic: TOPICS.experiments, partition, offset: end - 1 }] : []));
    await this.view!.waitFor(positions, this.kernel.config.replyTimeout).catch(() => {});
    return this.experiments.get(id);
  }

  /** The run's spec: the experiment's yaml with its matrix entry, parsed once per (experiment, params). */
  private specFor(experimentId: string, yaml: string, params: string): SpecDocument {
    const key = `${experimentId}\n${params}`;
    let spec = this.specs.get(key);
    if (!spec) {
      spec = specForRun(yaml, JSON.parse(params) as Params);
      this.specs.set(key, spec);
    }
    return spec;
  }

  // --- offline scoring ----------------------------------------------------------------------

  private async onScoreRequests(events: Array<Delivered<ScoreRequested>>): Promise<void> {
    const requests = events.flatMap(({ value }) => (value ? [value] : []));
    const expansions = requests.filter((r) => r.run === null);
    for (const request of expansions) await this.expand(request);
    const graded = await pLimit(CONCURRENCY).map(
      requests.filter((r) => r.run !== null),
      (r) => this.grade(r),
    );
    const scores = graded.flatMap((g) => g.scores);
    const rescored = graded.flatMap((g) => g.rescored);
    if (scores.length > 0) await publish(this.kernel, TOPICS.scores, scores);
    if (rescored.length > 0) await publish(this.kernel, TOPICS.runScores, rescored);
  }

  /** One request per stored run of the experiment, so each is graded (and retried) on its own. */
  private async expand(request: ScoreRequested): Promise<void> {
    let runs = 0;
    for await (const page of storedRuns(this.kernel.store, request.tenant, request.experiment_id)) {
      runs += page.length;
      await publish(
        this.kernel,
        TOPICS.scoreRequests,
        page.map((run) => ({
          key: run.run_id,
          tenant: request.tenant,
          value: { ...request, event_id: newEventId(), ts: Date.now(), run: JSON.stringify(run) } satisfies ScoreRequested,
        })),
      );
    }
    this.kernel.logger.info(
      { tenant: request.tenant, experiment_id: request.experiment_id, request_id: request.request_id, runs },
      'offline scoring requested',
    );
  }

  private async grade(request: ScoreRequested): Promise<{ scores: OutgoingEvent[]; rescored: OutgoingEvent[] }> {
    const where = { tenant: request.tenant, experiment_id: request.experiment_id, request_id: request.request_id };
    let rules: ScoreRule[];
    let run: StoredRun;
    try {
      rules = JSON.parse(request.rules) as ScoreRule[];
      run = JSON.parse(request.run!) as StoredRun;
    } catch (err) {
      this.kernel.logger.error({ ...where, err: (err as Error).message }, 'a score request cannot be read: skipped');
      return { scores: [], rescored: [] };
    }
    const experiment = await this.experiment(request.experiment_id);
    let spec: SpecDocument | { error: string };
    try {
      if (!experiment?.yaml) throw new Error(`experiment ${request.experiment_id} has no pinned spec`);
      spec = this.specFor(request.experiment_id, experiment.yaml, run.params);
    } catch (err) {
      spec = { error: `the run's spec cannot be read: ${(err as Error).message}` };
    }
    const { grades, rescored } = await gradeRun(rules, run, spec, this.judge);
    const now = Date.now();
    const scores = grades.map((g) => {
      const value: ScoreRecorded = {
        tenant: request.tenant,
        event_id: newEventId(),
        ts: now,
        request_id: request.request_id,
        experiment_id: request.experiment_id,
        scenario_id: run.scenario_id,
        scenario_index: run.scenario_index,
        run_id: run.run_id,
        replica: run.replica,
        ...g,
      };
      return { key: request.experiment_id, tenant: request.tenant, value };
    });
    // A re-score that could not reach its judge does not replace a score that did.
    if (!rescored || rescored.invariants.some((i) => i.judge_failure)) return { scores, rescored: [] };
    const superseding: RunScored = {
      tenant: request.tenant,
      event_id: newEventId(),
      ts: now,
      experiment_id: request.experiment_id,
      scenario_id: run.scenario_id,
      scenario_index: run.scenario_index,
      run_id: run.run_id,
      replica: run.replica,
      attempt: run.attempt,
      params: run.params,
      seed: run.seed,
      sandbox_id: run.sandbox_id,
      agent_snapshot_id: run.agent_snapshot_id,
      verdict: rescored.verdict,
      composite: rescored.composite,
      invariants: JSON.stringify(rescored.invariants),
      violations: JSON.stringify(rescored.violations),
      error: rescored.error,
      wall_ms: run.wall_ms,
      outcome: run.outcome,
      traces: JSON.stringify(run.traces),
    };
    return { scores, rescored: [{ key: request.experiment_id, tenant: request.tenant, value: superseding }] };
  }
}
