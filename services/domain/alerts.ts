/**
 * Alert rules (docs/alerts.md), pure: the condition grammar, windows, the evaluation of a rule
 * on a completed experiment with its history, and the dedup rule. The alerter holds the history
 * (alert-history.ts) and delivers; the api validates rules with the same grammar.
 *
 *   condition  <metric> <operator> <number>   e.g. `pass_rate < 0.8`
 *              <metric> regressed             a significant regression against the previous
 *                                             completed experiment of the same spec (compare.ts)
 *   window     (none)                         the experiment that completed
 *              last_<n>_runs                  each of the last n completed experiments in scope
 *              last_<n><s|m|h|d|w>            the metric over every run of the experiments
 *                                             completed within that time
 */
import { formatDuration, parseDuration } from '../kernel/duration.ts';
import { compareExperiments, TESTED_METRICS, type MetricComparison } from './compare.ts';
import { computeMetrics, type ExperimentMetrics, type RunFact, type RunTraceStats } from './experiment-metrics.ts';
import { holds } from './score-rules.ts';
import type { AlertMetric, ComparisonOperator } from './spec.ts';
import type { ReplicaAggregation } from './stats.ts';

/** The metrics a condition may name, with what each measures (docs/experiments.md defines them). */
export const ALERT_METRICS: Record<AlertMetric, string> = {
  pass_rate: 'scenarios counting as passing over scenarios with a completed run (0 to 1)',
  mean_wall_ms: 'mean wall time of completed runs, ms',
  p95_wall_ms: '95th percentile wall time of completed runs, ms',
  total_cost_usd: 'model cost of every run, USD',
  mean_cost_per_run_usd: 'mean model cost of completed runs, USD',
  tool_success_rate: 'tool calls with status ok over all tool calls (0 to 1)',
  side_effect_violations: 'forbidden-rule violations',
  mean_tool_calls: 'tool calls per completed run',
};
export const ALERT_OPERATORS: readonly ComparisonOperator[] = ['<', '<=', '>', '>=', '==', '!='];

export type AlertCondition =
  | { kind: 'threshold'; text: string; metric: AlertMetric; operator: ComparisonOperator; value: number }
  | { kind: 'regression'; text: string; metric: AlertMetric };

const isMetric = (name: string): name is AlertMetric => Object.hasOwn(ALERT_METRICS, name);

/**
 * Parses a condition; on failure, every problem found (unknown metric, bad operator, bad value),
 * each a sentence, so one 400 names them all.
 */
export function parseAlertCondition(text: string): { condition: AlertCondition } | { problems: string[] } {
  const example = 'e.g. "pass_rate < 0.8" or "pass_rate regressed"';
  const m = /^\s*(\S+?)\s*(<=|>=|==|!=|<|>|=|\s(?=\S))\s*(.*?)\s*$/.exec(text);
  if (!m || text.trim() === '')
    return { problems: [`must be "<metric> <operator> <number>" or "<metric> regressed", ${example}; got ${JSON.stringify(text)}`] };
  const [, metric, operator, rest] = m as unknown as [string, string, string, string];
  const problems: string[] = [];
  if (!isMetric(metric)) problems.push(`unknown metric "${metric}"; one of ${Object.keys(ALERT_METRICS).join(', ')}`);
  if (operator.trim() === '' && rest.startsWith('regressed') && rest !== 'regressed') {
    return { problems: [...problems, `nothing may follow "regressed", ${example}`] };
  }
  if (operator.trim() === '' && rest === 'regressed') {
    if (isMetric(metric) && !TESTED_METRICS.includes(metric)) {
      problems.push(
        `"${metric} regressed": compare has no significance test for ${metric}; one of ${TESTED_METRICS.join(', ')} may regress, or use a threshold`,
      );
    }
    return problems.length > 0 ? { problems } : { condition: { kind: 'regression', text: text.trim(), metric: metric as AlertMetric } };
  }
  if (!(ALERT_OPERATORS as readonly string[]).includes(operator)) {
    problems.push(`"${operator.trim() || rest.split(/\s/)[0]}" is not an operator; one of ${ALERT_OPERATORS.join(', ')}, or "regressed"`);
  } else if (!/^-?\d+(\.\d+)?$/.test(rest)) {
    problems.push(`the value ${JSON.stringify(rest)} is not a number (e.g. 0.8, 1500, -1)`);
  }
  if (problems.length > 0) return { problems };
  return { condition: { kind: 'threshold', text: text.trim(), metric: metric as AlertMetric, operator: operator as ComparisonOperator, value: Number(rest) } };
}

export type AlertWindow = { kind: 'experiment' } | { kind: 'runs'; n: number } | { kind: 'duration'; ms: number };

/** The longest `last_<n>_runs`. */
export const MAX_WINDOW_RUNS = 1000;

/** `null` (the experiment alone), `last_<n>_runs` or `last_<n><s|m|h|d|w>` of at most `maxMs`; throws an Error saying what is wrong. */
export function parseAlertWindow(text: string | null, maxMs: number): AlertWindow {
  if (text === null) return { kind: 'experiment' };
  const m = /^last_([1-9]\d{0,5})(_runs|[smhdw])$/.exec(text);
  if (!m) throw new Error(`must be last_<n>_runs or last_<n><s|m|h|d|w>, e.g. last_5_runs or last_24h; got ${JSON.stringify(text)}`);
  const n = Number(m[1]);
  if (m[2] === '_runs') {
    if (n > MAX_WINDOW_RUNS) throw new Error(`last_<n>_runs may span at most ${MAX_WINDOW_RUNS} experiments`);
    return { kind: 'runs', n };
  }
  const ms = parseDuration(`${n}${m[2]}`, 'whole');
  if (ms > maxMs) throw new Error(`spans more than the ${formatDuration(maxMs, 'w')} the alerter keeps runs for (SVC_ALERT_MAX_WINDOW)`);
  return { kind: 'duration', ms };
}

/** A completed experiment as alerts see it: its metrics snapshot, and how it aggregates replicas. */
export interface CompletedExperiment {
  tenant: string;
  experiment_id: string;
  name: string;
  spec_id: string;
  completed_at: number;
  metrics: ExperimentMetrics;
  aggregation: ReplicaAggregation;
}

/** The runs of one experiment (their latest scores), for windows over time and regressions. */
export interface ExperimentRuns {
  runs: RunFact[];
  traces: ReadonlyMap<string, RunTraceStats>;
}

/** What an evaluation reads besides the experiment itself (alert-history.ts keeps it). */
export interface AlertHistoryReader {
  /** Completed experiments of `tenant` (of `specId` when given) completed at or before `until`, oldest first. */
  completed(tenant: string, specId: string | null, from: number, until: CompletedExperiment): CompletedExperiment[];
  /** The last `n` of those, oldest first. */
  lastCompleted(tenant: string, specId: string | null, until: CompletedExperiment, n: number): CompletedExperiment[];
  runsOf(experimentId: string): ExperimentRuns | null;
}

/** A rule ready to evaluate: an API rule or a spec's. */
export interface EvaluableRule {
  id: string;
  name: string;
  source: 'api' | 'spec';
  eval_id: string | null;
  condition: AlertCondition;
  window: AlertWindow;
  windowText: string | null;
}

/** What an evaluation found, fired or not; `details` is shown on the firing. */
export interface Evaluation {
  fires: boolean;
  metric_value: number | null;
  threshold: number | null;
  reason: string;
  details: FiringDetails;
}

export interface FiringDetails {
  window: string | null;
  /** The experiments the window took, with the metric's value in each (runs windows), or those pooled. */
  experiments?: Array<{ experiment_id: string; name: string; completed_at: string; value: number | null }>;
  runs?: number;
  /** A regression's comparison of the metric, and the baseline. */
  baseline_id?: string;
  comparison?: MetricComparison;
}

/** A number as a reason shows it: up to 4 significant digits. */
export function formatValue(v: number | null): string {
  if (v === null) return 'none';
  return Number.isInteger(v) ? String(v) : String(Number(v.toPrecision(4)));
}

const iso = (ms: number) => new Date(ms).toISOString();

/** The rule on the experiment that just completed (`trigger`), as of its completion. */
export function evaluateRule(rule: EvaluableRule, trigger: CompletedExperiment, history: AlertHistoryReader): Evaluation {
  const c = rule.condition;
  if (c.kind === 'regression') return evaluateRegression(c.metric, trigger, history);
  const scope = rule.eval_id;
  const crossing = (v: number | null): v is number => v !== null && holds(v, c.operator, c.value);
  const w = rule.window;
  if (w.kind === 'experiment') {
    const value = trigger.metrics[c.metric];
    const fires = crossing(value);
    const reason =
      value === null
        ? `${c.metric} has no value in experiment "${trigger.name}" (${trigger.experiment_id})`
        : `${c.metric} ${formatValue(value)} ${fires ? '' : 'is not '}${c.operator} ${formatValue(c.value)} in experiment "${trigger.name}" (${trigger.experiment_id})`;
    return { fires, metric_value: value, threshold: c.value, reason, details: { window: null } };
  }
  if (w.kind === 'runs') {
    const last = history.lastCompleted(trigger.tenant, scope, trigger, w.n);
    const values = last.map((e) => ({ experiment_id: e.experiment_id, name: e.name, completed_at: iso(e.completed_at), value: e.metrics[c.metric] }));
    const details: FiringDetails = { window: rule.windowText, experiments: values };
    const value = trigger.metrics[c.metric];
    const where = scope === null ? 'of your experiments' : `of spec ${scope}`;
    if (last.length < w.n) {
      return {
        fires: false,
        metric_value: value,
        threshold: c.value,
        reason: `only ${last.length} completed experiment${last.length === 1 ? '' : 's'} ${where} so far; ${rule.windowText} needs ${w.n}`,
        details,
      };
    }
    const fires = values.every((v) => crossing(v.value));
    const list = values.map((v) => `${formatValue(v.value)} (${v.experiment_id})`).join(', ');
    const reason = fires
      ? `${c.metric} ${c.operator} ${formatValue(c.value)} in each of the last ${w.n} completed experiments ${where}: ${list}`
      : `${c.metric} was not ${c.operator} ${formatValue(c.value)} in each of the last ${w.n} completed experiments ${where}: ${list}`;
    return { fires, metric_value: value, threshold: c.value, reason, details };
  }
  const within = history.completed(trigger.tenant, scope, trigger.completed_at - w.ms, trigger);
  const sides = within.flatMap((e) => {
    const runs = history.runsOf(e.experiment_id);
    return runs ? [{ experiment: e, ...runs }] : [];
  });
  const pooled = pooledMetrics(sides.map((s) => ({ runs: s.runs, traces: s.traces, aggregation: s.experiment.aggregation })));
  const value = pooled[c.metric];
  const fires = crossing(value);
  const details: FiringDetails = {
    window: rule.windowText,
    runs: pooled.runs,
    experiments: sides.map((s) => ({
      experiment_id: s.experiment.experiment_id,
      name: s.experiment.name,
      completed_at: iso(s.experiment.completed_at),
      value: s.experiment.metrics[c.metric],
    })),
  };
  const over = `over the ${pooled.runs} run${pooled.runs === 1 ? '' : 's'} of ${sides.length} experiment${sides.length === 1 ? '' : 's'} completed in the ${rule.windowText!.slice('last_'.length)} up to ${iso(trigger.completed_at)}`;
  const reason =
    value === null
      ? `${c.metric} has no value ${over}`
      : `${c.metric} ${formatValue(value)} ${fires ? '' : 'is not '}${c.operator} ${formatValue(c.value)} ${over}`;
  return { fires, metric_value: value, threshold: c.value, reason, details };
}

/**
 * `<metric> regressed`: compare (compare.ts) of the previous completed experiment of the same
 * spec (baseline) with this one. Only a significant regression fires: an underpowered
 * comparison is untested, and noise pages no one.
 */
function evaluateRegression(metric: AlertMetric, trigger: CompletedExperiment, history: AlertHistoryReader): Evaluation {
  const none = (reason: string, details: FiringDetails = { window: null }): Evaluation => ({
    fires: false,
    metric_value: trigger.metrics[metric],
    threshold: null,
    reason,
    details,
  });
  const previous = history.lastCompleted(trigger.tenant, trigger.spec_id, trigger, 2);
  if (previous.length < 2) return none(`no earlier completed experiment of spec ${trigger.spec_id} to compare with`);
  const baseline = previous[0]!;
  const [base, cand] = [history.runsOf(baseline.experiment_id), history.runsOf(trigger.experiment_id)];
  if (!base || !cand) return none(`the runs of ${base ? trigger.experiment_id : baseline.experiment_id} are no longer held by the alerter`);
  const comparison = compareExperiments(
    { experiment_id: baseline.experiment_id, runs: base.runs, traces: base.traces, aggregation: baseline.aggregation },
    { experiment_id: trigger.experiment_id, runs: cand.runs, traces: cand.traces, aggregation: trigger.aggregation },
  );
  const m = comparison.metrics.find((x) => x.name === metric);
  const details: FiringDetails = { window: null, baseline_id: baseline.experiment_id, ...(m && { comparison: m }) };
  if (!m) return none(`${metric} has no value on one side of the comparison with ${baseline.experiment_id}`, details);
  const change = `${formatValue(m.baseline)} → ${formatValue(m.candidate)}`;
  const against = `against experiment "${baseline.name}" (${baseline.experiment_id})`;
  const base2 = { metric_value: m.candidate, threshold: m.baseline, details };
  if (m.regressed && m.significance === 'significant') {
    return { fires: true, ...base2, reason: `${metric} regressed significantly ${against}: ${change} (p = ${formatValue(m.p_value)} < ${comparison.alpha})` };
  }
  if (m.regressed)
    return {
      fires: false,
      ...base2,
      reason: `${metric} is worse ${against} (${change}) but the comparison is underpowered (untested): too few runs for any significance`,
    };
  const p = m.p_value === null ? '' : `, p = ${formatValue(m.p_value)}`;
  return { fires: false, ...base2, reason: `${metric} did not regress significantly ${against}: ${change} (${m.direction}${p})` };
}

/** One experiment's runs for pooled metrics. */
export interface PoolSide {
  runs: readonly RunFact[];
  traces: ReadonlyMap<string, RunTraceStats>;
  aggregation: ReplicaAggregation;
}

/**
 * The metrics over every run of several experiments (a `last_<duration>` window): each
 * experiment's scenarios keep their own verdicts and replica aggregation (pass_rate is passing
 * scenarios over graded scenarios of all of them), the per-run metrics pool the runs.
 */
export function pooledMetrics(sides: readonly PoolSide[]): ExperimentMetrics {
  const runs: RunFact[] = [];
  const traces = new Map<string, RunTraceStats>();
  let passing = 0;
  let graded = 0;
  const counts = { pass: 0, fail: 0, flaky: 0, error: 0 };
  let offset = 0;
  for (const side of sides) {
    const own = computeMetrics('', side.runs, side.traces, side.aggregation);
    const gradedHere = own.counts.pass + own.counts.fail + own.counts.flaky;
    graded += gradedHere;
    passing += own.pass_rate === null ? 0 : Math.round(own.pass_rate * gradedHere);
    for (const k of Object.keys(counts) as Array<keyof typeof counts>) counts[k] += own.counts[k];
    const indexes = [...new Set(side.runs.map((r) => r.scenario_index))];
    const remap = new Map(indexes.map((index, i) => [index, offset + i]));
    offset += indexes.length;
    for (const r of side.runs) runs.push({ ...r, scenario_index: remap.get(r.scenario_index)! });
    for (const [runId, t] of side.traces) if (runId !== '') traces.set(runId, t);
  }
  const pooled = computeMetrics('window', runs, traces, { strategy: 'majority' });
  return { ...pooled, pass_rate: graded === 0 ? null : passing / graded, counts };
}

/** A firing of the same rule for the same experiment earlier than `windowMs` before `now`, that notified (or tried). */
export function duplicateOf(earlier: ReadonlyArray<{ firing_id: string; fired_at: number; status: string }>, now: number, windowMs: number): string | null {
  const notified = earlier
    .filter((f) => f.status !== 'deduplicated' && now - f.fired_at < windowMs && now >= f.fired_at)
    .sort((a, b) => b.fired_at - a.fired_at);
  return notified[0]?.firing_id ?? null;
}

/** One delivery attempt of a notification. */
export interface DeliveryAttempt {
  at: string;
  /** `ok`; `http_error` (a status the notifier refused), `network_error`, `timeout`, `rejected` (the service said no: Slack's ok:false, an SMTP refusal), or `interrupted` (the alerter stopped during it). */
  outcome: 'ok' | 'http_error' | 'network_error' | 'timeout' | 'rejected' | 'interrupted';
  status_code?: number;
  error?: string;
  duration_ms: number;
}

/** How one notification of a firing went. */
export interface NotificationOutcome {
  channel: 'webhook' | 'slack' | 'email';
  /** For a webhook: `json` (the spec's body) or `slack_card` (an incoming-webhook URL of the chat service). */
  format?: 'json' | 'slack_card';
  target: string;
  status: 'pending' | 'delivered' | 'failed';
  attempts: DeliveryAttempt[];
  delivered_at?: string;
  error?: string;
}

/** The alerter's answer to POST /v1/alerts/:id/evaluate. */
export interface EvaluationAnswer {
  rule_id: string;
  experiment_id: string;
  dry_run: boolean;
  /** The condition held. */
  fired: boolean;
  metric_value: number | null;
  threshold: number | null;
  reason: string;
  details: FiringDetails;
  /** The firing recorded (null for a dry run or when the condition did not hold). */
  firing_id: string | null;
  /** `pending` (being delivered) or `deduplicated`. */
  status: 'pending' | 'deduplicated' | null;
  duplicate_of: string | null;
}
