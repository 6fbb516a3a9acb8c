/**
 * Alert rules, pure (services/domain/alerts.ts, alert-history.ts): the condition grammar and its
 * problems, the windows' grammar and limits, the evaluation of each window and of a regression on
 * a history of completed experiments, pooled metrics, the dedup rule, and what the history keeps.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { AlertHistory } from '../../services/domain/alert-history.ts';
import {
  duplicateOf,
  evaluateRule,
  formatValue,
  parseAlertCondition,
  parseAlertWindow,
  pooledMetrics,
  type CompletedExperiment,
  type EvaluableRule,
} from '../../services/domain/alerts.ts';
import { computeMetrics, NO_TRACES, type RunFact } from '../../services/domain/experiment-metrics.ts';

const DAY = 86_400_000;

describe('condition grammar', () => {
  test('a threshold: each metric, each operator, integers, decimals and negatives, spaces optional', () => {
    assert.deepEqual(parseAlertCondition('pass_rate < 0.8'), {
      condition: { kind: 'threshold', text: 'pass_rate < 0.8', metric: 'pass_rate', operator: '<', value: 0.8 },
    });
    assert.deepEqual(parseAlertCondition('  mean_wall_ms>=1500 '), {
      condition: { kind: 'threshold', text: 'mean_wall_ms>=1500', metric: 'mean_wall_ms', operator: '>=', value: 1500 },
    });
    for (const metric of [
      'pass_rate',
      'mean_wall_ms',
      'p95_wall_ms',
      'total_cost_usd',
      'mean_cost_per_run_usd',
      'tool_success_rate',
      'side_effect_violations',
      'mean_tool_calls',
    ]) {
      for (const op of ['<', '<=', '>', '>=', '==', '!=']) {
        const parsed = parseAlertCondition(`${metric} ${op} -2.5`);
        assert.ok('condition' in parsed, `${metric} ${op}: ${JSON.stringify(parsed)}`);
        assert.deepEqual(
          [
            parsed.condition.metric,
            parsed.condition.kind === 'threshold' && parsed.condition.operator,
            parsed.condition.kind === 'threshold' && parsed.condition.value,
          ],
          [metric, op, -2.5],
        );
      }
    }
  });

  test('a regression: only the metrics compare tests', () => {
    assert.deepEqual(parseAlertCondition('pass_rate regressed'), { condition: { kind: 'regression', text: 'pass_rate regressed', metric: 'pass_rate' } });
    for (const metric of ['mean_wall_ms', 'mean_cost_per_run_usd', 'side_effect_violations', 'mean_tool_calls'])
      assert.ok('condition' in parseAlertCondition(`${metric} regressed`));
    for (const metric of ['p95_wall_ms', 'total_cost_usd', 'tool_success_rate']) {
      const parsed = parseAlertCondition(`${metric} regressed`);
      assert.ok('problems' in parsed);
      assert.match(parsed.problems[0]!, new RegExp(`compare has no significance test for ${metric}`));
    }
    assert.deepEqual(parseAlertCondition('pass_rate regressed badly'), {
      problems: ['nothing may follow "regressed", e.g. "pass_rate < 0.8" or "pass_rate regressed"'],
    });
  });

  test('every problem is named: unknown metric, bad operator, a value that is not a number, no grammar at all', () => {
    const problems = (text: string) => {
      const parsed = parseAlertCondition(text);
      assert.ok('problems' in parsed, `${text} parsed`);
      return parsed.problems;
    };
    assert.deepEqual(problems('happiness > 3'), [
      'unknown metric "happiness"; one of pass_rate, mean_wall_ms, p95_wall_ms, total_cost_usd, mean_cost_per_run_usd, tool_success_rate, side_effect_violations, mean_tool_calls',
    ]);
    assert.equal(problems('happiness ~ 3').length, 2, 'the metric and the operator');
    assert.match(problems('pass_rate = 0.5')[0]!, /^"=" is not an operator; one of <, <=, >, >=, ==, !=, or "regressed"$/);
    assert.match(problems('pass_rate is 0.5')[0]!, /^"is" is not an operator/);
    assert.match(problems('pass_rate < 0.5.1')[0]!, /^the value "0\.5\.1" is not a number/);
    assert.match(problems('pass_rate <')[0]!, /^the value "" is not a number/);
    assert.match(problems('pass_rate')[0]!, /^must be "<metric> <operator> <number>" or "<metric> regressed"/);
    assert.match(problems('')[0]!, /^must be/);
  });
});

describe('window grammar', () => {
  test('none, last_<n>_runs and last_<n><unit>', () => {
    assert.deepEqual(parseAlertWindow(null, DAY), { kind: 'experiment' });
    assert.deepEqual(parseAlertWindow('last_5_runs', DAY), { kind: 'runs', n: 5 });
    assert.deepEqual(parseAlertWindow('last_24h', DAY), { kind: 'duration', ms: DAY });
    assert.deepEqual(parseAlertWindow('last_90s', DAY), { kind: 'duration', ms: 90_000 });
    assert.deepEqual(parseAlertWindow('last_1w', 7 * DAY), { kind: 'duration', ms: 7 * DAY });
  });

  test('bad forms and limits are named', () => {
    for (const bad of ['last_week', 'last_0_runs', 'last_5_run', 'last_-1h', 'last_5', '24h', 'last_1.5h', 'last_5_runs ']) {
      assert.throws(() => parseAlertWindow(bad, DAY), /must be last_<n>_runs or last_<n><s\|m\|h\|d\|w>/, bad);
    }
    assert.throws(() => parseAlertWindow('last_1001_runs', DAY), /at most 1000 experiments/);
    assert.throws(() => parseAlertWindow('last_25h', DAY), /spans more than the 1d the alerter keeps runs for \(SVC_ALERT_MAX_WINDOW\)/);
  });
});

/** A history of completed experiments of spec `s` (and `other`), one minute apart, with their runs. */
function historyOf(outcomes: Array<{ spec?: string; verdicts: string; at?: number; wall?: number }>, start = Date.now() - 60 * 60_000) {
  const history = new AlertHistory();
  const experiments: CompletedExperiment[] = [];
  outcomes.forEach((o, i) => {
    const id = `exp-${i}`;
    const runs: RunFact[] = [...o.verdicts].map((v, r) => ({
      run_id: `run-${i}-${r}`,
      scenario_index: 0,
      params: '{}',
      verdict: v === 'P' ? 'pass' : v === 'F' ? 'fail' : 'error',
      wall_ms: o.wall ?? 100 + r,
      violations: 0,
    }));
    const metrics = computeMetrics(id, runs, new Map(), { strategy: 'majority' });
    const e: CompletedExperiment = {
      tenant: 't',
      experiment_id: id,
      name: `run ${i}`,
      spec_id: o.spec ?? 's',
      completed_at: o.at ?? start + i * 60_000,
      metrics,
      aggregation: { strategy: 'majority' },
    };
    history.complete(e);
    for (const r of runs) history.score(id, r, { ...NO_TRACES }, 1);
    experiments.push(e);
  });
  return { history, experiments };
}

const threshold = (text: string, window: string | null = null, evalId: string | null = 's'): EvaluableRule => {
  const parsed = parseAlertCondition(text);
  if (!('condition' in parsed)) throw new Error(parsed.problems.join());
  return {
    id: 'alert_x',
    name: 'x',
    source: 'api',
    eval_id: evalId,
    condition: parsed.condition,
    window: parseAlertWindow(window, 30 * DAY),
    windowText: window,
  };
};

describe('evaluation', () => {
  test('no window: the experiment alone', () => {
    const { history, experiments } = historyOf([{ verdicts: 'FF' }, { verdicts: 'PP' }]);
    const fires = evaluateRule(threshold('pass_rate < 1'), experiments[0]!, history);
    assert.deepEqual([fires.fires, fires.metric_value, fires.threshold, fires.reason], [true, 0, 1, 'pass_rate 0 < 1 in experiment "run 0" (exp-0)']);
    const quiet = evaluateRule(threshold('pass_rate < 1'), experiments[1]!, history);
    assert.deepEqual([quiet.fires, quiet.reason], [false, 'pass_rate 1 is not < 1 in experiment "run 1" (exp-1)']);
    // A metric without a value never crosses.
    const none = evaluateRule(threshold('tool_success_rate < 0.9'), experiments[0]!, history);
    assert.deepEqual([none.fires, none.metric_value], [false, null]);
  });

  test('last_3_runs: each of the last 3 completed experiments of the scope crossed; fewer than 3 never fires', () => {
    const { history, experiments } = historyOf([
      { verdicts: 'F' },
      { verdicts: 'F' },
      { spec: 'other', verdicts: 'P' },
      { verdicts: 'F' },
      { verdicts: 'P' },
      { verdicts: 'F' },
    ]);
    const rule = threshold('pass_rate < 0.5', 'last_3_runs');
    const at = (i: number) => evaluateRule(rule, experiments[i]!, history);
    assert.deepEqual([at(0).fires, at(1).fires], [false, false]);
    assert.match(at(1).reason, /^only 2 completed experiments of spec s so far; last_3_runs needs 3$/);
    // The other spec's experiment is outside the rule's scope.
    assert.equal(at(3).fires, true);
    assert.deepEqual(
      at(3).details.experiments!.map((e) => e.experiment_id),
      ['exp-0', 'exp-1', 'exp-3'],
    );
    assert.equal(at(5).fires, false, 'F, P, F');
    // A global rule's scope is every spec of the tenant: exp-2 (other, passing) breaks the streak.
    assert.equal(evaluateRule(threshold('pass_rate < 0.5', 'last_3_runs', null), experiments[3]!, history).fires, false);
    // As of a past completion: later experiments do not count.
    assert.deepEqual(
      at(1).details.experiments!.map((e) => e.experiment_id),
      ['exp-0', 'exp-1'],
    );
  });

  test('last_<duration>: the metric pooled over every run of the experiments completed within it', () => {
    const now = Date.now();
    const { history, experiments } = historyOf([
      { verdicts: 'FFFF', at: now - 3 * 3_600_000, wall: 900 },
      { verdicts: 'PP', at: now - 30 * 60_000, wall: 100 },
      { verdicts: 'FF', at: now - 10 * 60_000, wall: 300 },
    ]);
    const hour = evaluateRule(threshold('pass_rate < 0.6', 'last_1h'), experiments[2]!, history);
    assert.deepEqual([hour.fires, hour.metric_value, hour.details.runs], [true, 0.5, 4]);
    assert.match(hour.reason, /^pass_rate 0\.5 < 0\.6 over the 4 runs of 2 experiments completed in the 1h up to /);
    const wall = evaluateRule(threshold('mean_wall_ms > 250', 'last_1h'), experiments[2]!, history);
    assert.deepEqual([wall.fires, wall.metric_value], [false, 200]);
    const day = evaluateRule(threshold('pass_rate < 0.6', 'last_1d'), experiments[2]!, history);
    assert.deepEqual([day.metric_value, day.details.runs], [1 / 3, 8]);
  });

  test('a regression: against the previous completed experiment of the spec, significant only', () => {
    const { history, experiments } = historyOf([
      { verdicts: 'PPPPP' },
      { spec: 'other', verdicts: 'FFFFF' },
      { verdicts: 'FFFFF' },
      { verdicts: 'FFFFP' },
      { verdicts: 'P' },
      { verdicts: 'F' },
    ]);
    const rule = threshold('pass_rate regressed');
    const first = evaluateRule(rule, experiments[0]!, history);
    assert.deepEqual([first.fires, first.reason], [false, 'no earlier completed experiment of spec s to compare with']);
    // exp-2 against exp-0 (exp-1 is another spec's): 5 of 5 to 0 of 5.
    const drop = evaluateRule(rule, experiments[2]!, history);
    assert.equal(drop.fires, true, drop.reason);
    assert.deepEqual([drop.metric_value, drop.threshold, drop.details.baseline_id, drop.details.comparison!.significance], [0, 1, 'exp-0', 'significant']);
    assert.match(drop.reason, /^pass_rate regressed significantly against experiment "run 0" \(exp-0\): 1 → 0 \(p = 0\.01\d+ < 0\.05\)$/);
    // Better is no regression.
    const better = evaluateRule(rule, experiments[3]!, history);
    assert.equal(better.fires, false);
    assert.match(better.reason, /did not regress significantly/);
    // One run against one: underpowered, so untested, so no page.
    const small = evaluateRule(rule, experiments[5]!, history);
    assert.equal(small.fires, false);
    assert.match(small.reason, /^pass_rate is worse against experiment "run 4" \(exp-4\) \(1 → 0\) but the comparison is underpowered \(untested\)/);
  });
});

test("pooled metrics keep each experiment's scenarios and replica aggregation apart", () => {
  const run = (id: string, index: number, verdict: RunFact['verdict']): RunFact => ({
    run_id: id,
    scenario_index: index,
    params: '{}',
    verdict,
    wall_ms: 10,
    violations: verdict === 'fail' ? 1 : 0,
  });
  const pooled = pooledMetrics([
    // Two scenarios, majority: index 0 passes (2 of 3), index 1 fails.
    {
      runs: [run('a1', 0, 'pass'), run('a2', 0, 'pass'), run('a3', 0, 'fail'), run('a4', 1, 'fail')],
      traces: new Map(),
      aggregation: { strategy: 'majority' },
    },
    // The same index 0 in another experiment, all_must_pass: 2 of 3 does not pass.
    {
      runs: [run('b1', 0, 'pass'), run('b2', 0, 'pass'), run('b3', 0, 'fail')],
      traces: new Map([['b1', { ...NO_TRACES, cost_usd: 0.5, tool_calls: 2 }]]),
      aggregation: { strategy: 'all_must_pass' },
    },
  ]);
  assert.equal(pooled.pass_rate, 1 / 3);
  assert.deepEqual(pooled.counts, { pass: 0, fail: 1, flaky: 2, error: 0 });
  assert.equal(pooled.runs, 7);
  assert.equal(pooled.side_effect_violations, 3);
  assert.equal(pooled.total_cost_usd, 0.5);
  assert.equal(pooled.mean_tool_calls, 2 / 7);
  assert.equal(pooledMetrics([]).pass_rate, null);
});

test('dedup: a firing of the same rule for the same experiment within the window, that notified', () => {
  const now = 1_000_000_000;
  const five = 5 * 60_000;
  assert.equal(duplicateOf([], now, five), null);
  assert.equal(duplicateOf([{ firing_id: 'f1', fired_at: now - 60_000, status: 'delivered' }], now, five), 'f1');
  assert.equal(duplicateOf([{ firing_id: 'f1', fired_at: now - five, status: 'delivered' }], now, five), null, 'the window has passed');
  assert.equal(duplicateOf([{ firing_id: 'f1', fired_at: now - 1000, status: 'failed' }], now, five), 'f1', 'a failed notification was tried');
  assert.equal(duplicateOf([{ firing_id: 'f1', fired_at: now - 1000, status: 'deduplicated' }], now, five), null, 'a duplicate is no reference');
  assert.equal(
    duplicateOf(
      [
        { firing_id: 'old', fired_at: now - 240_000, status: 'delivered' },
        { firing_id: 'new', fired_at: now - 10_000, status: 'pending' },
      ],
      now,
      five,
    ),
    'new',
  );
});

test('the history holds the runs of recent experiments and of the last two of each spec; late scores of dropped ones are ignored', () => {
  const now = Date.now();
  const { history } = historyOf([
    { verdicts: 'P', at: now - 40 * DAY },
    { verdicts: 'P', at: now - 39 * DAY },
    { verdicts: 'P', at: now - 38 * DAY },
    { verdicts: 'P', at: now - DAY },
    { spec: 'quiet', verdicts: 'PP', at: now - 50 * DAY },
  ]);
  history.prune(now - 30 * DAY);
  assert.equal(history.runsOf('exp-0'), null, 'old, and not among the last two of spec s');
  assert.equal(history.runsOf('exp-1'), null);
  assert.equal(history.runsOf('exp-2')!.runs.length, 1, 'the last two of spec s: exp-2 and exp-3');
  assert.equal(history.runsOf('exp-3')!.runs.length, 1);
  assert.equal(history.runsOf('exp-4')!.runs.length, 2, 'the last of spec quiet, however old');
  history.score('exp-0', { run_id: 'late', scenario_index: 0, params: '{}', verdict: 'fail', wall_ms: 1, violations: 0 }, NO_TRACES, 2);
  assert.equal(history.runsOf('exp-0'), null);
  // A later score of a held run replaces it; an earlier one does not.
  history.score('exp-3', { run_id: 'run-3-0', scenario_index: 0, params: '{}', verdict: 'fail', wall_ms: 1, violations: 0 }, NO_TRACES, 5);
  history.score('exp-3', { run_id: 'run-3-0', scenario_index: 0, params: '{}', verdict: 'pass', wall_ms: 1, violations: 0 }, NO_TRACES, 3);
  assert.equal(history.runsOf('exp-3')!.runs[0]!.verdict, 'fail');
  // Abandoned (failed, cancelled) experiments keep nothing.
  history.score('exp-x', { run_id: 'x', scenario_index: 0, params: '{}', verdict: 'pass', wall_ms: 1, violations: 0 }, NO_TRACES, 1);
  history.abandon('exp-x');
  assert.equal(history.runsOf('exp-x'), null);
});

test('values in reasons: integers as they are, others to 4 significant digits', () => {
  assert.deepEqual([formatValue(3), formatValue(0.123456), formatValue(1234.5678), formatValue(null)], ['3', '0.1235', '1235', 'none']);
});
