/**
 * The params of the scenarios of an experiment over a dataset (experiment_scenarios: each one's
 * matrix entry with its record), for RunResults, the scenario list and the export, which show
 * every scenario, run or not. An experiment of a matrix alone has none: its scenarios' params are
 * its matrix entries.
 */
import type { Params } from '../../domain/params.ts';
import type { Store } from '../../kernel/store/store.ts';

const PAGE = 500;

/** Scenario index -> params, of the given indices (every scenario when null). */
export async function scenarioParams(store: Store, tenant: string, experimentId: string, indices: number[] | null): Promise<Map<number, Params>> {
  const rows = await store.query<{ ScenarioIndex: number; Params: string }>(
    `SELECT ScenarioIndex, Params FROM experiment_scenarios FINAL
     WHERE TenantId = {tenant:String} AND ExperimentId = {experiment:String}${indices ? ' AND ScenarioIndex IN {indices:Array(UInt32)}' : ''}
     ORDER BY ScenarioIndex`,
    { tenant, experiment: experimentId, ...(indices && { indices }) },
  );
  return new Map(rows.map((r) => [Number(r.ScenarioIndex), JSON.parse(r.Params) as Params]));
}

/**
 * The params of scenarios read in index order (the export), a page at a time: `upTo(i)` makes
 * every index up to `i` readable and forgets those before `from`, so memory stays bounded.
 */
export class ScenarioParamsWindow {
  readonly params = new Map<number, Params>();
  private loaded = -1;

  constructor(
    private readonly store: Store,
    private readonly tenant: string,
    private readonly experimentId: string,
    private readonly count: number,
  ) {}

  async upTo(index: number, from: number): Promise<void> {
    for (const i of this.params.keys()) if (i < from) this.params.delete(i);
    const last = Math.min(index, this.count - 1);
    while (this.loaded < last) {
      const first = this.loaded + 1;
      const end = Math.min(last, first + PAGE - 1);
      const rows = await this.store.query<{ ScenarioIndex: number; Params: string }>(
        `SELECT ScenarioIndex, Params FROM experiment_scenarios FINAL
         WHERE TenantId = {tenant:String} AND ExperimentId = {experiment:String} AND ScenarioIndex BETWEEN {first:UInt32} AND {end:UInt32}`,
        { tenant: this.tenant, experiment: this.experimentId, first, end },
      );
      for (const r of rows) this.params.set(Number(r.ScenarioIndex), JSON.parse(r.Params) as Params);
      this.loaded = end;
    }
  }
}
