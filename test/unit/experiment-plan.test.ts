/**
 * The experiment plan (services/domain/experiment-plan.ts): the request's overrides over the spec
 * (matrix, replicas, seed, dataset), what is known when the spec is gone, and the runs a plan
 * expands to, replica-major with stable seeds.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { experimentPlan, planRuns, type PlanSpec } from '../../services/domain/experiment-plan.ts';
import type { ExperimentDataset } from '../../services/domain/events/experiment-events.ts';
import { SPEC_DEFAULTS } from '../../services/domain/spec.ts';

const spec = (replicas: number, matrix: Array<Record<string, string>>, seed: number | null = null): PlanSpec => ({
  parallelism: { replicas, matrix },
  determinism: { frozenTime: null, seed, dns: {} },
});
const dataset: ExperimentDataset = { id: 'ds_1', name: 'tickets', version: 2, records: 5 };

test("the spec's matrix, replicas and seed when the request overrides nothing", () => {
  assert.deepEqual(experimentPlan({}, spec(3, [{ m: 'a' }, { m: 'b' }], 7)), {
    matrix: [{ m: 'a' }, { m: 'b' }],
    dataset: null,
    scenarios: 2,
    replicas: 3,
    totalRuns: 6,
    seed: 7,
  });
  assert.equal(experimentPlan({}, spec(1, [{}])).seed, null);
});

test("the request's matrix, replicas and seed replace the spec's", () => {
  const plan = experimentPlan({ matrix: [{ m: 'x' }], replicas: 4, seed: 9 }, spec(3, [{ m: 'a' }, { m: 'b' }], 7));
  assert.deepEqual(plan, { matrix: [{ m: 'x' }], dataset: null, scenarios: 1, replicas: 4, totalRuns: 4, seed: 9 });
});

test('over a dataset, every matrix entry runs with every record', () => {
  const plan = experimentPlan({ dataset }, spec(2, [{ m: 'a' }, { m: 'b' }]));
  assert.deepEqual([plan.dataset, plan.scenarios, plan.totalRuns], [dataset, 10, 20]);
});

test("a spec that is gone: the request's overrides, the default replicas, no matrix unless the request gave one", () => {
  assert.deepEqual(experimentPlan({}, null), { matrix: null, dataset: null, scenarios: null, replicas: SPEC_DEFAULTS.replicas, totalRuns: null, seed: null });
  assert.deepEqual(experimentPlan({ replicas: 2, dataset, seed: 3 }, null), { matrix: null, dataset, scenarios: null, replicas: 2, totalRuns: null, seed: 3 });
  assert.deepEqual(experimentPlan({ matrix: [{}, {}] }, null), {
    matrix: [{}, {}],
    dataset: null,
    scenarios: 2,
    replicas: SPEC_DEFAULTS.replicas,
    totalRuns: 2,
    seed: null,
  });
});

test("the runs: replica-major, each scenario's ids, the plan's seed", () => {
  const runs = planRuns('exp-ab12', { replicas: 2, seed: 5 }, [{ m: 'a' }, { m: 'b' }]);
  assert.deepEqual(
    runs.map((r) => [r.runId, r.scenarioId, r.index, r.replica, r.params, r.seed]),
    [
      ['run-ab12-1-1', 'scn-ab12-1', 0, 1, { m: 'a' }, 5],
      ['run-ab12-2-1', 'scn-ab12-2', 1, 1, { m: 'b' }, 5],
      ['run-ab12-1-2', 'scn-ab12-1', 0, 2, { m: 'a' }, 5],
      ['run-ab12-2-2', 'scn-ab12-2', 1, 2, { m: 'b' }, 5],
    ],
  );
});

test('without a seed, each run derives its own from its id: stable, distinct, a 31-bit integer', () => {
  const once = planRuns('exp-ab12', { replicas: 2, seed: null }, [{}, {}]);
  const again = planRuns('exp-ab12', { replicas: 2, seed: null }, [{}, {}]);
  assert.deepEqual(
    once.map((r) => r.seed),
    again.map((r) => r.seed),
  );
  assert.equal(new Set(once.map((r) => r.seed)).size, 4);
  for (const { seed } of once) assert.ok(Number.isInteger(seed) && seed >= 0 && seed < 2 ** 31, String(seed));
  assert.deepEqual(planRuns('exp-ab12', { replicas: 0, seed: null }, [{}]), []);
});
