/**
 * Datasets over HTTP against the real service (docs/datasets.md): every endpoint, every bad input
 * naming its field, the four limits (set small by settings) naming their setting, versions (each
 * add one more, old versions readable) and the tags filter, tenancy (another tenant's ds_ id is a
 * 403, names are each tenant's own), Idempotency-Key on both POSTs, pagination and NDJSON; then
 * experiments over a dataset: the dataset pinned at creation, the scenarios listed before they
 * run, and, on the local runtime, 3 records x 2 replicas whose agent sees the input (template and
 * SVC_INPUT) and never the expected answer, which the invariants and a grader file see; a failing
 * record's reproducer, run, runs that record of that version again.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { after, before, beforeEach, describe, test } from 'node:test';
import { backend } from '../helpers/backend.ts';
import { createTenantKey, startServer, type TestServer } from '../helpers/server.ts';

/** A request whose answer must never come: the process dies first. */
function diesWithTheProcess(request: Promise<{ status: number }>): Promise<string> {
  return request.then(
    (res) => assert.fail(`the first try was answered (${res.status}) instead of dying with the process`),
    () => 'connection lost',
  );
}

const LIMITS = { records: 20, versions: 5, bytes: 2048, datasets: 4 };

describe('datasets', () => {
  let server: TestServer;
  /** Each test's own tenant (the per-tenant limit is small), and another one. */
  let key: string;
  let tenant: string;
  let tenants = 0;
  let other: string;
  let limited: string;
  const req = (method: string, path: string, body?: unknown, k = key, headers?: Record<string, string>) =>
    server.request(method, path, { key: k, ...(body !== undefined && { body }), ...(headers && { headers }) });
  const create = async (name: string, k = key, description?: string) => {
    const res = await req('POST', '/v1/datasets', { name, ...(description !== undefined && { description }) }, k);
    assert.equal(res.status, 201, res.text);
    return res.body;
  };
  const add = async (id: string, records: unknown, k = key) => {
    const res = await req('POST', `/v1/datasets/${id}/records`, records, k);
    assert.equal(res.status, 201, res.text);
    return res.body;
  };
  const read = async (id: string, query = '', k = key) => {
    const res = await req('GET', `/v1/datasets/${id}/records${query}`, undefined, k);
    assert.equal(res.status, 200, res.text);
    return res;
  };
  /** A 400 (or another status) whose message names each field as `field:`. */
  const bad = async (method: string, path: string, body: unknown, fields: string[], status = 400) => {
    const res = await req(method, path, body);
    assert.equal(res.status, status, res.text);
    assert.deepEqual(Object.keys(res.body).sort(), ['error', 'message']);
    for (const field of fields) assert.ok(res.body.message.includes(field), `expected "${field}" in ${res.body.message}`);
    return res.body.message as string;
  };
  const putSpec = async (yaml: string, k = key) =>
    server.request('POST', '/v1/specs', { key: k, body: yaml, headers: { 'content-type': 'application/x-yaml' } });

  before(async () => {
    server = await startServer({
      SVC_RATE_LIMIT_WRITES: '0',
      SVC_RATE_LIMIT_READS: '0',
      SVC_SANDBOX_HOST_ROOTFS: 'true',
      SVC_DATASET_MAX_RECORDS: String(LIMITS.records),
      SVC_DATASET_MAX_VERSIONS: String(LIMITS.versions),
      SVC_DATASET_RECORD_BYTES: String(LIMITS.bytes),
      SVC_DATASETS_PER_TENANT: String(LIMITS.datasets),
    });
    other = (await createTenantKey(server, 'globex')).key;
    limited = (await createTenantKey(server, 'initech')).key;
  });
  after(() => server.cleanup());
  beforeEach(async () => {
    tenant = `acme-${++tenants}`;
    key = (await createTenantKey(server, tenant)).key;
  });

  test('a dataset is created at version 1, read, listed, and deleted with its records', async () => {
    const made = await create('support-tickets', key, 'tickets with their right answer');
    assert.match(made.id, /^ds_[0-9a-f]{16}$/);
    assert.deepEqual(
      { ...made, id: undefined, created_at: undefined, updated_at: undefined },
      {
        id: undefined,
        created_at: undefined,
        updated_at: undefined,
        user_id: tenant,
        name: 'support-tickets',
        description: 'tickets with their right answer',
        version: 1,
        records: 0,
      },
    );
    assert.ok(!Number.isNaN(Date.parse(made.created_at)));
    const detail = (await req('GET', `/v1/datasets/${made.id}`)).body;
    assert.deepEqual(detail.versions, [{ version: 1, records: 0, added: 0, created_at: made.created_at }]);
    assert.equal((await create('no-description')).description, '');
    const list = (await req('GET', '/v1/datasets')).body;
    assert.deepEqual(
      list.items.map((d: any) => d.name),
      ['no-description', 'support-tickets'],
      'by name',
    );
    assert.equal(list.count, 2);
    assert.equal(list.items[1].versions, undefined, 'the list leaves the versions out');
    assert.deepEqual(
      (await req('GET', '/v1/datasets?name=support-tickets')).body.items.map((d: any) => d.id),
      [made.id],
    );
    const first = (await req('GET', '/v1/datasets?limit=1')).body;
    assert.equal(first.count, 1);
    const second = (await req('GET', `/v1/datasets?limit=1&cursor=${first.next_cursor}`)).body;
    assert.deepEqual([first.items[0].name, second.items[0].name, second.next_cursor], ['no-description', 'support-tickets', undefined]);
    assert.deepEqual((await read(made.id)).body, { items: [], count: 0 }, 'version 1 has no records');

    await add(made.id, [{ input: { ticket: 'refund please' }, expected: { route: 'billing' } }]);
    const deleted = await req('DELETE', `/v1/datasets/${made.id}`);
    assert.equal(deleted.status, 200, deleted.text);
    assert.deepEqual(deleted.body, { id: made.id, deleted: true });
    for (const path of [`/v1/datasets/${made.id}`, `/v1/datasets/${made.id}/records`]) {
      const gone = await req('GET', path);
      assert.equal(gone.status, 404, gone.text);
      assert.equal(gone.body.error, 'not_found');
    }
    assert.equal((await req('DELETE', `/v1/datasets/${made.id}`)).status, 404);
    assert.equal((await req('POST', `/v1/datasets/${made.id}/records`, [{ input: 1 }])).status, 404);
    assert.deepEqual(
      (await req('GET', '/v1/datasets')).body.items.map((d: any) => d.name),
      ['no-description'],
    );
    // Its records are gone from the store too: only the deletion markers hold their places.
    const sql = await server.request(
      'GET',
      `/v1/admin/sql/?query=${encodeURIComponent(`SELECT Deleted, Input FROM dataset_records FINAL WHERE DatasetId = '${made.id}' FORMAT JSONEachRow`)}`,
    );
    assert.equal(sql.status, 200, sql.text);
    assert.deepEqual(
      sql.text
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l)),
      [{ Deleted: 1, Input: '' }],
    );
    // The name is free again.
    assert.notEqual((await create('support-tickets')).id, made.id);
  });

  test('bad bodies and queries are 400s naming the field, and store nothing', async () => {
    await bad('POST', '/v1/datasets', {}, ['name: is required']);
    await bad('POST', '/v1/datasets', { name: '' }, ['name: is required']);
    await bad('POST', '/v1/datasets', { name: ' padded ' }, ['name: must be 1 to 200 characters']);
    await bad('POST', '/v1/datasets', { name: 'x'.repeat(201) }, ['name: must be 1 to 200 characters']);
    await bad('POST', '/v1/datasets', { name: 'ok', description: 3, owner: 'me' }, ['description: must be a string', 'owner: unknown field']);
    await bad('POST', '/v1/datasets', [{ name: 'ok' }], ['body: must be a JSON object']);
    const malformed = await server.request('POST', '/v1/datasets', { key, body: '{"name": ', headers: { 'content-type': 'application/json' } });
    assert.equal(malformed.status, 400, malformed.text);

    const { id } = await create('bad-input');
    const path = `/v1/datasets/${id}/records`;
    await bad('POST', path, [], ['records: is required']);
    await bad('POST', path, { records: 5 }, ['records: is required']);
    await bad('POST', path, { rows: [] }, ['rows: unknown field']);
    await bad('POST', path, [{ expected: 1 }], ['records[0].input: is required']);
    await bad('POST', path, [{ input: 'ok' }, { input: null }], ['records[1].input: is required']);
    await bad('POST', path, [{ input: 1, answer: 2 }], ['records[0].answer: unknown field']);
    await bad('POST', path, [{ input: 1, tags: 'a' }], ['records[0].tags: must be a list']);
    await bad('POST', path, [{ input: 1, tags: ['a,b', ''] }], ['records[0].tags[0]: must be a tag', 'records[0].tags[1]: must be a tag']);
    await bad('POST', path, [{ input: 1, tags: ['a', 'a'] }], ['records[0].tags: lists a tag twice']);
    await bad('POST', path, ['text'], ['records[0]: must be an object']);
    const big = await bad('POST', path, [{ input: 'small' }, { input: 'x'.repeat(LIMITS.bytes) }], ['records[1]: is']);
    assert.match(big, new RegExp(`over the record size limit of ${LIMITS.bytes} bytes \\(SVC_DATASET_RECORD_BYTES\\)`));
    // The limit counts expected and metadata too.
    await bad(
      'POST',
      path,
      [{ input: 'a', expected: 'y'.repeat(LIMITS.bytes / 2), metadata: 'z'.repeat(LIMITS.bytes / 2) }],
      ['records[0]: is', 'SVC_DATASET_RECORD_BYTES'],
    );
    const many = Array.from({ length: LIMITS.records + 1 }, (_, i) => ({ input: i }));
    await bad('POST', path, many, [`records: has ${LIMITS.records + 1} records`, 'SVC_DATASET_MAX_RECORDS']);
    const detail = (await req('GET', `/v1/datasets/${id}`)).body;
    assert.equal(detail.version, 1, 'no bad add made a version');

    await bad('GET', `${path}?version=0`, undefined, ['version: must be a positive integer']);
    await bad('GET', `${path}?version=two`, undefined, ['version: must be a positive integer']);
    await bad('GET', `${path}?tags=`, undefined, ['tags: must name at least one tag']);
    await bad('GET', `${path}?tag=a`, undefined, ['tag: unknown query parameter']);
    await bad('GET', `${path}?cursor=nope`, undefined, ['cursor: is not a cursor']);
    await bad('GET', `${path}?limit=0`, undefined, ['limit: must be a positive integer']);
    await bad('GET', `${path}?limit=100000`, undefined, ['limit: must be at most']);
    await bad('GET', `${path}?version=7`, undefined, [`dataset ${id} has no version 7 (its newest is 1)`], 404);
    await bad('GET', '/v1/datasets/ds_0000000000000000', undefined, ['dataset ds_0000000000000000 not found'], 404);
  });

  test('each add is a version; a version reads every record added up to it; tags filter any-of', async () => {
    const { id } = await create('versions');
    const v2 = await add(id, [
      { input: { q: 'one' }, expected: { a: 1 }, tags: ['easy'] },
      { input: { q: 'two' }, expected: { a: 2 }, metadata: { source: 'ticket 42' }, tags: ['hard'] },
      { input: 'three', tags: ['easy', 'hard'] },
    ]);
    assert.deepEqual(v2, { dataset_id: id, added: 3, version: 2, records: 3 });
    const v3 = await add(id, { records: [{ input: ['four'], expected: null, tags: ['new'] }, { input: 5 }] });
    assert.deepEqual(v3, { dataset_id: id, added: 2, version: 3, records: 5 });

    const latest = await read(id);
    assert.equal(latest.headers.get('x-dataset-version'), '3');
    const records = latest.body.items;
    assert.equal(latest.body.count, 5);
    assert.deepEqual(
      records.map((r: any) => [r.version, r.input]),
      [
        [2, { q: 'one' }],
        [2, { q: 'two' }],
        [2, 'three'],
        [3, ['four']],
        [3, 5],
      ],
      'in the order they were added',
    );
    for (const r of records) {
      assert.match(r.id, /^rec_[0-9a-f]{16}$/);
      assert.ok(!Number.isNaN(Date.parse(r.created_at)));
    }
    assert.equal(new Set(records.map((r: any) => r.id)).size, 5);
    assert.deepEqual(records[1], {
      id: records[1].id,
      version: 2,
      input: { q: 'two' },
      expected: { a: 2 },
      metadata: { source: 'ticket 42' },
      tags: ['hard'],
      created_at: records[1].created_at,
    });
    assert.ok(!('expected' in records[2]) && !('metadata' in records[2]), 'absent fields stay absent');
    assert.equal(records[3].expected, null, 'an explicit null is kept');
    assert.deepEqual(records[4].tags, []);

    assert.deepEqual((await read(id, '?version=1')).body.items, []);
    const old = await read(id, '?version=2');
    assert.equal(old.headers.get('x-dataset-version'), '2');
    assert.deepEqual(old.body.items, records.slice(0, 3), 'an old version reads exactly as before');
    const ids = (query: string) => read(id, query).then((r) => r.body.items.map((x: any) => x.input));
    assert.deepEqual(await ids('?tags=easy'), [{ q: 'one' }, 'three']);
    assert.deepEqual(await ids('?tags=hard,new'), [{ q: 'two' }, 'three', ['four']]);
    assert.deepEqual(await ids('?tags=%20new%20,nothing'), [['four']], 'tags are trimmed');
    assert.deepEqual(await ids('?version=2&tags=new'), []);
    assert.deepEqual(await ids('?tags=unknown'), []);
    const detail = (await req('GET', `/v1/datasets/${id}`)).body;
    assert.deepEqual(
      detail.versions.map((v: any) => [v.version, v.records, v.added]),
      [
        [1, 0, 0],
        [2, 3, 3],
        [3, 5, 2],
      ],
    );
    assert.equal(detail.records, 5);
    assert.equal(detail.updated_at, detail.versions[2].created_at);
  });

  test('limits: records per dataset, versions per dataset (409 naming the setting), datasets per tenant, one name per tenant', async () => {
    const { id } = await create('records-limit');
    await add(
      id,
      Array.from({ length: 15 }, (_, i) => ({ input: i })),
    );
    const over = await bad(
      'POST',
      `/v1/datasets/${id}/records`,
      Array.from({ length: 6 }, (_, i) => ({ input: i })),
      ['has 15 records; 6 more would pass the limit of 20', 'SVC_DATASET_MAX_RECORDS'],
      409,
    );
    assert.equal((await req('GET', `/v1/datasets/${id}`)).body.records, 15, `nothing added: ${over}`);
    await add(
      id,
      Array.from({ length: 5 }, (_, i) => ({ input: i })),
    );
    assert.equal((await read(id, '?limit=100')).body.count, LIMITS.records);

    const versions = await create('versions-limit');
    for (let v = 2; v <= LIMITS.versions; v++) assert.equal((await add(versions.id, [{ input: v }])).version, v);
    await bad(
      'POST',
      `/v1/datasets/${versions.id}/records`,
      [{ input: 'one more' }],
      [`has ${LIMITS.versions} versions, the limit (SVC_DATASET_MAX_VERSIONS = ${LIMITS.versions})`],
      409,
    );

    await bad('POST', '/v1/datasets', { name: 'records-limit' }, [`name: a dataset named "records-limit" already exists (${id})`], 409);

    const mine: string[] = [];
    for (let i = 0; i < LIMITS.datasets; i++) mine.push((await create(`set-${i}`, limited)).id);
    const full = await req('POST', '/v1/datasets', { name: 'one too many' }, limited);
    assert.equal(full.status, 409, full.text);
    assert.match(full.body.message, new RegExp(`the tenant has ${LIMITS.datasets} datasets, the limit \\(SVC_DATASETS_PER_TENANT = ${LIMITS.datasets}\\)`));
    assert.equal((await req('DELETE', `/v1/datasets/${mine[0]}`, undefined, limited)).status, 200);
    assert.equal((await req('POST', '/v1/datasets', { name: 'one too many' }, limited)).status, 201, 'a deleted dataset frees its place');
  });

  test("tenancy: another tenant's ds_ id is a 403 on every endpoint; names are each tenant's own", async () => {
    const mine = await create('shared-name');
    await add(mine.id, [{ input: 'acme only', tags: ['t'] }]);
    const theirs = await create('shared-name', other);
    assert.notEqual(theirs.id, mine.id);
    await add(theirs.id, [{ input: 'globex only' }], other);
    for (const [method, path, body] of [
      ['GET', `/v1/datasets/${mine.id}`],
      ['GET', `/v1/datasets/${mine.id}/records`],
      ['GET', `/v1/datasets/${mine.id}/records?format=ndjson`],
      ['POST', `/v1/datasets/${mine.id}/records`, [{ input: 'intrusion' }]],
      ['POST', `/v1/datasets/${mine.id}/records`, [{ nonsense: true }]],
      ['DELETE', `/v1/datasets/${mine.id}`],
    ] as Array<[string, string, unknown?]>) {
      const res = await req(method, path, body, other);
      assert.equal(res.status, 403, `${method} ${path}: ${res.text}`);
      assert.equal(res.body.error, 'forbidden');
      assert.ok(!res.text.includes('acme only'));
    }
    assert.deepEqual(
      (await read(mine.id)).body.items.map((r: any) => r.input),
      ['acme only'],
      'untouched',
    );
    assert.deepEqual(
      (await read(theirs.id, '', other)).body.items.map((r: any) => r.input),
      ['globex only'],
    );
    const theirList = (await req('GET', '/v1/datasets', undefined, other)).body.items;
    assert.deepEqual(
      theirList.map((d: any) => [d.id, d.user_id]),
      [[theirs.id, 'globex']],
    );
    assert.ok(!(await req('GET', '/v1/datasets?name=shared-name')).body.items.some((d: any) => d.id === theirs.id));
    const unauthenticated = await server.request('GET', `/v1/datasets/${mine.id}`, { key: null });
    assert.equal(unauthenticated.status, 401);
  });

  test('Idempotency-Key: a retried create or add answers as the first, without a second dataset or version', async () => {
    const headers = { 'Idempotency-Key': 'create-qa-1' };
    const first = await req('POST', '/v1/datasets', { name: 'idempotent' }, key, headers);
    const again = await req('POST', '/v1/datasets', { name: 'idempotent' }, key, headers);
    assert.equal(first.status, 201, first.text);
    assert.equal(again.status, 201);
    assert.equal(again.headers.get('idempotent-replayed'), 'true');
    assert.deepEqual(again.body, first.body);
    const reused = await req('POST', '/v1/datasets', { name: 'something else' }, key, headers);
    assert.equal(reused.status, 409, reused.text);
    const id = first.body.id;
    const addHeaders = { 'Idempotency-Key': 'add-batch-1' };
    const records = [{ input: 'a' }, { input: 'b' }];
    const added = await req('POST', `/v1/datasets/${id}/records`, records, key, addHeaders);
    const replayed = await req('POST', `/v1/datasets/${id}/records`, records, key, addHeaders);
    assert.deepEqual([added.status, replayed.status], [201, 201]);
    assert.deepEqual(replayed.body, added.body);
    assert.equal(replayed.headers.get('idempotent-replayed'), 'true');
    const detail = (await req('GET', `/v1/datasets/${id}`)).body;
    assert.deepEqual([detail.version, detail.records], [2, 2]);
    assert.equal(
      (await req('POST', `/v1/datasets/${id}/records`, records, key, { 'Idempotency-Key': 'add-batch-2' })).body.version,
      3,
      'a new key is a new add',
    );
  });

  test('records page on a keyset cursor, and stream as NDJSON', async () => {
    const { id } = await create('paged');
    await add(
      id,
      Array.from({ length: 7 }, (_, i) => ({ input: { n: i }, tags: [i % 2 === 0 ? 'even' : 'odd'] })),
    );
    await add(
      id,
      Array.from({ length: 5 }, (_, i) => ({ input: { n: 7 + i }, tags: [(7 + i) % 2 === 0 ? 'even' : 'odd'] })),
    );
    const seen: number[] = [];
    const counts: number[] = [];
    let cursor: string | undefined;
    do {
      const page = (await read(id, `?limit=5${cursor ? `&cursor=${cursor}` : ''}`)).body;
      counts.push(page.count);
      seen.push(...page.items.map((r: any) => r.input.n));
      cursor = page.next_cursor;
    } while (cursor);
    assert.deepEqual(counts, [5, 5, 2]);
    assert.deepEqual(
      seen,
      Array.from({ length: 12 }, (_, i) => i),
    );
    const evenPage = (await read(id, '?tags=even&limit=4')).body;
    assert.deepEqual(
      evenPage.items.map((r: any) => r.input.n),
      [0, 2, 4, 6],
    );
    assert.deepEqual(
      (await read(id, `?tags=even&limit=4&cursor=${evenPage.next_cursor}`)).body.items.map((r: any) => r.input.n),
      [8, 10],
    );
    // A cursor holds its place while records are added behind it.
    const head = (await read(id, '?version=2&limit=3')).body;
    await add(id, [{ input: { n: 99 } }]);
    assert.deepEqual(
      (await read(id, `?version=2&limit=100&cursor=${head.next_cursor}`)).body.items.map((r: any) => r.input.n),
      [3, 4, 5, 6],
    );

    const ndjson = await read(id, '?format=ndjson&version=3');
    assert.match(ndjson.headers.get('content-type')!, /application\/x-ndjson/);
    const lines = ndjson.text
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l));
    assert.deepEqual(
      lines.map((r) => r.input.n),
      Array.from({ length: 12 }, (_, i) => i),
    );
    const byAccept = await req('GET', `/v1/datasets/${id}/records?tags=odd`, undefined, key, { accept: 'application/x-ndjson' });
    assert.deepEqual(
      byAccept.text
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l).input.n),
      [1, 3, 5, 7, 9, 11],
    );
    const capped = await read(id, '?format=ndjson&limit=2');
    assert.equal(capped.text.trim().split('\n').length, 2, 'limit caps the stream');
  });

  test('the spec field `dataset` and record templates are validated at upload', async () => {
    const yaml = (extra: string, prompt = 'answer {{ input.question }}') =>
      `version: 1\nid: templated\nbase: debian:bookworm\ntask: {prompt: "${prompt}"}\ninvariants:\n  ok: {check: {type: command_exit, command: 'test -n {{ expected.answer | shell }}'}}\n${extra}`;
    assert.equal((await putSpec(yaml('dataset: {name: qa, version: 2, tags: [smoke]}\n'))).status, 201);
    for (const [doc, problem] of [
      [yaml('dataset: {name: qa, id: ds_0123456789abcdef}\n'), 'dataset: must be a mapping {id | name, version?, tags?} with exactly one of id and name'],
      [yaml('dataset: {id: ds_1}\n'), 'dataset.id: must be a dataset id'],
      [yaml('dataset: {name: qa, version: 0}\n'), 'dataset.version: must be a whole number from 1'],
      [yaml('dataset: {name: qa, tags: ["a,b"]}\n'), 'dataset.tags[0]: must be a tag'],
      [
        yaml('', 'the answer is {{ expected.answer }}'),
        'task.prompt: {{ expected.answer }}: the expected answer may be named only in invariants and grader files',
      ],
      [yaml('', 'bad {{ input | upper }}'), 'task.prompt: {{ input | upper }}: unknown filter "upper"'],
    ]) {
      const res = await putSpec(doc);
      assert.equal(res.status, 400, res.text);
      assert.ok(res.body.message.includes(problem), `expected "${problem}" in ${res.body.message}`);
    }
  });

  test('an experiment over a dataset pins its version and lists a scenario per record and matrix entry; bad selections are named', async () => {
    const { id } = await create('pinned');
    await add(id, [
      { input: { word: 'alpha' }, expected: { answer: 'ALPHA' }, tags: ['greek'] },
      { input: { word: 'beta' }, expected: { answer: 'BETA' }, tags: ['greek'] },
      { input: { word: 'one' }, expected: { answer: 'ONE' }, tags: ['number'] },
    ]);
    const spec = `version: 1\nid: pinned-spec\nbase: debian:bookworm\ntask: {prompt: "shout {{ input.word }} in {{ params.lang }}"}\nagent: {type: cli, command: 'true'}\nparallelism:\n  replicas: 2\n  matrix: [{lang: en}, {lang: fr}]\ndataset: {name: pinned}\ninvariants:\n  ok: {check: {type: command_exit, command: 'true'}}\n`;
    assert.equal((await putSpec(spec)).status, 201);
    const made = await req('POST', '/v1/experiments', { name: 'pinned', spec_id: 'pinned-spec' });
    assert.equal(made.status, 201, made.text);
    await add(id, [{ input: { word: 'late' }, expected: { answer: 'LATE' } }]);
    const results = (await req('GET', `/v1/experiments/${made.body.id}`)).body;
    assert.deepEqual(results.options.dataset, { id, name: 'pinned', version: 2, records: 3 }, 'the version of its creation, pinned');
    assert.equal(results.scenarios.length, 6, '3 records x 2 matrix entries, listed before any ran');
    assert.deepEqual(
      results.scenarios.map((s: any) => [s.index, s.params.lang, s.record.input.word, s.verdict]),
      [
        [0, 'en', 'alpha', null],
        [1, 'fr', 'alpha', null],
        [2, 'en', 'beta', null],
        [3, 'fr', 'beta', null],
        [4, 'en', 'one', null],
        [5, 'fr', 'one', null],
      ],
    );
    const first = (await read(id)).body.items[0];
    assert.deepEqual(results.scenarios[0].record, {
      dataset_id: id,
      id: first.id,
      version: 2,
      input: { word: 'alpha' },
      expected: { answer: 'ALPHA' },
      tags: ['greek'],
    });
    const page1 = (await req('GET', `/v1/scenarios?experiment_id=${made.body.id}&limit=2`)).body;
    const page2 = (await req('GET', `/v1/scenarios?experiment_id=${made.body.id}&limit=2&cursor=${page1.next_cursor}`)).body;
    assert.deepEqual(
      [...page1.items, ...page2.items].map((s: any) => [s.params.lang, s.record.input.word]),
      [
        ['en', 'alpha'],
        ['fr', 'alpha'],
        ['en', 'beta'],
        ['fr', 'beta'],
      ],
    );
    const exported = await req('GET', `/v1/experiments/${made.body.id}/export?format=ndjson`);
    assert.equal(exported.status, 200, exported.text);
    const scenarioLines = exported.text
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l))
      .filter((l) => l.type === 'scenario');
    assert.deepEqual(
      scenarioLines.map((s) => s.record.input.word),
      ['alpha', 'alpha', 'beta', 'beta', 'one', 'one'],
    );

    // The request's dataset replaces the spec's, with a version and tags of its own.
    const tagged = await req('POST', '/v1/experiments', {
      name: 'tagged',
      spec_id: 'pinned-spec',
      matrix: [{ lang: 'en' }],
      dataset: { id, version: 3, tags: ['number'] },
    });
    assert.equal(tagged.status, 201, tagged.text);
    const taggedResults = (await req('GET', `/v1/experiments/${tagged.body.id}`)).body;
    assert.deepEqual(taggedResults.options.dataset, { id, name: 'pinned', version: 3, tags: ['number'], records: 1 });
    assert.deepEqual(
      taggedResults.scenarios.map((s: any) => s.record.input.word),
      ['one'],
    );

    const theirs = await create('theirs', other);
    for (const [body, status, problem] of [
      [{ dataset: { name: 'nope' } }, 404, 'dataset: no dataset named "nope" exists'],
      [{ dataset: { id: theirs.id } }, 403, `dataset ${theirs.id} belongs to another tenant`],
      [{ dataset: { id, version: 9 } }, 400, `dataset.version: dataset ${id} has no version 9 (its newest is 3)`],
      [{ dataset: { id, tags: ['none-such'] } }, 400, 'with any of the tags none-such has no records: nothing to run'],
      [{ dataset: { id, name: 'pinned' } }, 400, 'dataset: needs exactly one of id (ds_...) and name'],
      [{ dataset: { name: 'pinned', version: 'latest', record_ids: ['x'], extra: 1 } }, 400, 'dataset.version: must be a positive integer'],
      [{ dataset: 'pinned' }, 400, 'dataset: must be an object'],
    ] as Array<[Record<string, unknown>, number, string]>) {
      const res = await req('POST', '/v1/experiments', { name: 'bad', spec_id: 'pinned-spec', ...body });
      assert.equal(res.status, status, res.text);
      assert.ok(res.body.message.includes(problem), `expected "${problem}" in ${res.body.message}`);
    }
    const noDataset = `version: 1\nid: needs-record\nbase: debian:bookworm\ntask: {prompt: "{{ input }}"}\ninvariants:\n  ok: {check: {type: command_exit, command: 'true'}}\n`;
    assert.equal((await putSpec(noDataset)).status, 201);
    const refused = await req('POST', '/v1/experiments', { name: 'no dataset', spec_id: 'needs-record' });
    assert.equal(refused.status, 400, refused.text);
    assert.match(
      refused.body.message,
      /dataset: spec "needs-record" refers to a dataset record \(\{\{ input \}\} or \{\{ expected \}\} at task\.prompt\) but neither it nor the request names a dataset/,
    );
  });

  const runtime = backend('SVC_TEST_BWRAP', 'an experiment over a dataset on the local runtime');
  if (runtime) {
    test('3 records x 2 replicas: the agent sees the input, the invariants the expected answer; a failing record reproduces', async () => {
      const { id } = await create('words');
      await add(id, [
        { input: { word: 'alpha' }, expected: { answer: 'ALPHA' } },
        { input: { word: 'beta' }, expected: { answer: 'BETA' } },
        // The expected answer is wrong: this scenario fails.
        { input: { word: 'gamma' }, expected: { answer: 'WRONG' } },
      ]);
      const spec = `version: 1
id: shout
base: debian:bookworm
task: {prompt: "Write {{ input.word }} in capitals to out.txt"}
agent:
  type: cli
  command: 'printf %s {{ input.word | shell }} | tr a-z A-Z > out.txt; printf %s "$SVC_INPUT" > input.json; env > env.txt; printf %s "$SVC_TASK_PROMPT" > prompt.txt'
parallelism: {replicas: 2}
dataset: {name: words}
grader:
  files: [{path: expected.json, content: "{{ expected | json }}"}]
invariants:
  answer: {check: {type: command_exit, command: 'test "$(cat out.txt)" = {{ expected.answer | shell }}'}}
  input_env: {check: {type: file_content, path: input.json, contains: '"word":"{{ input.word }}"'}}
  prompt: {check: {type: file_content, path: prompt.txt, contains: "Write {{ input.word }} in capitals"}}
  record_env: {check: {type: command_exit, command: 'grep -q "^SVC_RECORD_ID=rec_" env.txt && grep -q "^SVC_DATASET_ID=${id}$" env.txt'}}
  never_seen: {check: {type: command_exit, command: '! grep -q {{ expected.answer | shell }} env.txt input.json prompt.txt'}}
  grader_file: {check: {type: custom, script: "import json\\nprint(json.dumps({'passed': 'answer' in json.load(open('expected.json'))}))\\n"}}
`;
      const stored = await putSpec(spec);
      assert.equal(stored.status, 201, stored.text);
      const made = await req('POST', '/v1/experiments', { name: 'shout', spec_id: 'shout', run: true });
      assert.equal(made.status, 201, made.text);
      assert.equal(made.body.total_runs, 6);
      const deadline = Date.now() + 120_000;
      let results: any;
      for (;;) {
        results = (await req('GET', `/v1/experiments/${made.body.id}`)).body;
        if (['completed', 'failed', 'cancelled'].includes(results.status)) break;
        assert.ok(Date.now() < deadline, `still ${results.status}`);
        await new Promise((r) => setTimeout(r, 250));
      }
      assert.equal(results.status, 'completed', JSON.stringify(results).slice(0, 1500));
      assert.equal(results.scenarios.length, 3);
      const [alpha, beta, gamma] = results.scenarios;
      for (const scenario of [alpha, beta]) {
        assert.equal(scenario.verdict, 'pass', JSON.stringify(scenario).slice(0, 2000));
        assert.equal(scenario.runs.length, 2);
        for (const run of scenario.runs) for (const inv of run.invariants) assert.equal(inv.passed, true, `${inv.name}: ${inv.message}`);
      }
      assert.equal(gamma.verdict, 'fail');
      for (const run of gamma.runs) {
        const byName = Object.fromEntries(run.invariants.map((i: any) => [i.name, i.passed]));
        assert.deepEqual(byName, { answer: false, input_env: true, prompt: true, record_env: true, never_seen: true, grader_file: true });
      }
      assert.deepEqual(gamma.record.expected, { answer: 'WRONG' });
      assert.deepEqual(gamma.params, {});

      // The reproducer pins the spec version, the dataset version and the record; run, it fails the same way.
      const failed = gamma.runs[0];
      const body = JSON.parse(/-d '(.*)'$/.exec(failed.reproducer)![1]);
      assert.deepEqual(body.dataset, { id, version: 2, record_ids: [gamma.record.id] });
      assert.deepEqual([body.spec_version, body.replicas, body.seed, body.matrix], [1, 1, failed.seed, [{}]]);
      await add(id, [{ input: { word: 'delta' }, expected: { answer: 'DELTA' } }]);
      const { stdout } = await promisify(execFile)('sh', ['-c', failed.reproducer], { env: { ...process.env, SVC_API_KEY: key } });
      const again = JSON.parse(stdout);
      assert.equal(again.total_runs, 1);
      for (;;) {
        results = (await req('GET', `/v1/experiments/${again.id}`)).body;
        if (results.status === 'completed') break;
        assert.ok(Date.now() < deadline + 60_000, `still ${results.status}`);
        await new Promise((r) => setTimeout(r, 250));
      }
      assert.deepEqual(results.options.dataset, { id, name: 'words', version: 2, record_ids: [gamma.record.id], records: 1 });
      assert.equal(results.scenarios.length, 1);
      assert.deepEqual(results.scenarios[0].record, gamma.record);
      assert.equal(results.scenarios[0].verdict, 'fail');
      assert.equal(results.scenarios[0].runs[0].seed, failed.seed);
    });
  }
});

/**
 * Idempotency-Key retries after a crash: killed (-9) after the dataset or the add's version was
 * stored but before the response was recorded, the retry runs again and finds what the first try
 * made (ids derived from the key), so there is one dataset and one version, with the same record
 * ids; and everything survives the restart.
 */
describe('datasets across a crash', () => {
  let server: TestServer;
  let key: string;
  const hold = async (ms: string) => {
    await server.stop();
    server.env.SVC_TEST_IDEMPOTENCY_HOLD = ms;
    await server.restart();
  };
  const crash = async (request: () => ReturnType<TestServer['request']>): ReturnType<TestServer['request']> => {
    const first = diesWithTheProcess(request());
    const deadline = Date.now() + 30_000;
    while (!/holding before recording the idempotent response/.test(server.output())) {
      assert.ok(Date.now() < deadline, 'the request never reached the hold');
      await new Promise((r) => setTimeout(r, 50));
    }
    await server.kill9();
    assert.equal(await first, 'connection lost');
    server.env.SVC_TEST_IDEMPOTENCY_HOLD = '0';
    await server.restart();
    const retry = await request();
    assert.equal(retry.headers.get('idempotent-replayed'), null, 'nothing was recorded, so the request ran again');
    return retry;
  };

  before(async () => {
    server = await startServer({ SVC_RATE_LIMIT_WRITES: '0', SVC_RATE_LIMIT_READS: '0', SVC_TEST_IDEMPOTENCY_HOLD: '10m' });
    key = (await createTenantKey(server, 'acme')).key;
  });
  after(() => server?.cleanup());

  test('a retried create finds the dataset, a retried add its version and records', async () => {
    const created = await crash(() => server.request('POST', '/v1/datasets', { key, body: { name: 'crash' }, headers: { 'idempotency-key': 'create-1' } }));
    assert.equal(created.status, 201, created.text);
    const list = (await server.request('GET', '/v1/datasets', { key })).body.items;
    assert.deepEqual(
      list.map((d: any) => d.id),
      [created.body.id],
      'one dataset',
    );

    await hold('10m');
    const records = [{ input: 'a', tags: ['x'] }, { input: 'b' }, { input: 'c', expected: 'C' }];
    const added = await crash(() =>
      server.request('POST', `/v1/datasets/${created.body.id}/records`, { key, body: records, headers: { 'idempotency-key': 'add-1' } }),
    );
    assert.equal(added.status, 201, added.text);
    assert.deepEqual(added.body, { dataset_id: created.body.id, added: 3, version: 2, records: 3 });
    const detail = (await server.request('GET', `/v1/datasets/${created.body.id}`, { key })).body;
    assert.deepEqual([detail.version, detail.records], [2, 3], 'one version');
    const read = (await server.request('GET', `/v1/datasets/${created.body.id}/records`, { key })).body;
    assert.deepEqual(
      read.items.map((r: any) => [r.input, r.version]),
      [
        ['a', 2],
        ['b', 2],
        ['c', 2],
      ],
    );
    const [row] = await server
      .request(
        'GET',
        `/v1/admin/sql/?query=${encodeURIComponent(`SELECT count() AS n, uniqExact(RecordId) AS ids FROM dataset_records FINAL WHERE DatasetId = '${created.body.id}' FORMAT JSONEachRow`)}`,
      )
      .then((r) =>
        r.text
          .trim()
          .split('\n')
          .map((l) => JSON.parse(l)),
      );
    assert.deepEqual(row, { n: '3', ids: '3' }, 'the retry found its version: no second copy of the records');
    // After the restarts the next add continues the versions.
    const next = await server.request('POST', `/v1/datasets/${created.body.id}/records`, { key, body: [{ input: 'd' }] });
    assert.equal(next.body.version, 3);
  });
});
