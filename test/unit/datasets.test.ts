/**
 * The pure parts of datasets (docs/datasets.md): record templates in a run's spec (one pass with
 * `{{ params }}`, paths, filters, missing values), the environment a record gives (never its
 * expected answer), where `{{ expected }}` may stand, the scenarios an experiment makes of records
 * and matrix entries, versions and record sizes, and the parsing of add bodies and tag filters.
 */
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parseRecords, parseTagsFilter } from '../../services/api/datasets/dataset-request.ts';
import { datasetScenarios, datasetView, nextVersion, recordBytes, recordsAt, scenarioCount } from '../../services/domain/datasets.ts';
import type { DatasetChanged } from '../../services/domain/events/dataset-events.ts';
import {
  applyParams,
  matrixPart,
  paramsEnv,
  RECORD_PARAM,
  recordReferences,
  recordTemplateProblems,
  renderRecordValue,
  scenarioRecord,
  type ScenarioRecord,
  withRecord,
} from '../../services/domain/params.ts';
import { specForRun } from '../../services/domain/run-plan.ts';
import { AppError } from '../../services/kernel/errors.ts';

const record: ScenarioRecord = {
  dataset_id: 'ds_0123456789abcdef',
  id: 'rec_00000000000000aa',
  version: 2,
  input: { question: 'What is 2 + 2?', items: [{ name: 'first' }, 'second'], count: 3, flag: false, nothing: null, quote: "it's" },
  expected: { answer: '4' },
  tags: ['math'],
};
const params = withRecord({ lang: 'py' }, record);

test('record templates are replaced with the record, in the same pass as params', () => {
  assert.equal(applyParams('Q: {{ input.question }} ({{ params.lang }})', params), 'Q: What is 2 + 2? (py)');
  assert.equal(applyParams('{{input.items.0.name}}/{{ input.items.1 }}/{{ input.count }}/{{ input.flag }}', params), 'first/second/3/false');
  assert.equal(applyParams('[{{ input.nothing }}][{{ input.missing.deeper }}][{{ input.items.9 }}]', params), '[][][]', 'null and missing render as nothing');
  assert.equal(applyParams('{{ input.items }}', params), '[{"name":"first"},"second"]', 'other JSON values as JSON');
  assert.equal(applyParams('{{ expected }}', params), '{"answer":"4"}');
  assert.equal(applyParams('{{ expected.answer | json }} {{ input.missing | json }}', params), '"4" null');
  assert.equal(applyParams('echo {{ input.quote | shell }}', params), `echo 'it'\\''s'`);
  // A value is never scanned again: a record holding a template stays as it is.
  const tricky = withRecord({ p: '{{ input.question }}' }, { ...record, input: '{{ params.p }}' });
  assert.equal(applyParams('{{ params.p }} {{ input }}', tricky), '{{ input.question }} {{ params.p }}');
  // Without a record (a matrix alone), record templates stay as written; so do unknown filters.
  assert.equal(applyParams('{{ input.question }}', { lang: 'py' }), '{{ input.question }}');
  assert.equal(applyParams('{{ input | upper }}', params), '{{ input | upper }}');
  assert.equal(applyParams(`{{ params.${RECORD_PARAM} }}`, params), `{{ params.${RECORD_PARAM} }}`, 'the record is no parameter');
  assert.equal(renderRecordValue(undefined, 'shell'), "''");
});

test('a record reaches the environment as SVC_INPUT, SVC_RECORD_ID and SVC_DATASET_ID, never its expected answer', () => {
  const env = paramsEnv(params);
  assert.deepEqual(env, { SVC_PARAM_LANG: 'py', SVC_INPUT: JSON.stringify(record.input), SVC_RECORD_ID: record.id, SVC_DATASET_ID: record.dataset_id });
  assert.ok(!Object.values(env).some((v) => v.includes('"answer"')));
  assert.deepEqual(paramsEnv({ lang: 'go' }), { SVC_PARAM_LANG: 'go' });
  assert.deepEqual(scenarioRecord(params), record);
  assert.equal(scenarioRecord({ lang: 'py' }), null);
  assert.deepEqual(matrixPart(params), { lang: 'py' });
});

test('{{ expected }} stands only in invariants and grader files; malformed templates and unknown filters are named', () => {
  assert.deepEqual(recordTemplateProblems('invariants.ok.check.command', 'test {{ expected.answer | shell }} = x'), []);
  assert.deepEqual(recordTemplateProblems('grader.files[0].content', '{{ expected | json }}'), []);
  assert.deepEqual(recordTemplateProblems('task.prompt', '{{ input.q }} {{ params.x }} {{ path.id }} {{ inputs }}'), [], 'others are not record templates');
  assert.deepEqual(recordTemplateProblems('task.prompt', 'cheat: {{ expected.answer }}'), [
    '{{ expected.answer }}: the expected answer may be named only in invariants and grader files, which the agent never sees',
  ]);
  assert.deepEqual(recordTemplateProblems('setup.env.X', '{{expected}}').length, 1);
  assert.deepEqual(recordTemplateProblems('task.prompt', '{{ input | upper }}'), ['{{ input | upper }}: unknown filter "upper"; one of json, shell']);
  assert.match(recordTemplateProblems('task.prompt', 'x {{ input. }} y')[0], /^\{\{ input\. \}\}: not a record template/);
  assert.deepEqual(
    recordReferences({ task: { prompt: 'plain' }, invariants: { a: { check: { command: 'test {{ expected }}' } } }, setup: { env: { A: '{{ input.a }}' } } }),
    ['invariants.a.check.command', 'setup.env.A'],
  );
});

test("a run's spec has its record's values in every string", () => {
  const yaml = `version: 1
id: t
base: debian:bookworm
task: {prompt: "Answer {{ input.question }}"}
setup: {env: {ITEM: "{{ input.items.0.name }}"}}
invariants:
  answer: {check: {type: file_content, path: out.txt, contains: "{{ expected.answer }}"}}
  judge: {check: {type: llm_as_judge, rubric: "Does it say {{ expected.answer }}?", threshold: 0.5}}
`;
  const spec = specForRun(yaml, params);
  assert.equal(spec.task.prompt, 'Answer What is 2 + 2?');
  assert.equal(spec.setup.env.ITEM, 'first');
  assert.deepEqual(spec.invariants.answer.check, { type: 'file_content', path: 'out.txt', contains: '4' });
  assert.equal((spec.invariants.judge.check as { rubric: string }).rubric, 'Does it say 4?');
  // A record's text is only text, templates and all (a dataset of Vue or Jinja code, say).
  const templated = withRecord({}, { ...record, input: { question: 'Render {{ expected.answer }} and {{ params.missing }} and {{ input | upper }}' } });
  assert.equal(specForRun(yaml, templated).task.prompt, 'Answer Render {{ expected.answer }} and {{ params.missing }} and {{ input | upper }}');
});

test('scenarios: each record with each matrix entry, record-major, numbered on from the page', () => {
  const records = ['a', 'b'].map((id) => ({ ...record, id }));
  const scenarios = datasetScenarios(records, [{ lang: 'py' }, { lang: 'go' }], 3);
  assert.deepEqual(
    scenarios.map((s) => [s.index, s.params.lang, scenarioRecord(s.params)!.id]),
    [
      [6, 'py', 'a'],
      [7, 'go', 'a'],
      [8, 'py', 'b'],
      [9, 'go', 'b'],
    ],
  );
  assert.equal(scenarioCount(2, { records: 5 }), 10);
  assert.equal(scenarioCount(3, undefined), 3);
});

test('versions: an add is one more version holding every earlier record', () => {
  const d: DatasetChanged = {
    tenant: 'acme',
    event_id: 'e',
    ts: 1,
    dataset_id: 'ds_0123456789abcdef',
    name: 'qa',
    description: null,
    version: 1,
    versions: [{ version: 1, records: 0, added: 0, created_at: 1000, add_id: 'a' }],
    created_at: 1000,
    deleted: false,
  };
  const v2 = nextVersion(d, 3, 'b', 2000);
  assert.deepEqual(v2, { version: 2, records: 3, added: 3, created_at: 2000, add_id: 'b' });
  const after = { ...d, version: 2, versions: [...d.versions, v2] };
  assert.deepEqual(nextVersion(after, 2, 'c', 3000), { version: 3, records: 5, added: 2, created_at: 3000, add_id: 'c' });
  assert.deepEqual([recordsAt(after, 1), recordsAt(after, 2), recordsAt(after, 7)], [0, 3, 0]);
  assert.deepEqual(datasetView(after), {
    id: d.dataset_id,
    user_id: 'acme',
    name: 'qa',
    description: '',
    version: 2,
    records: 3,
    created_at: new Date(1000).toISOString(),
    updated_at: new Date(2000).toISOString(),
  });
});

test('an add body: records bare or wrapped, every problem named, sizes counted over input, expected, metadata and tags', () => {
  const config = { datasetRecordBytes: 100, datasetMaxRecords: 3 };
  assert.deepEqual(parseRecords([{ input: 1 }], config), [{ input: 1, tags: [] }]);
  assert.deepEqual(parseRecords({ records: [{ input: 'x', expected: null, tags: ['a'] }] }, config), [{ input: 'x', expected: null, tags: ['a'] }]);
  const problems = (body: unknown) => {
    try {
      parseRecords(body, config);
    } catch (err) {
      assert.ok(err instanceof AppError && err.status === 400);
      return err.message;
    }
    assert.fail('no 400');
  };
  assert.equal(
    problems([{ input: 1 }, { tags: ['a,b'] }]),
    'records[1].input: is required: any JSON value but null; records[1].tags[0]: must be a tag of 1 to 100 characters without commas, control characters or spaces at either end',
  );
  assert.match(
    problems([{ input: 'x'.repeat(60), metadata: 'y'.repeat(30) }]),
    /^records\[0\]: is 1\d\d bytes, over the record size limit of 100 bytes \(SVC_DATASET_RECORD_BYTES\)$/,
  );
  assert.match(
    problems([{ input: 1 }, { input: 2 }, { input: 3 }, { input: 4 }]),
    /^records: has 4 records, more than a dataset may hold \(3, SVC_DATASET_MAX_RECORDS\)$/,
  );
  assert.equal(recordBytes({ input: 'ab', tags: [] }), JSON.stringify({ input: 'ab', tags: [] }).length);
  assert.deepEqual(parseTagsFilter('a, b ,,c'), ['a', 'b', 'c']);
  assert.equal(parseTagsFilter(undefined), null);
  assert.throws(() => parseTagsFilter(' , '), /tags: must name at least one tag/);
});
