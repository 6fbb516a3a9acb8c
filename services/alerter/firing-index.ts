/**
 * The alerter's view of svc.alert-firings, folded from the whole topic at every start: which
 * firings exist (an evaluation done again finds its firing and does not fire twice), the firings
 * of each rule and experiment (the dedup window), and those not delivered yet (resumed at start).
 */
import type { AlertFired, FiringStatus } from '../domain/events/alert-events.ts';

export interface FiringSummary {
  firing_id: string;
  fired_at: number;
  status: FiringStatus;
  duplicate_of: string | null;
}

const UNFINISHED: readonly FiringStatus[] = ['pending', 'delivering'];

export class FiringIndex {
  private readonly summaries = new Map<string, FiringSummary>();
  private readonly byRuleExperiment = new Map<string, Set<string>>();
  private readonly open = new Map<string, AlertFired>();

  /** Folds the latest state of a firing. */
  apply(f: AlertFired): void {
    this.summaries.set(f.firing_id, { firing_id: f.firing_id, fired_at: f.fired_at, status: f.status, duplicate_of: f.duplicate_of });
    const key = `${f.rule_id}\n${f.experiment_id}`;
    let ids = this.byRuleExperiment.get(key);
    if (!ids) this.byRuleExperiment.set(key, (ids = new Set()));
    ids.add(f.firing_id);
    if (UNFINISHED.includes(f.status)) this.open.set(f.firing_id, f);
    else this.open.delete(f.firing_id);
  }

  get(firingId: string): FiringSummary | undefined {
    return this.summaries.get(firingId);
  }

  /** The firings of one rule for one experiment. */
  of(ruleId: string, experimentId: string): FiringSummary[] {
    return [...(this.byRuleExperiment.get(`${ruleId}\n${experimentId}`) ?? [])].map((id) => this.summaries.get(id)!);
  }

  /** Firings recorded and not delivered yet (pending, or interrupted while delivering). */
  unfinished(): AlertFired[] {
    return [...this.open.values()];
  }
}
