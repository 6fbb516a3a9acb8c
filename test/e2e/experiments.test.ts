/**
 * Experiments end to end with real agents (snapshot bundles of shell scripts) on the local
 * runtime: spec, sandbox, agent, trace, invariants, score, verdicts, metrics, compare, restart,
 * and the judge against a local OpenAI-compatible server.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { backend } from '../helpers/backend.ts';
import { judgeAnswer, judgeServer } from '../helpers/judge.ts';
import { makeBundle, uploadAgent } from '../helpers/bundles.ts';
import { createTenantKey, startServer, type TestServer } from '../helpers/server.ts';

const AGENTS: Record<string, string> = {
  good: 'echo "done $SVC_PARAM_LANG" > "$SVC_WORKSPACE/out.txt"; echo "wrote out.txt"',
  bad: 'echo "nothing to do"',
  // Replica 4 of every scenario fails: a flaky agent, deterministically.
  flaky: 'case "$SVC_RUN_ID" in *-4) exit 0;; esac; echo ok > "$SVC_WORKSPACE/out.txt"',
  slow: 'sleep 30',
  leaky: 'mkdir -p "$SVC_WORKSPACE/out"; echo ok > "$SVC_WORKSPACE/out/out.txt"; echo x > "$SVC_WORKSPACE/elsewhere.txt"; echo "token is $API_TOKEN"',
  // Reports its own model call and tool use from inside its sandbox, as an agent's SDK does.
  traced: `curl -sf -X POST "$SVC_BASE_URL/v1/sandboxes/$SVC_SANDBOX_ID/trace" -H "authorization: Bearer $SVC_API_KEY" -H 'content-type: application/json' --data-binary '${JSON.stringify(
    [
      {
        ts: '2026-01-01T00:00:00Z',
        event_type: 'llm_call',
        tool: 'chat',
        phase: 'complete',
        span_id: 'llm-1',
        cost: { model: 'gpt-4o', input_tokens: 1000, output_tokens: 100, estimated_usd: 0.25 },
      },
      { ts: '2026-01-01T00:00:01Z', event_type: 'tool_use', tool: 'bash', phase: 'invoked', span_id: 'tool-1', parent_span_id: 'llm-1' },
    ],
  )}' && echo done > "$SVC_WORKSPACE/out.txt"`,
  pause: 'sleep 1; echo done > "$SVC_WORKSPACE/out.txt"',
};

const spec = (id: string, agent: string, body: string) => `version: 1
id: ${id}
base: debian:bookworm
task: {prompt: write out.txt}
agent: {type: snapshot, snapshot: ${agent}}
${body}`;

const OUT_EXISTS = 'invariants:\n  out: {check: {type: file_exists, path: out.txt}}\n';

const runtime = backend('SVC_TEST_BWRAP', 'experiments on the local runtime');

if (runtime) {
  describe('experiments', () => {
    let server: TestServer;
    let key: string;
    let judgeScore = 0.9;
    let judgeStatus = 200;
    let judge: Awaited<ReturnType<typeof judgeServer>>;
    const snapshots: Record<string, string> = {};
    const req = (method: string, p: string, body?: unknown, k = key) => server.request(method, p, { key: k, body });
    const putSpec = async (yaml: string) => {
      const res = await server.request('POST', '/v1/specs', { key, body: yaml, headers: { 'content-type': 'application/x-yaml' } });
      assert.equal(res.status, 201, res.text);
    };
    const start = async (specId: string, extra: Record<string, unknown> = {}) => {
      const created = await req('POST', '/v1/experiments', { name: `${specId} run`, spec_id: specId, ...extra });
      assert.equal(created.status, 201, created.text);
      assert.equal(created.body.status, 'created');
      const run = await req('POST', `/v1/experiments/${created.body.id}/run`);
      assert.equal(run.status, 202, run.text);
      return created.body.id as string;
    };
    const finished = async (id: string, limitMs = 90_000) => {
      const deadline = Date.now() + limitMs;
      for (;;) {
        const res = await req('GET', `/v1/experiments/${id}`);
        assert.equal(res.status, 200, res.text);
        if (['completed', 'failed', 'cancelled'].includes(res.body.status)) return res.body;
        assert.ok(Date.now() < deadline, `experiment ${id} still ${res.body.status} after ${limitMs} ms: ${res.text.slice(0, 500)}`);
        await new Promise((r) => setTimeout(r, 200));
      }
    };
    const runsOf = (results: any) => results.scenarios.flatMap((s: any) => s.runs);

    before(async () => {
      judge = await judgeServer(() => ({
        status: judgeStatus,
        body: judgeAnswer(judgeScore),
      }));
      server = await startServer({
        SVC_SANDBOX_HOST_ROOTFS: 'true',
        SVC_RATE_LIMIT_WRITES: '0',
        SVC_RATE_LIMIT_READS: '0',
        SVC_JUDGE_URL: judge.url,
        SVC_JUDGE_API_KEY: 'judge-key',
      });
      key = (await createTenantKey(server, 'acme')).key;
      for (const [name, script] of Object.entries(AGENTS)) {
        const res = await uploadAgent(server, key, { name, entrypoint: ['sh', 'run.sh'] }, await makeBundle({ 'run.sh': `#!/bin/sh\n${script}\n` }));
        assert.equal(res.status, 201, res.text);
        snapshots[name] = res.body.id;
      }
    });
    after(async () => {
      await server.cleanup();
      await judge.close();
    });

    test('a 3 x 4 matrix runs 12 jobs; params reach the agent (env) and the checks ({{ params }})', async () => {
      await putSpec(
        spec(
          'matrix',
          'good',
          `parallelism:
  replicas: 4
  matrix: [{lang: py}, {lang: go}, {lang: rs}]
resources: {concurrency_limit: 4}
invariants:
  exists: {check: {type: file_exists, path: out.txt}}
  content: {check: {type: file_content, path: out.txt, contains: "done {{ params.lang }}"}}
  grep: {check: {type: command_exit, command: 'grep -q "$SVC_PARAM_LANG" out.txt'}}
  custom: {check: {type: custom, script: "import json, os\\nprint(json.dumps({'passed': os.path.exists('out.txt'), 'score': 1, 'message': 'found it'}))\\n"}}
`,
        ),
      );
      const id = await start('matrix');
      const results = await finished(id);
      assert.equal(results.status, 'completed', JSON.stringify(results).slice(0, 1000));
      assert.equal(results.total_runs, 12);
      assert.equal(runsOf(results).length, 12);
      assert.equal(new Set(runsOf(results).map((r: any) => r.run_id)).size, 12);
      assert.deepEqual(results.scenarios.map((s: any) => s.params.lang).sort(), ['go', 'py', 'rs']);
      for (const scenario of results.scenarios) {
        assert.equal(scenario.verdict, 'pass', JSON.stringify(scenario).slice(0, 800));
        assert.equal(scenario.runs.length, 4);
        for (const run of scenario.runs) {
          assert.equal(run.verdict, 'pass');
          assert.equal(run.composite, 1);
          assert.deepEqual(run.invariants.map((i: any) => i.name).sort(), ['content', 'custom', 'exists', 'grep']);
          assert.ok(
            run.invariants.every((i: any) => i.passed && i.score === 1),
            JSON.stringify(run.invariants),
          );
        }
      }
      assert.equal(results.counts.pass, 3);
      assert.equal(results.pass_rate, 1);
      const metrics = await req('GET', `/v1/metrics/experiments/${id}`);
      assert.equal(metrics.status, 200, metrics.text);
      assert.equal(metrics.body.pass_rate, 1);
      assert.ok(metrics.body.mean_wall_ms > 0 && metrics.body.p95_wall_ms >= metrics.body.mean_wall_ms * 0.5);
      assert.equal(metrics.body.side_effect_violations, 0);
    });

    test('failing and flaky agents, and every replica aggregation strategy', async () => {
      await putSpec(spec('failing', 'bad', OUT_EXISTS));
      const failing = await finished(await start('failing'));
      assert.equal(failing.scenarios[0].verdict, 'fail');
      const failedRun = failing.scenarios[0].runs[0];
      assert.equal(failedRun.verdict, 'fail');
      assert.equal(failedRun.composite, 0);
      assert.match(failedRun.reproducer, /curl .*\/v1\/experiments/);
      assert.ok(failedRun.reproducer.includes(snapshots.bad), 'the reproducer pins the agent snapshot');
      assert.match(failedRun.reproducer, /"seed":\d+/);
      assert.match(failedRun.reproducer, /"run":true/);

      const strategies: Array<[string, string, boolean]> = [
        ['majority', '{strategy: majority}', true],
        ['all', '{strategy: all_must_pass}', false],
        ['pct70', '{strategy: percentage, min_pass_rate: 0.7}', true],
        ['pct80', '{strategy: percentage, min_pass_rate: 0.8}', false],
      ];
      for (const [name, aggregation, passing] of strategies) {
        await putSpec(
          spec(`flaky-${name}`, 'flaky', `parallelism: {replicas: 4}\nscoring: {pass_threshold: 1.0, replica_aggregation: ${aggregation}}\n${OUT_EXISTS}`),
        );
        const results = await finished(await start(`flaky-${name}`));
        const scenario = results.scenarios[0];
        assert.equal(scenario.verdict, 'flaky', name);
        assert.equal(scenario.passing, passing, `${name}: ${JSON.stringify(scenario).slice(0, 300)}`);
        assert.equal(scenario.pass_rate, 0.75);
        assert.ok(scenario.pass_rate_ci95.low < 0.75 && scenario.pass_rate_ci95.high > 0.75, JSON.stringify(scenario.pass_rate_ci95));
        assert.equal(results.pass_rate, passing ? 1 : 0, name);
      }
    });

    test('gates, weights and the pass threshold', async () => {
      const body = (threshold: number, gate: boolean) => `scoring: {pass_threshold: ${threshold}}
invariants:
  made: {check: {type: file_exists, path: out.txt}, weight: 3}
  extra: {check: {type: file_exists, path: missing.txt}, weight: 1, gate: ${gate}}
`;
      const cases: Array<[string, number, boolean, string, number]> = [
        ['w70', 0.7, false, 'pass', 0.75],
        ['w80', 0.8, false, 'fail', 0.75],
        ['gate', 0.5, true, 'fail', 0],
      ];
      for (const [name, threshold, gate, verdict, composite] of cases) {
        await putSpec(spec(`weights-${name}`, 'good', body(threshold, gate)));
        const run = runsOf(await finished(await start(`weights-${name}`)))[0];
        assert.equal(run.verdict, verdict, name);
        assert.equal(run.composite, composite, name);
        const extra = run.invariants.find((i: any) => i.name === 'extra');
        assert.deepEqual([extra.score, extra.weight, extra.gate, extra.passed], [0, 1, gate, false]);
      }
    });

    test('an agent past its timeout and a sandbox that cannot boot are errors, apart from failures', async () => {
      await putSpec(
        spec('slow', 'slow', OUT_EXISTS).replace('agent: {type: snapshot, snapshot: slow}', 'agent: {type: snapshot, snapshot: slow, timeout: 2s}'),
      );
      const slow = await finished(await start('slow'));
      const run = runsOf(slow)[0];
      assert.equal(run.verdict, 'error');
      assert.match(run.error, /timeout/);
      assert.equal(slow.scenarios[0].verdict, 'error');
      assert.equal(slow.counts.error, 1);

      await putSpec(spec('no-secret', 'good', `secrets: {API_TOKEN: dashboard}\n${OUT_EXISTS}`));
      const unbooted = await finished(await start('no-secret'));
      const failedBoot = runsOf(unbooted)[0];
      assert.equal(failedBoot.verdict, 'error');
      assert.match(failedBoot.error, /secrets_resolved: required secret API_TOKEN is missing/);
      assert.ok(failedBoot.reproducer, 'an error has a reproducer too');
    });

    test('forbidden rules fail a run even when every invariant passes, naming the audit record', async () => {
      await putSpec(
        spec(
          'leaky',
          'leaky',
          `audit:
  stdout_capture: true
  file_system: {watch: ["/"], track: [writes]}
forbidden:
  file_writes_outside: [out/]
  secrets_in_logs: deny
invariants:
  out: {check: {type: file_exists, path: out/out.txt}}
`,
        ),
      );
      const results = await finished(await start('leaky', { secrets: { API_TOKEN: 'tok-secret-123' } }));
      const run = runsOf(results)[0];
      assert.equal(run.verdict, 'fail');
      assert.equal(run.composite, 0);
      assert.ok(run.invariants.every((i: any) => i.passed));
      const rules = run.violations.map((v: any) => v.rule).sort();
      assert.deepEqual([...new Set(rules)], ['file_writes_outside', 'secrets_in_logs']);
      const outside = run.violations.find((v: any) => v.rule === 'file_writes_outside');
      assert.equal(outside.audit.path, 'elsewhere.txt');
      assert.ok(outside.audit.seq > 0);
      assert.equal(run.violations.find((v: any) => v.rule === 'secrets_in_logs').audit.secret, 'API_TOKEN');
      assert.ok(!JSON.stringify(results).includes('tok-secret-123'), 'no secret value in the results');
      assert.equal((await req('GET', `/v1/metrics/experiments/${results.id}`)).body.side_effect_violations, rules.length);
    });

    test('compare: a worse agent regresses significantly, a better one does not', async () => {
      await putSpec(spec('compare', 'good', `parallelism: {replicas: 6}\n${OUT_EXISTS}`));
      const good = await start('compare', { agent_snapshot_id: snapshots.good });
      const bad = await start('compare', { agent_snapshot_id: snapshots.bad });
      await finished(good);
      await finished(bad);
      const worse = await req('POST', '/v1/experiments/compare', { baseline_id: good, candidate_id: bad });
      assert.equal(worse.status, 200, worse.text);
      assert.equal(worse.body.regressed, true);
      assert.ok(worse.body.regressions.includes('pass_rate'), JSON.stringify(worse.body.regressions));
      const passRate = worse.body.metrics.find((m: any) => m.name === 'pass_rate');
      assert.deepEqual([passRate.baseline, passRate.candidate, passRate.delta, passRate.direction], [1, 0, -1, 'worse']);
      // The better agent does more work, so its wall time may differ significantly; its pass rate does not regress.
      const better = await req('POST', '/v1/experiments/compare', { baseline_id: bad, candidate_id: good });
      assert.ok(!better.body.regressions.includes('pass_rate'), JSON.stringify(better.body.regressions));
      assert.equal(better.body.metrics.find((m: any) => m.name === 'pass_rate').direction, 'better');
    });

    test('trace events an agent posts from its run sandbox are tagged with its experiment, scenario, run and agent', async () => {
      await putSpec(spec('traced', 'traced', OUT_EXISTS));
      const id = await start('traced');
      const results = await finished(id);
      const run = runsOf(results)[0];
      assert.equal(run.verdict, 'pass');
      assert.equal(run.cost_usd, 0.25);
      assert.equal(run.tokens.input, 1000);
      const traces = await req('GET', `/v1/traces?experiment_id=${id}`);
      assert.equal(traces.body.items.length, 2);
      for (const e of traces.body.items) {
        assert.equal(e.experiment_id, id);
        assert.equal(e.agent, 'traced');
        assert.equal(e.agent_snapshot_id, snapshots.traced);
      }
      assert.equal((await req('GET', `/v1/metrics/experiments/${id}`)).body.total_cost_usd, 0.25);
    });

    test('the judge grades llm_as_judge checks; its failure is a judge call failure, not a 0', async () => {
      await putSpec(
        spec(
          'judged',
          'good',
          'scoring: {pass_threshold: 0.8}\ninvariants:\n  quality: {check: {type: llm_as_judge, rubric: "Did the agent write out.txt?", input: agent_output, threshold: 0.8}}\n',
        ),
      );
      judgeScore = 0.9;
      const graded = runsOf(await finished(await start('judged')))[0];
      assert.equal(graded.verdict, 'pass');
      assert.equal(graded.invariants[0].score, 0.9);
      const call = judge.calls.at(-1)!;
      assert.equal(call.auth, 'Bearer judge-key');
      assert.ok(JSON.stringify(call.body.messages).includes('Did the agent write out.txt?'));
      assert.ok(JSON.stringify(call.body.messages).includes('wrote out.txt'), 'the agent output is what is graded');

      judgeScore = 0.3;
      assert.equal(runsOf(await finished(await start('judged')))[0].verdict, 'fail');

      judgeStatus = 500;
      const broken = runsOf(await finished(await start('judged')))[0];
      judgeStatus = 200;
      assert.equal(broken.verdict, 'error');
      assert.match(broken.error, /judge call failed/);
      assert.equal(broken.invariants[0].judge_failure, true);
      assert.equal(broken.invariants[0].score, null);
    });

    test('a restart in the middle of an experiment loses nothing and counts every run once', async () => {
      await putSpec(spec('restart', 'pause', `parallelism: {replicas: 6}\nresources: {concurrency_limit: 2}\n${OUT_EXISTS}`));
      const id = await start('restart');
      for (let i = 0; i < 100; i++) {
        const now = (await req('GET', `/v1/experiments/${id}`)).body;
        if (now.scored_runs >= 1) break;
        await new Promise((r) => setTimeout(r, 100));
      }
      const mid = (await req('GET', `/v1/experiments/${id}`)).body;
      assert.ok(mid.scored_runs >= 1 && mid.scored_runs < 6, `mid-way: ${mid.scored_runs} scored`);
      await server.stop();
      await server.restart();
      const results = await finished(id, 120_000);
      assert.equal(results.status, 'completed');
      assert.equal(results.scored_runs, 6);
      const runs = runsOf(results);
      assert.equal(runs.length, 6);
      assert.equal(new Set(runs.map((r: any) => r.run_id)).size, 6);
      assert.ok(
        runs.every((r: any) => r.verdict === 'pass'),
        JSON.stringify(runs.map((r: any) => [r.run_id, r.verdict, r.error])),
      );
    });
  });
}
