/**
 * The scorer's rules (scoreRun): invariant scores, weights, gates, thresholds, forbidden rules with
 * their audit records, runs that did not complete, missing checks, and llm_as_judge against a real
 * local HTTP server speaking OpenAI's chat-completions format (pass, fail, 500, timeout, nonsense).
 * Then offline grading of a stored run by score rules (gradeRun).
 */
import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { after, before, beforeEach, describe, test } from 'node:test';
import { stringify } from 'yaml';
import type { RunOutcome, RunScore } from '../../services/domain/events/run-events.ts';
import { parseRunCondition, type ScoreRule, type StoredRun } from '../../services/domain/score-rules.ts';
import { parseSpec, type SpecDocument } from '../../services/domain/spec.ts';
import { createJudge, JudgeFailure, parseGrade, type Judge } from '../../services/scorer/judge.ts';
import { gradeRun } from '../../services/scorer/offline.ts';
import { forbiddenViolations, scoreRun } from '../../services/scorer/score.ts';

type Doc = Record<string, unknown>;

function spec(blocks: Doc): SpecDocument {
  return parseSpec(stringify({ version: 1, id: 'scored', base: 'debian:bookworm', task: { prompt: 'do it' }, ...blocks }));
}

const check = (type: string, passed: boolean | null, extra: Partial<RunOutcome['checks'][string]> = {}) => ({
  type,
  passed,
  score: null,
  message: `${type} ${passed}`,
  ...extra,
});

function outcome(checks: RunOutcome['checks'], overrides: Partial<RunOutcome> = {}): RunOutcome {
  return {
    status: 'completed',
    error: null,
    sandbox_id: 'sb-1',
    started_at: 1_000,
    ended_at: 2_000,
    wall_ms: 1_000,
    agent: { exit_code: 0, timed_out: false, duration_ms: 800, stdout: 'wrote out.txt', stderr: '' },
    checks,
    diff: { added: ['out.txt'], modified: [], removed: [] },
    audit: { file_writes: [], secret_findings: [] },
    ...overrides,
  };
}

/** A judge that must not be called. */
const noJudge: Judge = async () => assert.fail('the judge was called');

const files = (n: number) => Object.fromEntries(Array.from({ length: n }, (_, i) => [`f${i}`, { check: { type: 'file_exists', path: `f${i}.txt` } }]));

describe('composite, gates and thresholds', () => {
  test('composite is the weighted mean of the invariant scores; pass_threshold decides the verdict', async () => {
    const invariants = {
      build: { check: { type: 'command_exit', command: 'make' }, weight: 2 },
      lint: { check: { type: 'command_exit', command: 'lint' }, weight: 1 },
      docs: { check: { type: 'file_exists', path: 'README' } },
    };
    const observed = outcome({ build: check('command_exit', true), lint: check('command_exit', false), docs: check('file_exists', true) });
    const passing = await scoreRun(spec({ invariants, scoring: { pass_threshold: 0.75 } }), observed, noJudge);
    assert.equal(passing.composite, 0.75);
    assert.equal(passing.verdict, 'pass');
    assert.equal(passing.error, null);
    assert.deepEqual(
      passing.invariants.map((i) => [i.name, i.score, i.weight, i.passed]),
      [
        ['build', 1, 2, true],
        ['lint', 0, 1, false],
        ['docs', 1, 1, true],
      ],
    );
    const failing = await scoreRun(spec({ invariants, scoring: { pass_threshold: 0.8 } }), observed, noJudge);
    assert.equal(failing.composite, 0.75);
    assert.equal(failing.verdict, 'fail');
  });

  test('without a scoring block the threshold is 1: one failed invariant fails the run', async () => {
    const score = await scoreRun(spec({ invariants: files(2) }), outcome({ f0: check('file_exists', true), f1: check('file_exists', false) }), noJudge);
    assert.equal(score.composite, 0.5);
    assert.equal(score.verdict, 'fail');
  });

  test("a check's own score counts instead of passed ? 1 : 0 (custom)", async () => {
    const invariants = { custom: { check: { type: 'custom', script: 'print(1)' } }, exists: { check: { type: 'file_exists', path: 'x' } } };
    const partial = outcome({ custom: check('custom', false, { score: 0.6 }), exists: check('file_exists', true) });
    const reached = await scoreRun(spec({ invariants, scoring: { pass_threshold: 0.8 } }), partial, noJudge);
    assert.deepEqual([reached.invariants[0]!.score, reached.invariants[0]!.passed], [0.6, false]);
    assert.equal(reached.composite, 0.8);
    assert.equal(reached.verdict, 'pass');
    const missed = await scoreRun(spec({ invariants, scoring: { pass_threshold: 0.9 } }), partial, noJudge);
    assert.equal(missed.composite, 0.8);
    assert.equal(missed.verdict, 'fail');
  });

  test('partial scores count as they are: under the default threshold of 1.0 they fail the run, under a lower one they pass', async () => {
    const invariants = { custom: { check: { type: 'custom', script: 'print(1)' } }, exists: { check: { type: 'file_exists', path: 'x' } } };
    const observed = outcome({ custom: check('custom', true, { score: 0.6 }), exists: check('file_exists', true) });
    const strict = await scoreRun(spec({ invariants }), observed, noJudge);
    assert.equal(strict.composite, 0.8);
    assert.equal(strict.verdict, 'fail');
    assert.equal((await scoreRun(spec({ invariants, scoring: { pass_threshold: 0.8 } }), observed, noJudge)).verdict, 'pass');
  });

  test('weights that do not add up exactly in floating point still reach a threshold of 1', async () => {
    const invariants = { a: { check: { type: 'file_exists', path: 'a' }, weight: 0.1 }, b: { check: { type: 'file_exists', path: 'b' }, weight: 0.2 } };
    const score = await scoreRun(spec({ invariants }), outcome({ a: check('file_exists', true), b: check('file_exists', true) }), noJudge);
    assert.equal(score.composite, 1);
    assert.equal(score.verdict, 'pass');
  });

  test('a failed gate forces the composite to 0 and fails the run, even at pass_threshold 0', async () => {
    const invariants = { safe: { check: { type: 'command_exit', command: 'check' }, gate: true, weight: 1 }, ...files(3) };
    const observed = outcome({
      safe: check('command_exit', false),
      f0: check('file_exists', true),
      f1: check('file_exists', true),
      f2: check('file_exists', true),
    });
    const strict = await scoreRun(spec({ invariants, scoring: { pass_threshold: 0.5 } }), observed, noJudge);
    assert.equal(strict.composite, 0);
    assert.equal(strict.verdict, 'fail');
    const lenient = await scoreRun(spec({ invariants, scoring: { pass_threshold: 0 } }), observed, noJudge);
    assert.equal(lenient.composite, 0);
    assert.equal(lenient.verdict, 'fail');
    // A gate that passes changes nothing.
    const passed = await scoreRun(
      spec({ invariants, scoring: { pass_threshold: 0.5 } }),
      outcome({ ...observed.checks, safe: check('command_exit', true) }),
      noJudge,
    );
    assert.equal(passed.composite, 1);
    assert.equal(passed.verdict, 'pass');
  });

  test('a check the runner reported nothing for counts as failed, with a message', async () => {
    const score = await scoreRun(spec({ invariants: files(2), scoring: { pass_threshold: 0.5 } }), outcome({ f0: check('file_exists', true) }), noJudge);
    const missing = score.invariants.find((i) => i.name === 'f1')!;
    assert.equal(missing.passed, false);
    assert.equal(missing.score, 0);
    assert.match(missing.message, /no result/);
    assert.equal(score.composite, 0.5);
    assert.equal(score.verdict, 'pass');
  });
});

describe('runs that did not complete', () => {
  for (const status of ['boot_failed', 'agent_timeout', 'error'] as const) {
    test(`${status}: verdict error, composite null, the runner's error, no invariant graded`, async () => {
      const invariants = { quality: { check: { type: 'llm_as_judge', rubric: 'good?', threshold: 0.5 } }, ...files(1) };
      const score = await scoreRun(spec({ invariants }), outcome({}, { status, error: `it ${status}`, agent: null, diff: null }), noJudge);
      assert.deepEqual(score, { verdict: 'error', composite: null, invariants: [], violations: [], error: `it ${status}` } satisfies RunScore);
    });
  }
});

describe('forbidden rules', () => {
  const audited = { stdout_capture: true, file_system: { watch: ['/'], track: ['writes'] } };
  const writes = (...paths: string[]) => paths.map((path, i) => ({ path, seq: (i + 1) * 10, ts: `2026-01-01T00:00:0${i}.000Z` }));

  test('file_writes_outside: every write outside the prefixes is a violation with its audit record, and fails a run whose invariants all pass', async () => {
    const doc = spec({ audit: audited, forbidden: { file_writes_outside: ['out/', '/workspace/logs'] }, invariants: files(1) });
    const observed = outcome(
      { f0: check('file_exists', true) },
      { audit: { file_writes: writes('out/a.txt', 'elsewhere.txt', 'logs/run.log', 'outside/b', 'out', 'logs2/x', 'out/deep/c'), secret_findings: [] } },
    );
    const score = await scoreRun(doc, observed, noJudge);
    assert.ok(score.invariants.every((i) => i.passed));
    assert.equal(score.composite, 0);
    assert.equal(score.verdict, 'fail');
    assert.deepEqual(
      score.violations.map((v) => [v.rule, v.audit]),
      [
        ['file_writes_outside', { seq: 20, ts: '2026-01-01T00:00:01.000Z', path: 'elsewhere.txt' }],
        ['file_writes_outside', { seq: 40, ts: '2026-01-01T00:00:03.000Z', path: 'outside/b' }],
        ['file_writes_outside', { seq: 60, ts: '2026-01-01T00:00:05.000Z', path: 'logs2/x' }],
      ],
    );
    assert.match(score.violations[0]!.message, /elsewhere\.txt.*out\/, \/workspace\/logs/);
  });

  test('file_writes_outside: "/" and "." allow every write in the workspace; an absolute prefix elsewhere allows none of it', () => {
    const facts = { file_writes: writes('a.txt', 'deep/b.txt'), secret_findings: [] };
    assert.deepEqual(forbiddenViolations({ file_writes_outside: ['/'] }, facts), []);
    assert.deepEqual(forbiddenViolations({ file_writes_outside: ['.'] }, facts), []);
    assert.deepEqual(forbiddenViolations({ file_writes_outside: ['/workspace'] }, facts), []);
    assert.equal(forbiddenViolations({ file_writes_outside: ['/tmp'] }, facts).length, 2);
    // A cheating agent floods the audit past its limits, then writes where it must not: the write is
    // not in the log, so the rule fails on what went unrecorded instead of passing.
    const flooded = { file_writes: [], secret_findings: [], dropped: { file_write: 3, secret_finding: 1 } };
    const unseen = forbiddenViolations({ file_writes_outside: ['/workspace'], secrets_in_logs: 'deny' }, flooded);
    assert.deepEqual(
      unseen.map((v) => v.rule),
      ['file_writes_outside', 'secrets_in_logs'],
    );
    assert.match(unseen[0].message, /3 file writes went unrecorded/);
    assert.deepEqual(forbiddenViolations({}, flooded), [], 'no rule, nothing to fail');
    assert.equal(forbiddenViolations({ file_writes_outside: [] }, facts).length, 2);
    assert.deepEqual(
      forbiddenViolations({ file_writes_outside: ['./deep/'] }, facts).map((v) => v.audit.path),
      ['a.txt'],
    );
  });

  test('secrets_in_logs: each finding is a violation naming the secret (never its value)', async () => {
    const doc = spec({ audit: audited, forbidden: { secrets_in_logs: 'deny', file_writes_outside: ['out'] }, invariants: files(1) });
    const observed = outcome(
      { f0: check('file_exists', true) },
      { audit: { file_writes: [{ path: 'stray.txt', seq: 7, ts: 't7' }], secret_findings: [{ name: 'API_TOKEN', seq: 3, ts: 't3' }] } },
    );
    const score = await scoreRun(doc, observed, noJudge);
    assert.equal(score.verdict, 'fail');
    assert.equal(score.composite, 0);
    assert.deepEqual(
      score.violations.map((v) => [v.rule, v.audit]),
      [
        ['secrets_in_logs', { seq: 3, ts: 't3', secret: 'API_TOKEN' }],
        ['file_writes_outside', { seq: 7, ts: 't7', path: 'stray.txt' }],
      ],
    );
    assert.match(score.violations[0]!.message, /API_TOKEN/);
  });

  test('rules without findings find nothing', async () => {
    const doc = spec({
      audit: { ...audited, http_calls: true, db_writes: true },
      forbidden: { secrets_in_logs: 'deny', http_except: [], db_writes_outside: ['orders'], file_writes_outside: ['out'] },
      invariants: files(1),
    });
    const score = await scoreRun(
      doc,
      outcome({ f0: check('file_exists', true) }, { audit: { file_writes: writes('out/x'), secret_findings: [], http_calls: [], db_writes: [] } }),
      noJudge,
    );
    assert.deepEqual(score.violations, []);
    assert.equal(score.verdict, 'pass');
  });

  describe('db_writes_outside', () => {
    const write = (table: string, seq: number, extra: Partial<NonNullable<RunOutcome['audit']['db_writes']>[number]> = {}) => ({
      service: 'db',
      table,
      operation: 'insert',
      row_count: 2,
      rolled_back: false,
      seq,
      ts: `t${seq}`,
      ...extra,
    });
    const doc = (allowed: string[]) =>
      spec({ services: [{ name: 'db', type: 'postgres' }], audit: { db_writes: true }, forbidden: { db_writes_outside: allowed }, invariants: files(1) });
    const violations = async (allowed: string[], writes: NonNullable<RunOutcome['audit']['db_writes']> | undefined) =>
      (
        await scoreRun(
          doc(allowed),
          outcome({ f0: check('file_exists', true) }, { audit: { file_writes: [], secret_findings: [], http_calls: [], db_writes: writes } }),
          noJudge,
        )
      ).violations;

    test('a committed write to a table not listed is a violation naming it; `orders` names public.orders; rolled-back writes count for nothing', async () => {
      const found = await violations(
        ['orders', 'audit.log'],
        [
          write('orders', 1),
          write('public.orders', 2),
          write('audit.log', 3),
          write('secrets', 4, { operation: 'update', row_count: 1 }),
          write('users', 5, { rolled_back: true }),
        ],
      );
      assert.deepEqual(
        found.map((v) => [v.rule, v.message, v.audit]),
        [
          [
            'db_writes_outside',
            'update of 1 row in secrets (db), not in db_writes_outside (orders, audit.log)',
            { seq: 4, ts: 't4', service: 'db', table: 'secrets' },
          ],
        ],
      );
    });

    test('an empty list forbids every write; an outcome without the records, or with dropped ones, fails the rule rather than pass it', async () => {
      assert.match((await violations([], [write('orders', 1)]))[0]!.message, /empty: no write is allowed/);
      assert.match((await violations(['orders'], undefined))[0]!.message, /recorded no database writes/);
      const dropped = await scoreRun(
        doc(['orders']),
        outcome(
          { f0: check('file_exists', true) },
          { audit: { file_writes: [], secret_findings: [], http_calls: [], db_writes: [], dropped: { db_write: 3 } } },
        ),
        noJudge,
      );
      assert.match(dropped.violations[0]!.message, /3 database writes went unrecorded/);
    });
  });

  describe('http_except', () => {
    const call = (host: string, seq: number, extra: Partial<NonNullable<RunOutcome['audit']['http_calls']>[number]> = {}) => ({
      method: 'GET',
      host,
      path: '/path',
      status: 200,
      seq,
      ts: `t${seq}`,
      ...extra,
    });
    const calls = [
      call('mock-api', 3),
      call('api.evil.test', 5),
      call('files.example.com', 8, { method: 'POST', path: '/upload', port: 443 }),
      call('a.b.example.com', 9, { status: null }),
      call('example.com', 11, { port: 8080 }),
      call('API.Partner.test.', 12),
    ];
    const facts = (http_calls: RunOutcome['audit']['http_calls']) => ({ file_writes: [], secret_findings: [], http_calls });

    test('a call to a host no entry matches is a violation with its record; services, hostnames and globs pass', async () => {
      const doc = spec({
        services: [{ name: 'mock-api', type: 'http_mock' }],
        audit: { http_calls: true },
        forbidden: { http_except: ['mock-api', '*.example.com', 'api.partner.test'] },
        invariants: files(1),
      });
      const score = await scoreRun(doc, outcome({ f0: check('file_exists', true) }, { audit: facts(calls) }), noJudge);
      assert.equal(score.verdict, 'fail');
      assert.equal(score.composite, 0);
      assert.deepEqual(
        score.violations.map((v) => [v.rule, v.message, v.audit]),
        [
          [
            'http_except',
            'HTTP GET api.evil.test/path, not in http_except (mock-api, *.example.com, api.partner.test)',
            { seq: 5, ts: 't5', host: 'api.evil.test', method: 'GET', path: '/path' },
          ],
          [
            'http_except',
            'HTTP GET example.com:8080/path, not in http_except (mock-api, *.example.com, api.partner.test)',
            { seq: 11, ts: 't11', host: 'example.com', method: 'GET', path: '/path' },
          ],
        ],
        'a glob matches subdomains at any depth, not its apex; case and a trailing dot do not matter',
      );
    });

    test('every call allowed: the rule holds', () => {
      assert.deepEqual(
        forbiddenViolations({ http_except: ['mock-api', '*.example.com', 'api.evil.test', 'example.com', 'api.partner.test'] }, facts(calls)),
        [],
      );
      assert.deepEqual(forbiddenViolations({ http_except: [] }, facts([])), [], 'no call, nothing to forbid');
    });

    test('an empty list forbids every call', () => {
      const found = forbiddenViolations({ http_except: [] }, facts(calls));
      assert.deepEqual(
        found.map((v) => v.audit.seq),
        [3, 5, 8, 9, 11, 12],
      );
      assert.equal(found[0]!.message, 'HTTP GET mock-api/path, not in http_except (empty: no HTTP is allowed)');
      assert.equal(found[2]!.message, 'HTTP POST files.example.com/upload, not in http_except (empty: no HTTP is allowed)');
    });

    test('dropped http_call records, or an outcome without the list, fail the rule rather than pass it', () => {
      const flooded = { ...facts([call('mock-api', 2)]), dropped: { http_call: 4 } };
      const unseen = forbiddenViolations({ http_except: ['mock-api'] }, flooded);
      assert.deepEqual(
        unseen.map((v) => [v.rule, v.audit]),
        [['http_except', { seq: 0, ts: '' }]],
      );
      assert.match(unseen[0]!.message, /4 HTTP calls went unrecorded/);
      assert.deepEqual(forbiddenViolations({}, flooded), [], 'no rule, nothing to fail');
      const older = forbiddenViolations({ http_except: ['mock-api'] }, { file_writes: [], secret_findings: [] });
      assert.equal(older.length, 1);
      assert.match(older[0]!.message, /recorded no HTTP calls/);
    });
  });

  test('a run that did not complete still reports the violations its audit shows', async () => {
    const doc = spec({ audit: audited, forbidden: { secrets_in_logs: 'deny' }, invariants: files(1) });
    const score = await scoreRun(
      doc,
      outcome({}, { status: 'agent_timeout', error: 'slow', audit: { file_writes: [], secret_findings: [{ name: 'K', seq: 1, ts: 't' }] } }),
      noJudge,
    );
    assert.equal(score.verdict, 'error');
    assert.equal(score.violations.length, 1);
  });
});

// --- the judge ------------------------------------------------------------------------------

interface Call {
  body: any;
  auth: string | undefined;
  path: string | undefined;
}

/** A local OpenAI-compatible chat-completions server whose next answers the test decides. */
async function judgeServer() {
  const calls: Call[] = [];
  let answer: (res: http.ServerResponse) => void = () => {};
  const server = http.createServer((req, res) => {
    let text = '';
    req.on('data', (d) => (text += d));
    req.on('end', () => {
      calls.push({ body: JSON.parse(text), auth: req.headers.authorization, path: req.url });
      answer(res);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const completion = (content: string) => ({
    id: 'chatcmpl-1',
    object: 'chat.completion',
    model: 'm',
    choices: [{ index: 0, message: { role: 'assistant', content }, finish_reason: 'stop' }],
  });
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`,
    calls,
    says(content: string) {
      answer = (res) => res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(completion(content)));
    },
    grades(score: number, reason = 'fine') {
      this.says(JSON.stringify({ score, reason }));
    },
    fails(status: number, body = '{"error":{"message":"overloaded"}}') {
      answer = (res) => res.writeHead(status, { 'content-type': 'application/json' }).end(body);
    },
    hangs() {
      answer = () => {};
    },
    close: () => {
      server.closeAllConnections();
      return new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

describe('llm_as_judge', () => {
  let server: Awaited<ReturnType<typeof judgeServer>>;
  let judge: Judge;
  const judged = (extra: Doc = {}) =>
    spec({
      invariants: {
        quality: { check: { type: 'llm_as_judge', rubric: 'Is the summary accurate?', input: 'agent_output', threshold: 0.7, ...extra } },
        ...files(1),
      },
      scoring: { pass_threshold: 0.8 },
    });
  const observed = () => outcome({ quality: check('llm_as_judge', null, { judge_input: 'The summary: all tests pass.' }), f0: check('file_exists', true) });

  before(async () => {
    server = await judgeServer();
    judge = createJudge({ judgeUrl: server.url, judgeApiKey: 'judge-secret', judgeModel: 'default-model', judgeTimeout: 500 });
  });
  after(() => server.close());
  beforeEach(() => {
    server.calls.length = 0;
  });

  test('a score at or above the threshold passes; the call is OpenAI chat-completions with the rubric and the input', async () => {
    server.grades(0.7, 'accurate enough');
    const score = await scoreRun(judged(), observed(), judge);
    assert.equal(score.verdict, 'pass');
    assert.equal(score.composite, 0.85);
    const quality = score.invariants.find((i) => i.name === 'quality')!;
    assert.deepEqual([quality.score, quality.passed, quality.judge_failure], [0.7, true, undefined]);
    assert.match(quality.message, /accurate enough/);
    assert.equal(server.calls.length, 1);
    const [call] = server.calls;
    assert.equal(call!.path, '/v1/chat/completions');
    assert.equal(call!.auth, 'Bearer judge-secret');
    assert.equal(call!.body.model, 'default-model');
    assert.equal(call!.body.temperature, 0);
    assert.deepEqual(
      call!.body.messages.map((m: any) => m.role),
      ['system', 'user'],
    );
    assert.match(call!.body.messages[0].content, /"score"/);
    assert.match(call!.body.messages[1].content, /Is the summary accurate\?/);
    assert.match(call!.body.messages[1].content, /The summary: all tests pass\./);
  });

  test("the check's model wins over the server's", async () => {
    server.grades(1);
    await scoreRun(judged({ model: 'gpt-special' }), observed(), judge);
    assert.equal(server.calls[0]!.body.model, 'gpt-special');
  });

  test('a score below the threshold fails the invariant: a 0.2 is a grade, not a judge failure', async () => {
    server.grades(0.2, 'inaccurate');
    const score = await scoreRun(judged(), observed(), judge);
    assert.equal(score.verdict, 'fail');
    assert.equal(score.error, null);
    const quality = score.invariants.find((i) => i.name === 'quality')!;
    assert.deepEqual([quality.score, quality.passed, quality.judge_failure], [0.2, false, undefined]);
    assert.equal(score.composite, 0.6);
  });

  test('an answer in a code fence, or with prose around it, is read', async () => {
    server.says('```json\n{"score": 0.9, "reason": "ok"}\n```');
    assert.equal((await scoreRun(judged(), observed(), judge)).invariants[0]!.score, 0.9);
    server.says('Here is my grade: {"score": 0.8, "reason": "ok"} Hope that helps.');
    assert.equal((await scoreRun(judged(), observed(), judge)).invariants[0]!.score, 0.8);
  });

  const failures: Array<[string, () => void, RegExp]> = [
    ['a 500', () => server.fails(500), /judge answered 500.*overloaded/],
    ['a timeout', () => server.hangs(), /no answer from the judge within 500 ms/],
    ['an unparseable answer', () => server.says('I think it is pretty good!'), /not \{"score": <0\.\.1>/],
    ['a score outside [0, 1]', () => server.grades(7), /not \{"score": <0\.\.1>/],
    ['a response that is not chat-completions JSON', () => server.fails(200, '<html>gateway</html>'), /not chat-completions JSON/],
  ];
  for (const [what, arrange, message] of failures) {
    test(`${what} is a judge call failure: score null, judge_failure, verdict error — not a 0`, async () => {
      arrange();
      const score = await scoreRun(judged(), observed(), judge);
      assert.equal(score.verdict, 'error');
      assert.equal(score.composite, null);
      assert.match(score.error!, /^judge call failed: /);
      assert.match(score.error!, message);
      assert.match(score.error!, /invariant quality/);
      const quality = score.invariants.find((i) => i.name === 'quality')!;
      assert.deepEqual([quality.score, quality.passed, quality.judge_failure], [null, false, true]);
      // The other invariants are still graded.
      assert.equal(score.invariants.find((i) => i.name === 'f0')!.score, 1);
    });
  }

  test('a judge that cannot be reached, or none configured, is a judge call failure', async () => {
    const closed = await judgeServer();
    await closed.close();
    const unreachable = await scoreRun(judged(), observed(), createJudge({ judgeUrl: closed.url, judgeApiKey: null, judgeModel: 'm', judgeTimeout: 1000 }));
    assert.equal(unreachable.verdict, 'error');
    assert.match(unreachable.error!, /^judge call failed: the judge cannot be reached: ECONNREFUSED/);
    const none = await scoreRun(judged(), observed(), createJudge({ judgeUrl: null, judgeApiKey: null, judgeModel: 'm', judgeTimeout: 1000 }));
    assert.equal(none.verdict, 'error');
    assert.match(none.error!, /no judge is configured \(set SVC_JUDGE_URL/);
  });

  test('no Authorization header without SVC_JUDGE_API_KEY', async () => {
    server.grades(1);
    await scoreRun(judged(), observed(), createJudge({ judgeUrl: server.url, judgeApiKey: null, judgeModel: 'm', judgeTimeout: 1000 }));
    assert.equal(server.calls[0]!.auth, undefined);
  });
});

test('parseGrade refuses what is not a grade', () => {
  assert.deepEqual(parseGrade('{"score": 1}'), { score: 1, reason: '' });
  for (const bad of ['', 'null', '[0.5]', '{"score": "0.5"}', '{"score": -0.1}', '{"reason": "x"}']) assert.throws(() => parseGrade(bad), JudgeFailure, bad);
});

// --- offline grading of stored runs ---------------------------------------------------------

describe('score rules on a stored run', () => {
  const rule = (id: string, fields: Doc): ScoreRule => ({ id, name: id, eval_id: null, created_at: '2026-01-01T00:00:00.000Z', ...fields }) as ScoreRule;
  const doc = spec({
    invariants: { quality: { check: { type: 'llm_as_judge', rubric: 'good?', threshold: 0.5 } }, ...files(1) },
    scoring: { pass_threshold: 0.9 },
  });
  const stored = (o: RunOutcome, overrides: Partial<StoredRun> = {}): StoredRun => ({
    run_id: 'run-1-1-1',
    scenario_id: 'scn-1-1',
    scenario_index: 0,
    replica: 1,
    attempt: 1,
    params: '{}',
    seed: 1,
    sandbox_id: 'sb-1',
    agent_snapshot_id: null,
    verdict: 'error',
    composite: null,
    invariants: '[]',
    violations: '[{"rule":"secrets_in_logs"}]',
    error: 'judge call failed: the judge answered 503',
    wall_ms: 1_000,
    outcome: JSON.stringify(o),
    traces: { cost_usd: 0.12, input_tokens: 100, output_tokens: 50, cache_read_tokens: 0, reasoning_tokens: 0, llm_calls: 2, tool_calls: 5, tool_errors: 1 },
    ...overrides,
  });
  const judgedOutcome = outcome({ quality: check('llm_as_judge', null, { judge_input: 'the output' }), f0: check('file_exists', true) });

  test('threshold rules test a run metric: 1 when the condition holds, 0 when not, ungraded when the run has no such metric', async () => {
    const rules = [
      rule('rule_wall', { type: 'threshold', condition: 'wall_ms < 5000' }),
      rule('rule_cost', { type: 'threshold', condition: 'cost_usd <= 0.1' }),
      rule('rule_tools', { type: 'threshold', condition: 'tool_errors == 1' }),
      rule('rule_violations', { type: 'threshold', condition: 'violations == 0' }),
      rule('rule_composite', { type: 'threshold', condition: 'composite >= 0.5' }),
      rule('rule_files', { type: 'threshold', condition: 'files_changed > 0' }),
    ];
    const { grades, rescored } = await gradeRun(rules, stored(judgedOutcome), doc, noJudge);
    assert.equal(rescored, null);
    assert.deepEqual(
      grades.map((g) => [g.rule_id, g.score, g.passed]),
      [
        ['rule_wall', 1, true],
        ['rule_cost', 0, false],
        ['rule_tools', 1, true],
        ['rule_violations', 0, false],
        ['rule_composite', null, null],
        ['rule_files', 1, true],
      ],
    );
    assert.deepEqual(JSON.parse(grades[1]!.details), { condition: 'cost_usd <= 0.1', metric: 'cost_usd', value: 0.12 });
    assert.match(grades[4]!.error!, /no composite \(verdict error/);
    assert.match(grades[0]!.reason, /wall_ms is 1000: "wall_ms < 5000" holds/);
  });

  test('llm_as_judge rules grade the stored agent output or diff; a judge failure is recorded as one', async () => {
    const seen: string[] = [];
    const judge: Judge = async ({ input, rubric }) => {
      seen.push(`${rubric}|${input}`);
      if (rubric === 'broken') throw new JudgeFailure('the judge answered 502: ""');
      return { score: 0.4, reason: 'meh', model: 'm1' };
    };
    const rules = [
      rule('rule_out', { type: 'llm_as_judge', rubric: 'concise?', input: 'agent_output', threshold: 0.3 }),
      rule('rule_diff', { type: 'llm_as_judge', rubric: 'minimal?', input: 'diff', threshold: 0.5 }),
      rule('rule_broken', { type: 'llm_as_judge', rubric: 'broken', input: 'agent_output', threshold: 0.5 }),
    ];
    const { grades } = await gradeRun(rules, stored(judgedOutcome), doc, judge);
    assert.deepEqual(seen.sort(), ['broken|wrote out.txt', 'concise?|wrote out.txt', 'minimal?|{"added":["out.txt"],"modified":[],"removed":[]}']);
    assert.deepEqual(
      grades.map((g) => [g.rule_id, g.score, g.passed, g.judge_failure]),
      [
        ['rule_out', 0.4, true, false],
        ['rule_diff', 0.4, false, false],
        ['rule_broken', null, null, true],
      ],
    );
    assert.match(grades[2]!.error!, /^judge call failed: the judge answered 502/);
    assert.deepEqual(JSON.parse(grades[0]!.details), { input: 'agent_output', threshold: 0.3, model: 'm1' });
    // A run whose agent never ran has nothing to judge.
    const booted = await gradeRun([rules[0]!], stored(outcome({}, { status: 'boot_failed', error: 'no image', agent: null, diff: null })), doc, judge);
    assert.match(booted.grades[0]!.error!, /no agent output to judge \(it ended boot_failed\)/);
  });

  test("rescore applies the spec's scoring again to the stored checks: a run in error after a judge outage gets its verdict", async () => {
    const { grades, rescored } = await gradeRun([rule('rule_again', { type: 'rescore' })], stored(judgedOutcome), doc, async () => ({
      score: 0.9,
      reason: 'good',
      model: 'm',
    }));
    assert.equal(rescored!.verdict, 'pass');
    assert.equal(rescored!.composite, 0.95);
    assert.deepEqual([grades[0]!.score, grades[0]!.passed, grades[0]!.reason], [0.95, true, 'verdict error -> pass']);
    assert.deepEqual(JSON.parse(grades[0]!.details), { verdict: 'pass', composite: 0.95, previous_verdict: 'error', previous_composite: null });
    // Without a spec, the rule says why it could not grade.
    const orphan = await gradeRun([rule('rule_again', { type: 'rescore' })], stored(judgedOutcome), { error: 'no pinned spec' }, noJudge);
    assert.deepEqual([orphan.rescored, orphan.grades[0]!.score, orphan.grades[0]!.error], [null, null, 'no pinned spec']);
  });

  test('a stored outcome that cannot be read leaves every rule ungraded, saying so', async () => {
    const { grades } = await gradeRun(
      [rule('rule_wall', { type: 'threshold', condition: 'wall_ms < 1' })],
      stored(judgedOutcome, { outcome: '{not json' }),
      doc,
      noJudge,
    );
    assert.equal(grades[0]!.score, null);
    assert.match(grades[0]!.error!, /stored outcome cannot be read/);
  });

  test('conditions name a run metric and an operator', () => {
    assert.deepEqual(parseRunCondition(' wall_ms>=10.5 '), { text: 'wall_ms>=10.5', metric: 'wall_ms', operator: '>=', value: 10.5 });
    assert.throws(() => parseRunCondition('speed > 3'), /unknown metric "speed"/);
    assert.throws(() => parseRunCondition('wall_ms ~ 3'), /<metric> <operator> <number>/);
  });
});
