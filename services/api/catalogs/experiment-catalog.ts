/**
 * What the api knows of experiments, from the log: an EntityView of the compacted svc.experiments
 * topic by experiment id (live state and ownership), and where each one's latest event sits, so a
 * write can await the sink before answering (the list and history read ClickHouse). The api
 * writes only `created`; the aggregator every later state, which `waitForStatus` observes.
 */
import type { Delivered, Kernel } from '../../kernel/actor.ts';
import type { Principal } from '../../kernel/auth.ts';
import { EntityCatalog } from '../../kernel/entity-view.ts';
import { AppError } from '../../kernel/errors.ts';
import type { RecordPosition } from '../../kernel/log/event-log.ts';
import type { ExperimentChanged, ExperimentOptions, ExperimentStatus } from '../../domain/events/experiment-events.ts';
import { experimentPlan, type ExperimentPlan, type PlanWithoutMatrix } from '../../domain/experiment-plan.ts';
import { SPEC_DEFAULTS, type SpecDocument } from '../../domain/spec.ts';
import { parsedSpec } from '../../domain/spec-cache.ts';
import { TOPICS } from '../../kernel/topics.ts';
import type { SpecCatalog } from './spec-catalog.ts';

export const TERMINAL_STATUSES: readonly ExperimentStatus[] = ['completed', 'failed', 'cancelled'];

/**
 * What an experiment runs, as its readers need it: the plan (its matrix and scenarios null when
 * neither the experiment nor the catalog still has its spec), the request's options, the scoring
 * and the pinned yaml.
 */
export type PinnedPlan = (ExperimentPlan | PlanWithoutMatrix) & {
  options: ExperimentOptions;
  scoring: SpecDocument['scoring'];
  yaml: string | null;
};

const DEFAULT_SCORING: SpecDocument['scoring'] = { pass_threshold: SPEC_DEFAULTS.passThreshold, replica_aggregation: { strategy: 'majority' } };

export class ExperimentCatalog extends EntityCatalog<ExperimentChanged> {
  /** Where each experiment's latest event sits, for awaiting the experiments table. */
  private readonly positions = new Map<string, RecordPosition>();

  constructor(
    kernel: Kernel,
    private readonly specs: SpecCatalog,
  ) {
    super(kernel, TOPICS.experiments);
  }

  protected override fold(entities: Map<string, ExperimentChanged>, { record, value }: Delivered<ExperimentChanged>): void {
    if (record.key === null) return;
    if (value === null) {
      entities.delete(record.key);
      this.positions.delete(record.key);
      return;
    }
    entities.set(record.key, value);
    this.positions.set(record.key, { topic: record.topic, partition: record.partition, offset: record.offset });
  }

  get(id: string): ExperimentChanged | undefined {
    return this.view.entities.get(id);
  }

  /** An experiment of the caller's tenant: 404 when unknown, 403 when another tenant's (exp- ids are global, docs/decisions.md, "Names and ids"). */
  owned(principal: Principal, id: string): ExperimentChanged {
    return this.ownedBy(principal.tenant, id, 'experiment');
  }

  /** Appends an experiment's state; on return this view and the experiments table both show it. */
  async put(experiment: ExperimentChanged): Promise<void> {
    const positions = await this.append([{ key: experiment.experiment_id, tenant: experiment.tenant, value: experiment }]);
    await this.kernel.visibility.waitFor(positions, this.kernel.config.replyTimeout);
  }

  /**
   * Resolves with the experiment once the view shows it in one of `statuses` (a state the
   * aggregator writes), then once the experiments table holds that state too; null after the
   * reply timeout.
   */
  async waitForStatus(id: string, statuses: readonly ExperimentStatus[]): Promise<ExperimentChanged | null> {
    const reached = await this.waitUntil(id, (e) => statuses.includes(e.status));
    const position = this.positions.get(id);
    if (reached && position) await this.kernel.visibility.waitFor([position], this.kernel.config.replyTimeout);
    return reached;
  }

  /** The pinned spec: the experiment's own once queued, else the catalog's version (null when deleted since). */
  pinned(experiment: ExperimentChanged): { doc: SpecDocument; yaml: string } | null {
    if (experiment.yaml !== null) return { doc: parsedSpec(experiment.yaml), yaml: experiment.yaml };
    try {
      const spec = this.specs.get(experiment.tenant, experiment.spec_id, experiment.spec_version);
      return { doc: spec.doc, yaml: spec.stored.yaml };
    } catch (err) {
      if (err instanceof AppError && err.code === 'not_found') return null;
      throw err;
    }
  }

  /** The request's overrides over the pinned spec. */
  plan(experiment: ExperimentChanged): PinnedPlan {
    const options = JSON.parse(experiment.options) as ExperimentOptions;
    const pinned = this.pinned(experiment);
    return {
      ...experimentPlan(options, pinned?.doc ?? null),
      options,
      scoring: pinned?.doc.scoring ?? DEFAULT_SCORING,
      yaml: pinned?.yaml ?? null,
    };
  }
}
