/**
 * The read side of experiments on real data: the sink, the aggregator and the api run in this
 * process on chDB, and the test plays the scorer and the end of the aggregator's work by
 * appending their events (RunScored per run, the experiment `completed`) plus the trace events a
 * run's sandbox would report. Then, over HTTP: RunResults (verdicts over completed runs, errored
 * runs apart, replica aggregation, Wilson intervals, pass@k / pass^k, costs and tokens per run,
 * reproducers), the latest score of a re-scored run, metrics, scenarios filtered by verdict,
 * both export formats, eval history, compare, and a reproducer that really runs.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { after, before, describe, test } from 'node:test';
import { publish } from '../../services/kernel/actor.ts';
import { loadConfig } from '../../services/kernel/config.ts';
import { newEventId, runIdOf, scenarioIdOf } from '../../services/kernel/ids.ts';
import type { ExperimentChanged } from '../../services/domain/events/experiment-events.ts';
import type { InvariantScore, RunOutcome, RunScored, Violation } from '../../services/domain/events/run-events.ts';
import { cochranMantelHaenszel, passAtK, passHatK, quantile, wilsonInterval } from '../../services/domain/stats.ts';
import { TOPICS } from '../../services/kernel/topics.ts';
import { traceRecords, UNTAGGED, type IngestContext } from '../../services/api/traces/trace-records.ts';
import type { TraceEvent } from '../../services/domain/events/trace-events.ts';
import { startServices, type Running } from '../../services/main.ts';
import { ADMIN_KEY, freePort } from '../helpers/server.ts';

const TENANT = 'default'; // the admin key acts as the default tenant
const YAML = `version: 1\nid: checkout\nbase: debian:bookworm\ntask: {prompt: "fix {{ params.lang }}"}\nagent: {type: cli, command: "true"}
invariants:\n  builds: {check: {type: command_exit, command: "true"}, weight: 2}\n  docs: {check: {type: file_exists, path: README.md}}
parallelism: {replicas: 3, matrix: [{lang: go}, {lang: py}, {lang: rust}]}\n`;

type Verdict = RunScored['verdict'];

describe('experiment results on scored runs', () => {
  let running: Running;
  let dir: string;
  let url: string;
  const get = async (p: string) => {
    const res = await fetch(`${url}${p}`, { headers: { authorization: `Bearer ${ADMIN_KEY}` } });
    const text = await res.text();
    return { status: res.status, text, body: res.headers.get('content-type')?.includes('application/json') ? JSON.parse(text) : text };
  };
  const post = async (p: string, body: unknown) => {
    const res = await fetch(`${url}${p}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
    return { status: res.status, body: await res.json() };
  };

  /** Creates an experiment of `checkout` over HTTP, then completes it with these run verdicts per scenario index. */
  const completedExperiment = async (name: string, verdicts: Verdict[][], extra: Partial<ExperimentChanged> = {}) => {
    const created = await post('/v1/experiments', { name, spec_id: 'checkout' });
    assert.equal(created.status, 201);
    const id: string = created.body.id;
    const { kernel } = running;
    const now = Date.now();
    const scores: RunScored[] = verdicts.flatMap((replicas, index) => replicas.map((verdict, r) => score(id, index, r + 1, verdict, now + index * 10 + r)));
    const positions = await publish(
      kernel,
      TOPICS.runScores,
      scores.map((s) => ({ key: id, tenant: TENANT, value: s })),
    );
    await kernel.visibility.waitFor(positions, 10_000);
    const experiment: ExperimentChanged = {
      tenant: TENANT,
      event_id: newEventId(),
      ts: now + 1000,
      experiment_id: id,
      name,
      spec_id: 'checkout',
      spec_version: 1,
      status: 'completed',
      created_at: Date.parse(created.body.created_at),
      queued_at: now,
      started_at: now,
      completed_at: now + 1000,
      total_runs: scores.length,
      scored_runs: scores.length,
      concurrency: 5,
      options: '{}',
      secrets: Buffer.alloc(0),
      yaml: YAML,
      agent: null,
      error: null,
      metrics: null,
      ...extra,
    };
    const done = await publish(kernel, TOPICS.experiments, [{ key: id, tenant: TENANT, value: experiment }]);
    await kernel.visibility.waitFor(done, 10_000);
    for (let i = 0; i < 100 && (await get(`/v1/experiments/${id}`)).body.status !== 'completed'; i++) await new Promise((r) => setTimeout(r, 20));
    return { id, scores };
  };

  let baseline: { id: string; scores: RunScored[] };

  before(async () => {
    dir = await mkdtemp(path.join(os.tmpdir(), 'svc-results-'));
    const port = await freePort();
    const config = loadConfig({
      SVC_DATA_DIR: dir,
      SVC_PORT: String(port),
      SVC_HOST: '127.0.0.1',
      SVC_API_KEY: ADMIN_KEY,
      SVC_LOG_LEVEL: 'silent',
      SVC_LOG_FSYNC: 'never',
      SVC_RATE_LIMIT_WRITES: '0',
      SVC_RATE_LIMIT_READS: '0',
    });
    // No runner and no scorer: this test writes what they would.
    running = await startServices(config, ['sink', 'aggregator', 'api']);
    url = `http://127.0.0.1:${port}`;
    const res = await fetch(`${url}/v1/specs`, {
      method: 'POST',
      headers: { authorization: `Bearer ${ADMIN_KEY}`, 'content-type': 'application/x-yaml' },
      body: YAML,
    });
    assert.equal(res.status, 201);
    // go: all pass; py: pass, fail (with a violation), error; rust: every run errored.
    baseline = await completedExperiment('baseline', [
      ['pass', 'pass', 'pass'],
      ['pass', 'fail', 'error'],
      ['error', 'error', 'error'],
    ]);
    // The sandbox of each run reported model calls and tool calls, tagged with its run.
    const { kernel } = running;
    for (const [i, s] of baseline.scores.entries()) {
      await ingestTagged(kernel, TENANT, traces(i), {
        ...UNTAGGED,
        sandbox_id: s.sandbox_id,
        experiment_id: baseline.id,
        scenario_id: s.scenario_id,
        run_id: s.run_id,
      });
    }
    // The py replica 1 is scored again later (offline re-scoring): the latest row wins.
    const rescored = { ...score(baseline.id, 1, 1, 'fail', Date.now() + 5000), event_id: newEventId() };
    await kernel.visibility.waitFor(await publish(kernel, TOPICS.runScores, [{ key: baseline.id, tenant: TENANT, value: rescored }]), 10_000);
    baseline.scores[3] = rescored;
  });
  after(async () => {
    await running?.stop();
    await rm(dir, { recursive: true, force: true });
  });

  test('RunResults: scenario verdicts over completed runs, errored runs apart, the strategy decides whether flaky counts', async () => {
    const res = await get(`/v1/experiments/${baseline.id}`);
    assert.equal(res.status, 200, res.text);
    const r = res.body;
    assert.equal(r.status, 'completed');
    assert.deepEqual(r.counts, { pass: 1, fail: 1, flaky: 0, error: 1 });
    // go passes; py is now fail, fail, error (re-scored); rust has no completed run.
    assert.equal(r.pass_rate, 1 / 2);
    const [go, py, rust] = r.scenarios;
    assert.deepEqual([go.verdict, py.verdict, rust.verdict], ['pass', 'fail', 'error']);
    assert.deepEqual([go.passing, py.passing, rust.passing], [true, false, false]);
    assert.deepEqual([py.passed, py.failed, py.errored], [0, 2, 1]);
    assert.deepEqual(go.params, { lang: 'go' });
    assert.equal(go.scenario_id, scenarioIdOf(baseline.id, 0));
    assert.deepEqual(go.pass_rate_ci95, wilsonInterval(3, 3));
    assert.deepEqual(go.pass_at_k, { k: 3, value: passAtK(3, 3, 3) });
    assert.deepEqual(py.pass_hat_k, { k: 2, value: passHatK(2, 0, 2) });
    assert.equal(py.pass_at_1, 0);
    assert.equal(rust.pass_at_k, null);
    assert.equal(rust.error, 'the sandbox did not boot: image pull failed');
    assert.equal(rust.runs.length, 3);
  });

  test('each run carries its verdict, scores, violations, costs and tokens from its traces, and a reproducer when it did not pass', async () => {
    const r = (await get(`/v1/experiments/${baseline.id}`)).body;
    const [go, py, rust] = r.scenarios;
    const run = py.runs[1];
    assert.equal(run.run_id, runIdOf(baseline.id, 1, 2));
    assert.equal(run.verdict, 'fail');
    assert.equal(run.status, 'completed');
    assert.equal(run.composite, 0);
    assert.equal(run.agent_exit_code, 1);
    assert.deepEqual(run.invariants, invariants('fail'));
    assert.deepEqual(run.violations, violations('fail'));
    assert.equal(run.wall_ms, wall(1, 2));
    // List position 4: one llm_call costing 0.004 * 5 and two tool calls, both ok (even position).
    close(run.cost_usd, 0.004 * 5);
    assert.deepEqual(run.tokens, { input: 500, output: 50, cache_read: 0, reasoning: 0 });
    assert.deepEqual([run.llm_calls, run.tool_calls, run.tool_errors], [1, 2, 0]);
    assert.equal(py.runs[0].tool_errors, 1, 'position 3 failed one');
    assert.equal(run.trace_url, `${url}/v1/sandboxes/sb-4/trace`);
    assert.equal(go.runs[0].reproducer, null, 'a passing run of a passing scenario needs none');
    for (const failing of [...py.runs, ...rust.runs]) assert.match(failing.reproducer, /^curl -sS -X POST /);
    assert.equal(rust.runs[0].status, 'boot_failed');
    assert.equal(rust.runs[0].error, 'the sandbox did not boot: image pull failed');
    assert.equal(rust.runs[0].composite, null);
  });

  test('the reproducer is one shell command that re-creates and runs exactly that run', async () => {
    const run = (await get(`/v1/experiments/${baseline.id}`)).body.scenarios[1].runs[1];
    const { stdout } = await promisify(execFile)('sh', ['-c', run.reproducer], { env: { ...process.env, SVC_API_KEY: ADMIN_KEY } });
    const created = JSON.parse(stdout);
    assert.equal(created.name, `reproduce ${run.run_id}`);
    assert.equal(created.spec_id, 'checkout');
    assert.equal(created.spec_version, 1);
    assert.ok(['queued', 'running'].includes(created.status), created.status);
    assert.equal(created.total_runs, 1);
    const detail = (await get(`/v1/experiments/${created.id}`)).body;
    assert.deepEqual(detail.options, { spec_version: 1, matrix: [{ lang: 'py' }], replicas: 1, seed: run.seed });
  });

  test('metrics: wall and cost over completed runs, total cost over all, tool success, violations', async () => {
    const res = await get(`/v1/metrics/experiments/${baseline.id}`);
    assert.equal(res.status, 200, res.text);
    const m = res.body;
    const completed = [0, 1, 2, 3, 4]; // go 1-3, py 1-2 (list positions)
    const walls = completed.map((i) => wall(Math.floor(i / 3), (i % 3) + 1));
    close(m.mean_wall_ms, walls.reduce((a, b) => a + b) / walls.length);
    close(m.p95_wall_ms, quantile(walls, 0.95)!);
    close(
      m.total_cost_usd,
      [0, 1, 2, 3, 4, 5, 6, 7, 8].reduce((sum, i) => sum + 0.004 * (i + 1), 0),
    );
    close(m.mean_cost_per_run_usd, completed.reduce((sum, i) => sum + 0.004 * (i + 1), 0) / completed.length);
    // Every run made two tool calls; odd runs failed one of them.
    close(m.tool_success_rate, (10 - 2) / 10);
    close(m.mean_tool_calls, 2);
    assert.equal(m.side_effect_violations, 2, 'the two failing py runs each broke a rule');
    assert.deepEqual(m.counts, { pass: 1, fail: 1, flaky: 0, error: 1 });
    assert.deepEqual([m.runs, m.completed_runs], [9, 5]);
  });

  test("scenarios filter by verdict; the list counts each experiment's scenarios by verdict", async () => {
    const failing = await get(`/v1/scenarios?experiment_id=${baseline.id}&status=fail`);
    assert.deepEqual(
      failing.body.items.map((s: { params: object }) => s.params),
      [{ lang: 'py' }],
    );
    assert.equal(failing.body.items[0].runs.length, 3);
    assert.equal((await get(`/v1/scenarios?experiment_id=${baseline.id}&status=error`)).body.items[0].index, 2);
    const listed = (await get('/v1/experiments?limit=1000')).body.items.find((e: { id: string }) => e.id === baseline.id);
    assert.deepEqual(listed.counts, { pass: 1, fail: 1, flaky: 0, error: 1 });
    assert.equal(listed.status, 'completed');
  });

  test('export: every scenario then its runs with their full outcome, in NDJSON and in JSON', async () => {
    const ndjson = await get(`/v1/experiments/${baseline.id}/export?format=ndjson`);
    const lines = ndjson.text
      .trim()
      .split('\n')
      .map((l: string) => JSON.parse(l));
    assert.deepEqual(
      lines.map((l: { type: string }) => l.type),
      ['experiment', 'spec', 'scenario', 'run', 'run', 'run', 'scenario', 'run', 'run', 'run', 'scenario', 'run', 'run', 'run', 'end'],
    );
    assert.equal(lines[1].yaml, YAML);
    assert.equal(lines[7].outcome.status, 'completed');
    assert.equal(lines[7].outcome.agent.stdout, 'tail of stdout');
    assert.deepEqual(lines.at(-1), { type: 'end', scenarios: 3, runs: 9 });
    const json = (await get(`/v1/experiments/${baseline.id}/export`)).body;
    assert.equal(json.experiment.id, baseline.id);
    assert.equal(json.experiment.metrics.runs, 9);
    assert.deepEqual(
      json.scenarios.map((s: { verdict: string; runs: unknown[] }) => [s.verdict, s.runs.length]),
      [
        ['pass', 3],
        ['fail', 3],
        ['error', 3],
      ],
    );
    assert.equal(json.scenarios[2].runs[0].outcome.status, 'boot_failed');
  });

  test('eval history lists completed experiments oldest first, with their metrics; compare pairs scenarios and names regressions', async () => {
    const snapshot = { experiment_id: 'ignored', pass_rate: 0.25 };
    const candidate = await completedExperiment('candidate', [Array<Verdict>(10).fill('fail'), ['fail', 'fail', 'fail']], {
      metrics: JSON.stringify(snapshot),
    });
    const history = await get('/v1/evals/checkout/history?limit=1');
    assert.equal(history.status, 200, history.text);
    assert.equal(history.body.items[0].experiment_id, baseline.id);
    assert.equal(history.body.items[0].pass_rate, 1 / 2, 'computed when no snapshot was taken');
    const next = await get(`/v1/evals/checkout/history?limit=1&cursor=${history.body.next_cursor}`);
    assert.equal(next.body.items[0].experiment_id, candidate.id);
    assert.deepEqual(next.body.items[0].metrics, snapshot, 'the snapshot taken at completion');

    const res = await post('/v1/experiments/compare', { baseline_id: baseline.id, candidate_id: candidate.id });
    assert.equal(res.status, 200, JSON.stringify(res.body));
    const c = res.body;
    assert.equal(c.baseline_id, baseline.id);
    assert.deepEqual(c.unpaired, { baseline: [{ scenario_id: scenarioIdOf(baseline.id, 2), params: { lang: 'rust' } }], candidate: [] });
    const pass = c.metrics.find((m: { name: string }) => m.name === 'pass_rate');
    assert.deepEqual([pass.baseline, pass.candidate, pass.direction, pass.test], [0.5, 0, 'worse', 'cmh']);
    // Strata: go 3 of 3 passed against 0 of 10; py 0 of 2 against 0 of 3 (no variation, no weight).
    const expected = cochranMantelHaenszel([
      { a: 3, b: 0, c: 0, d: 10 },
      { a: 0, b: 2, c: 0, d: 3 },
    ]).p_value;
    close(pass.p_value, expected);
    assert.ok(expected < 0.01);
    const violations = c.metrics.find((m: { name: string }) => m.name === 'side_effect_violations');
    assert.deepEqual([violations.baseline, violations.candidate, violations.regressed], [2, 13, true]);
    for (const name of ['pass_rate', 'side_effect_violations', 'scenario {"lang":"go"}'])
      assert.ok(c.regressions.includes(name), `${name} in ${c.regressions}`);
    assert.ok(!c.regressions.includes('scenario {"lang":"py"}'), 'py failed on both sides');
    assert.equal(c.regressed, true);
  });
});

const close = (actual: number, expected: number) => assert.ok(Math.abs(actual - expected) < 1e-9, `expected ${expected}, got ${actual}`);
const wall = (index: number, replica: number) => 1000 + index * 300 + replica * 70;

function invariants(verdict: Verdict): InvariantScore[] {
  const passed = verdict === 'pass';
  return [
    { name: 'builds', type: 'command_exit', score: passed ? 1 : 0, weight: 2, gate: false, passed, message: passed ? 'exit 0' : 'exit 1' },
    { name: 'docs', type: 'file_exists', score: 1, weight: 1, gate: false, passed: true, message: 'README.md exists' },
  ];
}

function violations(verdict: Verdict): Violation[] {
  return verdict === 'fail'
    ? [{ rule: 'file_writes_outside', message: 'wrote /etc/passwd', audit: { seq: 7, ts: '2026-01-01T00:00:00.000Z', path: '/etc/passwd' } }]
    : [];
}

function score(experimentId: string, index: number, replica: number, verdict: Verdict, ts: number): RunScored {
  const error = verdict === 'error' ? 'the sandbox did not boot: image pull failed' : null;
  const position = index * 3 + replica - 1;
  const outcome: RunOutcome = {
    status: verdict === 'error' ? 'boot_failed' : 'completed',
    error,
    sandbox_id: `sb-${position}`,
    started_at: ts - 1000,
    ended_at: ts,
    wall_ms: wall(index, replica),
    agent: verdict === 'error' ? null : { exit_code: verdict === 'pass' ? 0 : 1, timed_out: false, duration_ms: 500, stdout: 'tail of stdout', stderr: '' },
    checks: {},
    diff: null,
    audit: { file_writes: [], secret_findings: [] },
  };
  return {
    tenant: TENANT,
    event_id: newEventId(),
    ts,
    experiment_id: experimentId,
    scenario_id: scenarioIdOf(experimentId, index),
    scenario_index: index,
    run_id: runIdOf(experimentId, index, replica),
    replica,
    attempt: 1,
    params: JSON.stringify({ lang: ['go', 'py', 'rust'][index] }),
    seed: 1000 + position,
    sandbox_id: `sb-${position}`,
    agent_snapshot_id: null,
    verdict,
    composite: verdict === 'error' ? null : verdict === 'pass' ? 1 : 0,
    invariants: JSON.stringify(verdict === 'error' ? [] : invariants(verdict)),
    violations: JSON.stringify(violations(verdict)),
    error,
    wall_ms: wall(index, replica),
    outcome: JSON.stringify(outcome),
    traces: null, // this test reads the traces from the store (ingested below), not from the scores
  };
}

/** The trace events of the run at list position i: one model call costing 0.004 * (i + 1), two tool calls (one failing on odd i). */
function traces(i: number) {
  const ts_us = Date.now() * 1000;
  const event = (overrides: Record<string, unknown>) => ({
    event_id: newEventId(),
    ts_us,
    trace_id: `t-${i}`,
    parent_span_id: null,
    duration_ms: 10,
    status: 'ok',
    input: null,
    output: null,
    cost: null,
    metadata: {},
    ...overrides,
  });
  return [
    event({
      event_type: 'llm_call',
      tool: 'openai.create',
      phase: 'complete',
      span_id: `llm-${i}`,
      cost: {
        input_tokens: 100 * (i + 1),
        output_tokens: 10 * (i + 1),
        cache_read_tokens: 0,
        reasoning_tokens: 0,
        model: 'gpt',
        estimated_usd: 0.004 * (i + 1),
      },
    }),
    event({ event_type: 'tool_use', tool: 'bash', phase: 'invoked', span_id: `tool-a-${i}`, parent_span_id: `llm-${i}` }),
    event({ event_type: 'tool_call', tool: 'edit', phase: 'complete', span_id: `tool-b-${i}`, status: i % 2 === 1 ? 'error' : 'ok' }),
  ] as TraceEvent[];
}

/** Trace events with the tags of a run's sandbox, appended as the ingest workers would, then awaited until queryable. */
async function ingestTagged(kernel: Running['kernel'], tenant: string, events: TraceEvent[], context: IngestContext): Promise<void> {
  const records = traceRecords(tenant, events, context, Date.now()).map((r) => ({ ...r, tenant }));
  await kernel.visibility.waitFor(await publish(kernel, TOPICS.traces, records), kernel.config.replyTimeout);
}
