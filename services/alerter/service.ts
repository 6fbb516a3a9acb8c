/**
 * The alerter evaluates alert rules when experiments complete and notifies (docs/alerts.md).
 *
 * - svc.experiments (group `alerter`): each `completed` experiment is evaluated against the rules
 *   that apply to it (rules.ts: the tenant's rules of its spec or of every spec, and its spec's
 *   `alerts` block) with domain/alerts.ts; every rule that holds records a firing on
 *   svc.alert-firings (pending, or deduplicated within SVC_ALERT_DEDUP_WINDOW of the rule's last
 *   firing for that experiment), which deliveries.ts then notifies.
 * - svc.alert-evaluations (group `alerter.evaluations`): POST /v1/alerts/:id/evaluate, answered
 *   on svc.alert-replies.
 *
 * Restart-safe, with at-least-once delivery of the log and idempotent handling: a completion is
 * committed only after its firings are on the log, and a firing's id derives from the rule, the
 * experiment and the trigger, so a completion handled again after a crash finds its firings and
 * records none twice; firings not delivered yet are resumed at start (deliveries.ts). A new
 * alerter (its group has committed nothing) does not evaluate the completions before its first
 * start, so deploying it does not page anyone about history.
 *
 * Its state is rebuilt from the log at every start: the rules (svc.alerts), the completed
 * experiments and the runs of the recent ones (svc.experiments, svc.run-scores, kept in
 * domain/alert-history.ts), and the firings (firing-index.ts). It reads no store.
 */
import { setTimeout as sleep } from 'node:timers/promises';
import { subscribe, type Kernel, type Service } from '../kernel/actor.ts';
import { EntityView } from '../kernel/entity-view.ts';
import { AppError } from '../kernel/errors.ts';
import { newEventId } from '../kernel/ids.ts';
import { KeyedQueue } from '../kernel/keyed-queue.ts';
import type { Consumer, RecordPosition } from '../kernel/log/event-log.ts';
import { reply, type Exchange } from '../kernel/request-reply.ts';
import { TOPICS } from '../kernel/topics.ts';
import { AlertHistory, runOfScore } from '../domain/alert-history.ts';
import { duplicateOf, evaluateRule, type CompletedExperiment, type EvaluationAnswer } from '../domain/alerts.ts';
import { computeMetrics, type ExperimentMetrics } from '../domain/experiment-metrics.ts';
import type { AlertChanged, AlertEvaluationReplied, AlertEvaluationRequested, AlertFired } from '../domain/events/alert-events.ts';
import type { ExperimentChanged } from '../domain/events/experiment-events.ts';
import type { RunScored } from '../domain/events/run-events.ts';
import type { SpecDocument } from '../domain/spec.ts';
import { readableSpec } from '../domain/spec-cache.ts';
import { Deliveries } from './deliveries.ts';
import { FiringIndex } from './firing-index.ts';
import { Notifiers } from './notifiers.ts';
import { firingIdOf, fromApiRule, fromSpecAlert, newFiring, type ApplicableRule } from './rules.ts';

const EXCHANGE: Exchange<AlertEvaluationReplied> = { requests: TOPICS.alertEvaluations, replies: TOPICS.alertReplies, correlationOf: (r) => r.correlation_id };
const PRUNE_EVERY_MS = 10 * 60_000;
/** The one key of the evaluations' queue: they all take turns together. */
const EVALUATIONS = 'evaluations';
/** An unfinished firing this old that no delivery here is working on is taken up again. */
const SWEEP_AFTER_MS = 60_000;
/** How long a stop lets deliveries under way finish before leaving them to the next start. */
const STOP_GRACE_MS = 10_000;

export class AlerterService implements Service {
  readonly name = 'alerter';
  private kernel!: Kernel;
  private readonly history = new AlertHistory();
  private readonly firings = new FiringIndex();
  private views: Array<EntityView<unknown>> = [];
  private rulesView!: EntityView<AlertChanged>;
  private experimentsView!: EntityView<ExperimentChanged>;
  private scoresView!: EntityView<RunScored>;
  private firingsView!: EntityView<AlertFired>;
  private notifiers!: Notifiers;
  private deliveries!: Deliveries;
  private consumers: Consumer[] = [];
  private pruneTimer: NodeJS.Timeout | null = null;
  /** Evaluations take turns, one at a time: dedup reads the firings an earlier evaluation may be writing. */
  private readonly evaluations = new KeyedQueue();

  async start(kernel: Kernel): Promise<void> {
    this.kernel = kernel;
    // Runs of experiments completed before the horizon are not held, even while replaying.
    this.history.prune(Date.now() - kernel.config.alertMaxWindow);
    this.rulesView = new EntityView<AlertChanged>(TOPICS.alerts);
    this.experimentsView = new EntityView<ExperimentChanged>(TOPICS.experiments, (_e, { value }) => value && this.onExperiment(value));
    this.scoresView = new EntityView<RunScored>(TOPICS.runScores, (_e, { value }) => {
      if (value) {
        const { fact, traces } = runOfScore(value);
        this.history.score(value.experiment_id, fact, traces, value.ts);
      }
    });
    this.firingsView = new EntityView<AlertFired>(TOPICS.alertFirings, (_e, { value }) => value && this.firings.apply(value));
    // The experiments before their scores: a score of an old experiment is then dropped as it comes.
    this.views = [this.rulesView, this.experimentsView, this.scoresView, this.firingsView] as Array<EntityView<unknown>>;
    for (const view of this.views) await view.start(kernel);
    this.notifiers = new Notifiers(kernel.config, kernel.logger);
    this.deliveries = new Deliveries(kernel, this.notifiers, (firings) => this.recordFirings(firings));
    const unfinished = this.firings.unfinished();
    if (unfinished.length > 0) kernel.logger.info({ firings: unfinished.length }, 'resuming alert deliveries left unfinished');
    this.deliveries.start(unfinished);
    this.consumers.push(
      await this.subscribeCompletions(),
      await subscribe<AlertEvaluationRequested>(kernel, {
        groupId: 'alerter.evaluations',
        topics: [TOPICS.alertEvaluations],
        fromBeginning: false,
        handle: async (events) => {
          for (const { value } of events) if (value) await this.serial(() => this.onEvaluationRequest(value));
        },
      }),
    );
    this.pruneTimer = setInterval(() => {
      this.history.prune(Date.now() - kernel.config.alertMaxWindow);
      // Deliveries whose states could not be recorded (the log was away): tried again.
      this.deliveries.start(this.firings.unfinished().filter((f) => Date.now() - f.ts > SWEEP_AFTER_MS));
    }, PRUNE_EVERY_MS);
    this.pruneTimer.unref();
  }

  async stop(): Promise<void> {
    if (this.pruneTimer) clearInterval(this.pruneTimer);
    await Promise.all(this.consumers.map((c) => c.stop()));
    this.consumers = [];
    await this.evaluations.settled();
    await this.deliveries?.stop(STOP_GRACE_MS);
    await Promise.all(this.views.map((v) => v.stop()));
    await this.notifiers?.close();
  }

  /** Completions, after those a new alerter's group finds on the log when it first starts. */
  private async subscribeCompletions(): Promise<Consumer> {
    const { log, logger } = this.kernel;
    const committed = await log.committedOffsets('alerter', TOPICS.experiments);
    const ends = await log.endOffsets(TOPICS.experiments);
    const fresh = committed.every((c) => c < 0);
    const backlog = fresh ? ends : ends.map(() => 0);
    if (fresh && ends.some((e) => e > 0))
      logger.info({ records: ends.reduce((a, b) => a + b, 0) }, 'a new alerter: completions before its first start are not evaluated');
    return subscribe<ExperimentChanged>(this.kernel, {
      groupId: 'alerter',
      topics: [TOPICS.experiments],
      handle: async (events) => {
        for (const { value, record } of events) {
          if (value?.status !== 'completed' || record.offset < (backlog[record.partition] ?? 0)) continue;
          await this.serial(() => this.onCompleted(value, { topic: record.topic, partition: record.partition, offset: record.offset }));
        }
      },
    });
  }

  private serial<T>(task: () => Promise<T>): Promise<T> {
    return this.evaluations.run(EVALUATIONS, task);
  }

  // --- history ------------------------------------------------------------------------------

  private onExperiment(e: ExperimentChanged): void {
    if (e.status === 'completed') this.history.complete(this.completedOf(e));
    else if (e.status === 'failed' || e.status === 'cancelled') this.history.abandon(e.experiment_id);
  }

  private completedOf(e: ExperimentChanged, metrics: ExperimentMetrics | null = null): CompletedExperiment {
    const aggregation = this.specOf(e.yaml)?.scoring.replica_aggregation ?? { strategy: 'majority' as const };
    const snapshot = metrics ?? parsedMetrics(e.metrics);
    return {
      tenant: e.tenant,
      experiment_id: e.experiment_id,
      name: e.name,
      spec_id: e.spec_id,
      completed_at: e.completed_at ?? e.ts,
      metrics: snapshot ?? computeMetrics(e.experiment_id, [], new Map(), aggregation),
      aggregation,
    };
  }

  /** The pinned spec version's document (null when it cannot be read: no spec rules then). */
  private specOf(yaml: string | null): SpecDocument | null {
    if (yaml === null) return null;
    return readableSpec(yaml, (err) => this.kernel.logger.warn({ err: err.message }, "an experiment's spec cannot be read: its alerts block is not evaluated"));
  }

  /** Resolves once `view` shows everything on `topic` now. */
  private async catchUp(view: EntityView<unknown>, topic: string): Promise<void> {
    const ends = await this.kernel.log.endOffsets(topic);
    const positions = ends.flatMap((end, partition) => (end > 0 ? [{ topic, partition, offset: end - 1 }] : []));
    await view.waitFor(positions, this.kernel.config.replyTimeout);
  }

  // --- evaluation ---------------------------------------------------------------------------

  /** The rules that apply to a completed experiment: the API's that existed then, and its spec's. */
  private applicable(e: ExperimentChanged, completedAt: number): ApplicableRule[] {
    const { logger, config } = this.kernel;
    const rules: ApplicableRule[] = [];
    const add = (rule: ApplicableRule | string, ruleId: string) => {
      if (typeof rule === 'string') logger.warn({ tenant: e.tenant, rule_id: ruleId, err: rule }, 'an alert rule cannot be evaluated: skipped');
      else rules.push(rule);
    };
    for (const r of this.rulesView.entities.values()) {
      if (r.deleted || r.tenant !== e.tenant || (r.eval_id !== null && r.eval_id !== e.spec_id) || r.created_at > completedAt) continue;
      add(fromApiRule(r, config.alertMaxWindow), r.alert_id);
    }
    for (const a of this.specOf(e.yaml)?.alerts ?? []) add(fromSpecAlert(e.tenant, e.spec_id, a, config.alertMaxWindow), `${e.spec_id}/${a.name}`);
    return rules;
  }

  /** The rules' runs are needed (a window over time, a regression) or the snapshot is missing. */
  private async readyFor(rules: readonly ApplicableRule[], e: ExperimentChanged): Promise<CompletedExperiment> {
    const missing = parsedMetrics(e.metrics) === null;
    const needsRuns = missing || rules.some((r) => r.condition.kind === 'regression' || r.window.kind === 'duration');
    if (needsRuns) await this.catchUp(this.scoresView as EntityView<unknown>, TOPICS.runScores);
    let trigger = this.history.get(e.experiment_id) ?? this.completedOf(e);
    if (missing) {
      const runs = this.history.runsOf(e.experiment_id);
      trigger = this.completedOf(e, runs ? computeMetrics(e.experiment_id, runs.runs, runs.traces, trigger.aggregation) : null);
      this.history.complete(trigger);
    }
    return trigger;
  }

  private async onCompleted(e: ExperimentChanged, position: RecordPosition): Promise<void> {
    const { config, logger } = this.kernel;
    await this.experimentsView.waitFor([position], config.replyTimeout);
    await this.catchUp(this.rulesView as EntityView<unknown>, TOPICS.alerts);
    const rules = this.applicable(e, e.completed_at ?? e.ts);
    if (rules.length === 0) return;
    const trigger = await this.readyFor(rules, e);
    const now = Date.now();
    const firings: AlertFired[] = [];
    for (const rule of rules) {
      const firingId = firingIdOf(e.tenant, rule.id, e.experiment_id, 'completion');
      // Evaluated and fired before a restart: the completion is being handled again.
      if (this.firings.get(firingId)) continue;
      const ev = evaluateRule(rule, trigger, this.history);
      logger.debug({ tenant: e.tenant, rule_id: rule.id, experiment_id: e.experiment_id, fires: ev.fires, reason: ev.reason }, 'alert rule evaluated');
      if (!ev.fires) continue;
      const dup = duplicateOf(this.firings.of(rule.id, e.experiment_id), now, config.alertDedupWindow);
      firings.push(
        newFiring(rule, trigger, ev, { firingId, trigger: 'completion', firedAt: now, duplicateOf: dup, slackWebhookHosts: config.slackWebhookHosts }),
      );
    }
    if (firings.length === 0) return;
    await this.recordFirings(firings);
    logger.info(
      { tenant: e.tenant, experiment_id: e.experiment_id, firings: firings.map((f) => ({ firing_id: f.firing_id, rule_id: f.rule_id, status: f.status })) },
      'alert rules fired',
    );
    if (config.testAlerterHold > 0) {
      logger.warn({ experiment_id: e.experiment_id, hold_ms: config.testAlerterHold }, 'holding after recording firings');
      await sleep(config.testAlerterHold);
    }
    this.deliveries.start(firings.filter((f) => f.status === 'pending'));
  }

  /** Appends firings' states; resolves once the view (and so the dedup index) shows them. */
  private async recordFirings(firings: readonly AlertFired[]): Promise<void> {
    await this.firingsView.append(
      this.kernel,
      firings.map((f) => ({ key: f.firing_id, tenant: f.tenant, value: f })),
    );
  }

  // --- evaluation on request ----------------------------------------------------------------

  private async onEvaluationRequest(request: AlertEvaluationRequested): Promise<void> {
    const { config, logger } = this.kernel;
    // The api answered 504 long ago: nobody awaits this, and a late firing would surprise.
    if (Date.now() - request.ts > config.replyTimeout) {
      logger.warn({ tenant: request.tenant, alert_id: request.alert_id }, 'an alert evaluation request older than the reply timeout: skipped');
      return;
    }
    let answer: EvaluationAnswer | null = null;
    let error: string | null = null;
    try {
      answer = await this.evaluateOnRequest(request);
    } catch (err) {
      error = err instanceof AppError ? `${err.code}: ${err.message}` : `internal: ${(err as Error).message}`;
      if (!(err instanceof AppError)) logger.error({ err, alert_id: request.alert_id }, 'an alert evaluation failed');
    }
    await reply(this.kernel, EXCHANGE, request.tenant, {
      tenant: request.tenant,
      event_id: newEventId(),
      ts: Date.now(),
      correlation_id: request.correlation_id,
      answer: answer && JSON.stringify(answer),
      error,
    });
  }

  private async evaluateOnRequest(request: AlertEvaluationRequested): Promise<EvaluationAnswer> {
    const { config } = this.kernel;
    await this.catchUp(this.rulesView as EntityView<unknown>, TOPICS.alerts);
    const stored = this.rulesView.entities.get(request.alert_id);
    if (!stored || stored.deleted || stored.tenant !== request.tenant) throw new AppError('not_found', `alert ${request.alert_id} not found`);
    const rule = fromApiRule(stored, config.alertMaxWindow);
    if (typeof rule === 'string') throw new AppError('bad_request', `alert ${request.alert_id} cannot be evaluated: ${rule}`);
    await this.catchUp(this.experimentsView as EntityView<unknown>, TOPICS.experiments);
    const known = this.history.get(request.experiment_id);
    if (!known || known.tenant !== request.tenant) throw new AppError('conflict', `experiment_id: experiment ${request.experiment_id} is not completed`);
    if (rule.condition.kind === 'regression' || rule.window.kind === 'duration') await this.catchUp(this.scoresView as EntityView<unknown>, TOPICS.runScores);
    const ev = evaluateRule(rule, known, this.history);
    const answer: EvaluationAnswer = {
      rule_id: rule.id,
      experiment_id: known.experiment_id,
      dry_run: request.dry_run,
      fired: ev.fires,
      metric_value: ev.metric_value,
      threshold: ev.threshold,
      reason: ev.reason,
      details: ev.details,
      firing_id: null,
      status: null,
      duplicate_of: null,
    };
    if (request.dry_run || !ev.fires) return answer;
    const firingId = firingIdOf(request.tenant, rule.id, known.experiment_id, `request\n${request.seed}`);
    const made = this.firings.get(firingId);
    if (made) return { ...answer, firing_id: firingId, status: made.status === 'deduplicated' ? 'deduplicated' : 'pending', duplicate_of: made.duplicate_of };
    const now = Date.now();
    const dup = duplicateOf(this.firings.of(rule.id, known.experiment_id), now, config.alertDedupWindow);
    const firing = newFiring(rule, known, ev, { firingId, trigger: 'request', firedAt: now, duplicateOf: dup, slackWebhookHosts: config.slackWebhookHosts });
    await this.recordFirings([firing]);
    if (firing.status === 'pending') this.deliveries.start([firing]);
    return { ...answer, firing_id: firingId, status: firing.status === 'deduplicated' ? 'deduplicated' : 'pending', duplicate_of: dup };
  }
}

/** The metrics snapshot of a completion, or null when it has none (or one that cannot be read). */
function parsedMetrics(json: string | null): ExperimentMetrics | null {
  if (json === null) return null;
  try {
    return JSON.parse(json) as ExperimentMetrics;
  } catch {
    return null;
  }
}
