/**
 * Score rules and offline scoring over HTTP against the real service: rule creation and its
 * validation (every bad field named), list, read and delete, tenancy (403 for another tenant's
 * rule_ or exp- id, 404 for an unknown one), the preconditions of POST /v1/experiments/:id/score
 * (404, 403, 409, 400), and the score lists' parameters. With bubblewrap, a real experiment whose
 * judge was down is scored offline: a rescore rule supersedes its verdicts, a threshold and an
 * llm_as_judge rule grade every stored run, and scoring again replaces the records.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { backend } from '../helpers/backend.ts';
import { judgeAnswer, judgeServer, type JudgeServer } from '../helpers/judge.ts';
import { createTenantKey, startServer, type TestServer } from '../helpers/server.ts';

const SPEC = (id: string, body = 'invariants:\n  out: {check: {type: file_exists, path: out.txt}}\n') =>
  `version: 1\nid: ${id}\nbase: debian:bookworm\ntask: {prompt: answer}\nagent: {type: cli, command: 'echo "the answer is 42"; echo x > out.txt'}\n${body}`;

const runtime = backend('SVC_TEST_BWRAP', 'offline scoring of a real experiment');

describe('score rules', () => {
  let server: TestServer;
  let judge: JudgeServer;
  /** What the judge answers now: a score of 0.8 ("states the answer") unless a test says otherwise. */
  const judgeState = { score: 0.8, status: 200 };
  let key: string;
  let other: string;
  const req = (method: string, path: string, body?: unknown, k = key) => server.request(method, path, { key: k, ...(body !== undefined && { body }) });
  const putSpec = async (yaml: string, k = key) =>
    assert.equal((await server.request('POST', '/v1/specs', { key: k, body: yaml, headers: { 'content-type': 'application/x-yaml' } })).status, 201);
  const rule = async (body: Record<string, unknown>, k = key) => {
    const res = await req('POST', '/v1/score-rules', body, k);
    assert.equal(res.status, 201, res.text);
    return res.body;
  };
  const bad = async (method: string, path: string, body: unknown, ...fields: string[]) => {
    const res = await req(method, path, body);
    assert.equal(res.status, 400, res.text);
    assert.equal(res.body.error, 'bad_request');
    for (const field of fields) assert.ok(res.body.message.includes(`${field}:`), `expected "${field}:" in ${res.body.message}`);
    return res.body.message as string;
  };

  before(async () => {
    judge = await judgeServer(() => ({ status: judgeState.status, body: judgeAnswer(judgeState.score, 'states the answer') }));
    server = await startServer({
      SVC_RATE_LIMIT_WRITES: '0',
      SVC_RATE_LIMIT_READS: '0',
      SVC_SANDBOX_HOST_ROOTFS: 'true',
      SVC_JUDGE_URL: judge.url,
      SVC_JUDGE_MODEL: 'judge-default',
    });
    key = (await createTenantKey(server, 'acme')).key;
    other = (await createTenantKey(server, 'globex')).key;
    await putSpec(SPEC('checkout'));
  });
  after(async () => {
    await server.cleanup();
    await judge.close();
  });

  test('each rule type is created with its fields and listed, read and deleted', async () => {
    const judged = await rule({ name: 'concise', type: 'llm_as_judge', rubric: 'Is the answer concise?', threshold: 0.6, eval_id: 'checkout' });
    assert.match(judged.id, /^rule_[0-9a-f]+$/);
    assert.deepEqual(
      { ...judged, id: undefined, created_at: undefined },
      {
        id: undefined,
        created_at: undefined,
        name: 'concise',
        type: 'llm_as_judge',
        rubric: 'Is the answer concise?',
        input: 'agent_output',
        threshold: 0.6,
        eval_id: 'checkout',
      },
    );
    assert.ok(!Number.isNaN(Date.parse(judged.created_at)));
    const withModel = await rule({ name: 'minimal diff', type: 'llm_as_judge', rubric: 'Minimal?', input: 'diff', threshold: 0.5, model: 'gpt-4o' });
    assert.deepEqual([withModel.input, withModel.model, withModel.eval_id], ['diff', 'gpt-4o', null]);
    const fast = await rule({ name: 'fast', type: 'threshold', condition: 'wall_ms <  60000 ' });
    assert.equal(fast.condition, 'wall_ms <  60000');
    const again = await rule({ name: 'again', type: 'rescore', eval_id: null });
    assert.deepEqual(Object.keys(again).sort(), ['created_at', 'eval_id', 'id', 'name', 'type']);

    const list = await req('GET', '/v1/score-rules');
    assert.equal(list.status, 200);
    assert.deepEqual(
      list.body.items.map((r: any) => r.id),
      [judged.id, withModel.id, fast.id, again.id],
      'oldest first',
    );
    assert.equal(list.body.count, 4);
    assert.deepEqual(
      (await req('GET', '/v1/score-rules?eval_id=checkout')).body.items.map((r: any) => r.id),
      [judged.id],
    );
    assert.deepEqual((await req('GET', `/v1/score-rules/${fast.id}`)).body, fast);

    const deleted = await req('DELETE', `/v1/score-rules/${withModel.id}`);
    assert.equal(deleted.status, 200, deleted.text);
    assert.deepEqual(deleted.body, { id: withModel.id, deleted: true });
    assert.equal((await req('GET', `/v1/score-rules/${withModel.id}`)).status, 404);
    const twice = await req('DELETE', `/v1/score-rules/${withModel.id}`);
    assert.equal(twice.status, 404);
    assert.equal(twice.body.error, 'not_found');
    assert.ok(!(await req('GET', '/v1/score-rules')).body.items.some((r: any) => r.id === withModel.id));
    for (const r of [judged, fast, again]) assert.equal((await req('DELETE', `/v1/score-rules/${r.id}`)).status, 200);
  });

  test('a bad rule is a 400 naming every bad field', async () => {
    await bad('POST', '/v1/score-rules', [], 'body');
    await bad('POST', '/v1/score-rules', {}, 'type', 'name');
    await bad('POST', '/v1/score-rules', { name: 'x', type: 'vibes' }, 'type');
    await bad('POST', '/v1/score-rules', { name: '', type: 'rescore', colour: 'red' }, 'name', 'colour');
    await bad('POST', '/v1/score-rules', { name: 'x', type: 'rescore', rubric: 'why?' }, 'rubric');
    await bad('POST', '/v1/score-rules', { name: 'x', type: 'llm_as_judge' }, 'rubric', 'threshold');
    await bad(
      'POST',
      '/v1/score-rules',
      { name: 'x', type: 'llm_as_judge', rubric: 'ok?', threshold: 1.5, input: 'file:out.txt', model: '' },
      'threshold',
      'input',
      'model',
    );
    await bad('POST', '/v1/score-rules', { name: 'x', type: 'llm_as_judge', rubric: 'ok?', threshold: '0.5' }, 'threshold');
    assert.match(
      await bad('POST', '/v1/score-rules', { name: 'x', type: 'threshold', condition: 'speed > 3' }, 'condition'),
      /unknown metric "speed"; one of wall_ms/,
    );
    await bad('POST', '/v1/score-rules', { name: 'x', type: 'threshold', condition: 'wall_ms is small' }, 'condition');
    await bad('POST', '/v1/score-rules', { name: 'x', type: 'threshold' }, 'condition');
    await bad('POST', '/v1/score-rules', { name: 'x', type: 'rescore', eval_id: 42 }, 'eval_id');
    assert.match(await bad('POST', '/v1/score-rules', { name: 'x', type: 'rescore', eval_id: 'never-uploaded' }, 'eval_id'), /no spec "never-uploaded"/);
    // Another tenant's spec id is not yours: names are per tenant.
    assert.equal((await req('POST', '/v1/score-rules', { name: 'x', type: 'rescore', eval_id: 'checkout' }, other)).status, 400);
    await bad('GET', '/v1/score-rules?colour=red', undefined, 'colour');
    assert.equal((await req('GET', '/v1/score-rules')).body.count, 0, 'nothing was created');
  });

  test("tenancy: another tenant's rule is 403 to read, delete or use, and never listed; an unknown id is 404", async () => {
    const mine = await rule({ name: 'mine', type: 'rescore' });
    for (const method of ['GET', 'DELETE']) {
      const res = await req(method, `/v1/score-rules/${mine.id}`, undefined, other);
      assert.equal(res.status, 403, res.text);
      assert.equal(res.body.error, 'forbidden');
      assert.equal((await req(method, '/v1/score-rules/rule_0000000000000000')).status, 404);
    }
    assert.equal((await req('GET', '/v1/score-rules', undefined, other)).body.count, 0);
    assert.equal((await req('GET', `/v1/score-rules/${mine.id}`)).status, 200, 'still there');
    assert.equal((await req('DELETE', `/v1/score-rules/${mine.id}`)).status, 200);
  });

  test("POST /v1/experiments/:id/score: 404 unknown, 403 another tenant's, 409 not completed, 400 bad body or rules; the score lists check their parameters", async () => {
    const created = await req('POST', '/v1/experiments', { name: 'not yet', spec_id: 'checkout' });
    assert.equal(created.status, 201, created.text);
    const id = created.body.id as string;
    const mine = await rule({ name: 'fast', type: 'threshold', condition: 'wall_ms < 60000' });

    const unknown = await req('POST', '/v1/experiments/exp-0000000000000000/score', {});
    assert.equal(unknown.status, 404, unknown.text);
    assert.equal(unknown.body.error, 'not_found');
    assert.equal((await req('POST', `/v1/experiments/${id}/score`, {}, other)).status, 403);
    const early = await req('POST', `/v1/experiments/${id}/score`, { rule_ids: [mine.id] });
    assert.equal(early.status, 409, early.text);
    assert.equal(early.body.error, 'conflict');
    assert.match(early.body.message, /is created; only a completed experiment/);
    await bad('POST', `/v1/experiments/${id}/score`, { rule_ids: 'all' }, 'rule_ids');
    await bad('POST', `/v1/experiments/${id}/score`, { rule_ids: [] }, 'rule_ids');
    await bad('POST', `/v1/experiments/${id}/score`, { rules: [mine.id] }, 'rules');
    await bad('POST', `/v1/experiments/${id}/score`, [mine.id], 'body');

    // The lists: the experiment must be yours and exist; experiment_id is required on /v1/scores.
    for (const path of [`/v1/experiments/${id}/scores`, `/v1/scores?experiment_id=${id}`]) {
      const empty = await req('GET', path);
      assert.equal(empty.status, 200, empty.text);
      assert.deepEqual(empty.body, { items: [], count: 0 });
      assert.equal((await req('GET', path, undefined, other)).status, 403);
    }
    assert.equal((await req('GET', '/v1/experiments/exp-0000000000000000/scores')).status, 404);
    assert.equal((await req('GET', '/v1/scores?experiment_id=exp-0000000000000000')).status, 404);
    assert.match(await bad('GET', '/v1/scores', undefined, 'experiment_id'), /required/);
    await bad('GET', `/v1/scores?experiment_id=${id}&rule_id=`, undefined, 'rule_id');
    await bad('GET', `/v1/scores?experiment_id=${id}&colour=red`, undefined, 'colour');
    await bad('GET', `/v1/experiments/${id}/scores?limit=0`, undefined, 'limit');
    await bad('GET', `/v1/experiments/${id}/scores?limit=5000`, undefined, 'limit');
    await bad('GET', `/v1/experiments/${id}/scores?cursor=nonsense`, undefined, 'cursor');
    assert.equal((await req('DELETE', `/v1/score-rules/${mine.id}`)).status, 200);
  });

  if (runtime) {
    test('offline scoring of a real experiment: rescore after a judge outage, threshold and judge rules, scoring again replaces', async () => {
      await putSpec(
        SPEC(
          'judged',
          `parallelism: {replicas: 2}
scoring: {pass_threshold: 0.9}
invariants:
  out: {check: {type: file_exists, path: out.txt}}
  quality: {check: {type: llm_as_judge, rubric: "Does it state the answer?", input: agent_output, threshold: 0.5}}
`,
        ),
      );
      const runs = async (id: string) => (await req('GET', `/v1/experiments/${id}`)).body.scenarios.flatMap((s: any) => s.runs);
      const until = async <T>(what: string, probe: () => Promise<T | null>): Promise<T> => {
        const deadline = Date.now() + 90_000;
        for (;;) {
          const found = await probe();
          if (found !== null) return found;
          assert.ok(Date.now() < deadline, `timed out waiting for ${what}`);
          await new Promise((r) => setTimeout(r, 200));
        }
      };

      judgeState.status = 500;
      const created = await req('POST', '/v1/experiments', { name: 'during the outage', spec_id: 'judged', run: true });
      assert.equal(created.status, 201, created.text);
      const id = created.body.id as string;
      await until('the experiment to complete', async () => ((await req('GET', `/v1/experiments/${id}`)).body.status === 'completed' ? true : null));
      const before = await runs(id);
      assert.deepEqual(
        before.map((r: any) => r.verdict),
        ['error', 'error'],
      );
      assert.match(before[0].error, /judge call failed/);

      judgeState.status = 200;
      judgeState.score = 0.8;
      const again = await rule({ name: 'again', type: 'rescore', eval_id: 'judged' });
      const fast = await rule({ name: 'fast', type: 'threshold', condition: 'wall_ms < 600000' });
      const states = await rule({ name: 'states it', type: 'llm_as_judge', rubric: 'Is 42 stated?', threshold: 0.5 });
      const elsewhere = await rule({ name: 'other spec', type: 'rescore', eval_id: 'checkout' });
      const unrelated = await req('POST', `/v1/experiments/${id}/score`, { rule_ids: [elsewhere.id] });
      assert.equal(unrelated.status, 400, unrelated.text);
      assert.match(unrelated.body.message, /rule_ids\[0\]: .*scoped to spec "checkout"/);
      const missing = await req('POST', `/v1/experiments/${id}/score`, { rule_ids: [fast.id, 'rule_0000000000000000'] });
      assert.equal(missing.status, 400, missing.text);
      assert.match(missing.body.message, /^rule_ids\[1\]: no score rule rule_0000000000000000/);
      const theirs = await rule({ name: 'theirs', type: 'rescore' }, other);
      const foreign = await req('POST', `/v1/experiments/${id}/score`, { rule_ids: [theirs.id] });
      assert.equal(foreign.status, 403, foreign.text);
      assert.equal(foreign.body.error, 'forbidden');

      const queued = await req('POST', `/v1/experiments/${id}/score`, {});
      assert.equal(queued.status, 202, queued.text);
      assert.deepEqual([queued.body.experiment_id, queued.body.runs, queued.body.status], [id, 2, 'queued']);
      assert.deepEqual(
        queued.body.rule_ids.sort(),
        [again.id, fast.id, states.id].sort(),
        "every rule of the spec and every global rule, not the other spec's",
      );
      assert.match(queued.body.request_id, /^req_/);

      const scores = await until('six score records', async () => {
        const res = await req('GET', `/v1/experiments/${id}/scores`);
        return res.body.count === 6 ? res.body.items : null;
      });
      const byRule = (ruleId: string) => scores.filter((s: any) => s.rule_id === ruleId);
      for (const s of byRule(again.id)) {
        assert.deepEqual([s.rule_type, s.rule_name, s.score, s.passed, s.judge_failure, s.error], ['rescore', 'again', 0.9, true, false, null]);
        assert.deepEqual(s.details, { verdict: 'pass', composite: 0.9, previous_verdict: 'error', previous_composite: null });
        assert.equal(s.request_id, queued.body.request_id);
      }
      for (const s of byRule(fast.id)) {
        assert.deepEqual([s.score, s.passed], [1, true]);
        assert.equal(s.details.metric, 'wall_ms');
        assert.ok(s.details.value > 0);
      }
      for (const s of byRule(states.id)) {
        assert.deepEqual([s.score, s.passed, s.reason, s.details.model], [0.8, true, 'states the answer', 'judge-default']);
      }
      assert.deepEqual(new Set(scores.map((s: any) => s.run_id)), new Set(before.map((r: any) => r.run_id)));

      // The rescore superseded the runs' verdicts.
      await until('the runs to be rescored', async () => ((await runs(id)).every((r: any) => r.verdict === 'pass') ? true : null));

      // /v1/scores filters by rule and pages with a keyset cursor.
      const first = await req('GET', `/v1/scores?experiment_id=${id}&rule_id=${fast.id}&limit=1`);
      assert.equal(first.status, 200, first.text);
      assert.equal(first.body.count, 1);
      assert.ok(first.body.next_cursor);
      const second = await req('GET', `/v1/scores?experiment_id=${id}&rule_id=${fast.id}&limit=1&cursor=${first.body.next_cursor}`);
      assert.equal(second.body.count, 1);
      assert.equal(second.body.next_cursor, undefined);
      assert.notEqual(first.body.items[0].run_id, second.body.items[0].run_id);
      const lines = await server.request('GET', `/v1/experiments/${id}/scores?format=ndjson`, { key });
      assert.equal(lines.text.trim().split('\n').length, 6);

      // Scoring again with the judge down: that rule's records are replaced by judge failures, not zeros.
      judgeState.status = 503;
      const retry = await req('POST', `/v1/experiments/${id}/score`, { rule_ids: [states.id] });
      assert.equal(retry.status, 202, retry.text);
      const failed = await until('the judge failures', async () => {
        const items = (await req('GET', `/v1/scores?experiment_id=${id}&rule_id=${states.id}`)).body.items;
        return items.length === 2 && items.every((s: any) => s.request_id === retry.body.request_id) ? items : null;
      });
      for (const s of failed) {
        assert.deepEqual([s.score, s.passed, s.judge_failure], [null, null, true]);
        assert.match(s.error, /^judge call failed: the judge answered 503/);
      }
      assert.equal((await req('GET', `/v1/experiments/${id}/scores`)).body.count, 6, 'replaced, not added');
      assert.ok(
        (await runs(id)).every((r: any) => r.verdict === 'pass'),
        'no rescore this time: the verdicts stay',
      );
      judgeState.status = 200;

      // Grades that are all 0 are stored as 0 and false, not as missing.
      const instant = await rule({ name: 'instant', type: 'threshold', condition: 'wall_ms < 1' });
      assert.equal((await req('POST', `/v1/experiments/${id}/score`, { rule_ids: [instant.id] })).status, 202);
      const zeros = await until('the failed threshold grades', async () => {
        const items = (await req('GET', `/v1/scores?experiment_id=${id}&rule_id=${instant.id}`)).body.items;
        return items.length === 2 ? items : null;
      });
      for (const s of zeros) assert.deepEqual([s.score, s.passed, s.judge_failure, s.error], [0, false, false, null]);
    });
  }
});
