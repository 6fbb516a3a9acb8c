/**
 * Agent snapshots over HTTP against the real service: upload, content addressing, versions and
 * tags, pagination, deletion freeing the blob, every bad bundle and bad metadata, the limits,
 * tenant isolation, specs pinning a snapshot, and a restart.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import net from 'node:net';
import { gzipSync } from 'node:zlib';
import { readdir } from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { makeBundle, makeHostileBundle, sha256, uploadAgent } from '../helpers/bundles.ts';
import { createTenantKey, startServer, type TestServer } from '../helpers/server.ts';

const META = { name: 'coder', entrypoint: ['python', 'main.py'], runtime: 'python3.12' };

async function blobFiles(server: TestServer): Promise<string[]> {
  const root = path.join(server.dataDir, 'blobs', 'sha256');
  const dirs = await readdir(root).catch(() => [] as string[]);
  const files = await Promise.all(dirs.map(async (d) => (await readdir(path.join(root, d))).map((f) => `${d}/${f}`)));
  return files.flat();
}

async function tempFiles(server: TestServer): Promise<string[]> {
  return readdir(path.join(server.dataDir, 'blobs', 'tmp')).catch(() => []);
}

describe('agent snapshots', () => {
  let server: TestServer;
  let key: string;
  let other: string;
  let bundle: Buffer;
  const get = (p: string, k = key) => server.request('GET', p, { key: k });

  before(async () => {
    server = await startServer({
      SVC_RATE_LIMIT_WRITES: '0',
      SVC_RATE_LIMIT_READS: '0',
      SVC_AGENTS_MAX_SIZE: String(256 * 1024),
      SVC_AGENTS_MAX_VERSIONS: '3',
    });
    key = (await createTenantKey(server, 'acme')).key;
    other = (await createTenantKey(server, 'globex')).key;
    bundle = await makeBundle({ 'main.py': 'print("hello")\n', 'lib/util.py': 'X = 1\n', 'run.sh': '#!/bin/sh\necho run\n' });
  });
  after(() => server.cleanup());

  test('an upload returns the full snapshot with its digest, and identical bytes are stored once', async () => {
    const first = await uploadAgent(
      server,
      key,
      { ...META, tag: 'stable', auth: { required_env: ['OPENAI_API_KEY'], egress: { 'api.openai.com': ['443'] } } },
      bundle,
    );
    assert.equal(first.status, 201, first.text);
    assert.match(first.body.id, /^snap_[0-9a-f]{32}$/);
    assert.equal(first.body.name, 'coder');
    assert.equal(first.body.version, 1);
    assert.equal(first.body.tag, 'stable');
    assert.equal(first.body.digest, sha256(bundle));
    assert.equal(first.body.size_bytes, bundle.length);
    assert.equal(first.body.storage_path, `sha256/${sha256(bundle).slice(7, 9)}/${sha256(bundle).slice(7)}.tar.gz`);
    assert.equal(first.body.runtime, 'python3.12');
    assert.deepEqual(first.body.entrypoint, ['python', 'main.py']);
    assert.deepEqual(first.body.auth, { required_env: ['OPENAI_API_KEY'], egress: { 'api.openai.com': ['443'] } });
    assert.ok(Date.parse(first.body.created_at) > Date.now() - 60_000);

    const second = await uploadAgent(server, key, META, bundle);
    assert.equal(second.status, 201, second.text);
    assert.equal(second.body.version, 2);
    assert.equal(second.body.digest, first.body.digest);
    assert.notEqual(second.body.id, first.body.id);
    assert.equal(second.body.tag, undefined);
    assert.deepEqual(await blobFiles(server), [first.body.storage_path.slice('sha256/'.length)]);
    assert.deepEqual(await tempFiles(server), []);
  });

  test('latest, tags, versions and ids resolve one snapshot each', async () => {
    const latest = await get('/v1/agents/coder/latest');
    assert.equal(latest.status, 200, latest.text);
    assert.equal(latest.body.version, 2);
    assert.equal((await get('/v1/agents/coder/tags/latest')).body.version, 2);
    assert.equal((await get('/v1/agents/coder/tags/stable')).body.version, 1);
    assert.equal((await get('/v1/agents/coder/versions/1')).body.tag, 'stable');
    const byId = await get(`/v1/snapshots/${latest.body.id}`);
    assert.deepEqual(byId.body, latest.body);
    assert.equal((await get('/v1/agents/coder/tags/nope')).status, 404);
    assert.equal((await get('/v1/agents/coder/versions/9')).status, 404);
    assert.equal((await get('/v1/agents/nobody/latest')).status, 404);
    assert.equal((await get('/v1/snapshots/snap_00000000000000000000000000000000')).status, 404);
    const bad = await get('/v1/agents/coder/versions/one');
    assert.equal(bad.status, 400);
    assert.match(bad.body.message, /^version:/);
  });

  test('lists paginate with cursors: versions of one agent, and agents by name', async () => {
    for (const name of ['alpha', 'beta']) assert.equal((await uploadAgent(server, key, { ...META, name }, bundle)).status, 201);
    const seen: number[] = [];
    let cursor: string | undefined;
    do {
      const page = await get(`/v1/agents/coder/versions?limit=1${cursor ? `&cursor=${cursor}` : ''}`);
      assert.equal(page.status, 200, page.text);
      assert.equal(page.body.count, page.body.items.length);
      seen.push(...page.body.items.map((i: { version: number }) => i.version));
      cursor = page.body.next_cursor;
    } while (cursor);
    assert.deepEqual(seen, [1, 2]);

    const first = await get('/v1/agents?limit=2');
    assert.deepEqual(
      first.body.items.map((i: { name: string }) => i.name),
      ['alpha', 'beta'],
    );
    const second = await get(`/v1/agents?limit=2&cursor=${first.body.next_cursor}`);
    assert.deepEqual(
      second.body.items.map((i: { name: string; version: number }) => [i.name, i.version]),
      [['coder', 2]],
    );
    assert.equal(second.body.next_cursor, undefined);
    assert.equal((await get('/v1/agents?cursor=garbage')).status, 400);
    assert.equal((await get('/v1/agents?limit=0')).status, 400);
    assert.equal((await get('/v1/agents?bogus=1')).status, 400);
  });

  test('bad bundles are refused with a 400 naming the bundle, and nothing is kept', async () => {
    const cases: Array<[string, Buffer, RegExp]> = [
      ['not gzip', Buffer.from('just some text, not an archive'), /not gzip-compressed/],
      ['gzip but not tar', gzipSync(Buffer.from('hello world '.repeat(100))), /not a valid \.tar\.gz/],
      ['truncated', bundle.subarray(0, Math.floor(bundle.length / 2)), /not a valid \.tar\.gz/],
      ['traversal', await makeHostileBundle('dotdot'), /contains "\.\."/],
      ['absolute path', await makeHostileBundle('absolute'), /absolute path/],
      ['escaping link', await makeBundle({ 'main.py': 'x' }, { links: { evil: '../../etc/passwd' } }), /symbolic link "evil" points outside/],
      ['absolute link', await makeBundle({ 'main.py': 'x' }, { links: { evil: '/etc/passwd' } }), /symbolic link "evil" points outside/],
      ['empty file', Buffer.alloc(0), /bundle: is empty/],
    ];
    for (const [what, bytes, message] of cases) {
      const res = await uploadAgent(server, key, { ...META, name: 'bad' }, bytes);
      assert.equal(res.status, 400, `${what}: ${res.text}`);
      assert.equal(res.body.error, 'bad_request');
      assert.match(res.body.message, /^bundle: /, what);
      assert.match(res.body.message, message, what);
    }
    const inside = await uploadAgent(server, key, { ...META, name: 'links-ok' }, await makeBundle({ 'lib/a.py': 'x' }, { links: { 'a.py': 'lib/a.py' } }));
    assert.equal(inside.status, 201, inside.text);
    assert.equal((await get('/v1/agents/bad/latest')).status, 404);
    assert.deepEqual(await tempFiles(server), []);
  });

  test('an oversize bundle is a 413, found while streaming or from its declared length', async () => {
    // 300 KiB of random bytes stay ~300 KiB gzip'd: past the 256 KiB limit in the middle of the stream.
    const oversize = await makeBundle({ 'weights.bin': randomBytes(300 * 1024).toString('latin1') });
    const res = await uploadAgent(server, key, { ...META, name: 'big' }, oversize);
    assert.equal(res.status, 413, res.text);
    assert.equal(res.body.error, 'payload_too_large');
    assert.match(res.body.message, /^bundle: .*agents\.max_size/);

    // A body declared far past the limit is refused from its Content-Length, before it is read.
    const raw = await new Promise<string>((resolve, reject) => {
      const socket = net.connect(Number(new URL(server.url).port), '127.0.0.1', () => {
        socket.write(
          `POST /v1/agents HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${key}\r\nContent-Type: multipart/form-data; boundary=b\r\nContent-Length: ${10 * 1024 * 1024}\r\n\r\n--b\r\n`,
        );
      });
      let text = '';
      socket.on('data', (d) => (text += d));
      socket.on('end', () => resolve(text));
      socket.on('error', reject);
    });
    assert.match(raw, /^HTTP\/1\.1 413 /);
    assert.match(raw, /agents\.max_size/);
    assert.equal((await get('/v1/agents/big/latest')).status, 404);
    assert.deepEqual(await tempFiles(server), []);
  });

  test('bad metadata and bad forms are 400s naming the field; other bodies are 415', async () => {
    const cases: Array<[unknown, Buffer | null, RegExp]> = [
      [undefined, bundle, /^metadata: is required/],
      ['{not json', bundle, /^metadata: is not valid JSON/],
      [META, null, /^bundle: is required/],
      [{ ...META, name: '../x' }, bundle, /^metadata\.name: /],
      [{ ...META, entrypoint: [] }, bundle, /^metadata\.entrypoint: must be a non-empty list of strings/],
      [{ name: 'x' }, bundle, /^metadata\.entrypoint: is required/],
      [{ ...META, tag: 'latest' }, bundle, /^metadata\.tag: .*not latest \(set automatically/],
      [{ ...META, extra: 1 }, bundle, /^metadata\.extra: unknown field/],
      [{ ...META, auth: { required_env: ['1BAD'] } }, bundle, /^metadata\.auth\.required_env\[0\]: /],
      [{ ...META, auth: { egress: { 'bad host!': ['443'] } } }, bundle, /^metadata\.auth\.egress\["bad host!"\]: is not a hostname/],
      [{ ...META, auth: { egress: { 'api.example.com': ['99999'] } } }, bundle, /out of range/],
      [{ ...META, auth: { config_files: [{ path: '../../etc/x', template: 'y' }] } }, bundle, /^metadata\.auth\.config_files\[0\]\.path: /],
      [{ ...META, auth: { config_files: [{ path: '/etc/x', template: 'y' }] } }, bundle, /must be in the workspace/],
      [{ ...META, auth: { config_files: [{ path: 'cfg', template: '{{secrets.bad-name}}' }] } }, bundle, /is not a valid secret name/],
    ];
    for (const [metadata, bytes, message] of cases) {
      const res = await uploadAgent(server, key, metadata, bytes);
      assert.equal(res.status, 400, `${JSON.stringify(metadata)}: ${res.text}`);
      assert.match(res.body.message, message);
    }
    const several = await uploadAgent(server, key, { name: '', entrypoint: 'run', tag: 5 }, bundle);
    assert.equal(several.status, 400);
    assert.match(several.body.message, /metadata\.name: .*metadata\.entrypoint: .*metadata\.tag: /);
    const json = await server.request('POST', '/v1/agents', { key, body: META });
    assert.equal(json.status, 415);
    assert.equal(json.body.error, 'unsupported_media_type');
    assert.deepEqual(await tempFiles(server), []);
  });

  test('the versions-per-agent limit is a 409', async () => {
    assert.equal((await uploadAgent(server, key, META, bundle)).status, 201); // coder v3
    const res = await uploadAgent(server, key, META, bundle);
    assert.equal(res.status, 409, res.text);
    assert.match(res.body.message, /agents\.max_versions/);
  });

  test("another tenant's snapshot ids are 403 and its names 404", async () => {
    const mine = (await get('/v1/agents/coder/latest')).body;
    const read = await get(`/v1/snapshots/${mine.id}`, other);
    assert.equal(read.status, 403);
    assert.equal(read.body.error, 'forbidden');
    assert.equal((await server.request('DELETE', `/v1/snapshots/${mine.id}`, { key: other })).status, 403);
    assert.equal((await get('/v1/agents/coder/latest', other)).status, 404);
    assert.equal((await get('/v1/agents/coder/versions', other)).status, 404);
    assert.deepEqual((await get('/v1/agents', other)).body.items, []);
    // The same name and bytes in another tenant are another snapshot, sharing the blob.
    const theirs = await uploadAgent(server, other, META, bundle);
    assert.equal(theirs.status, 201);
    assert.equal(theirs.body.version, 1);
    assert.notEqual(theirs.body.id, mine.id);
    assert.equal(theirs.body.digest, mine.digest);
  });

  test('specs pin snapshots by an id that must exist', async () => {
    const spec = (agent: string) =>
      `version: 1\nid: pinned\nbase: debian:bookworm\ntask: {prompt: go}\nagent: ${agent}\ninvariants:\n  ok: {check: {type: file_exists, path: out.txt}}\n`;
    const put = (yaml: string, k = key) => server.request('POST', '/v1/specs', { key: k, body: yaml, headers: { 'content-type': 'application/x-yaml' } });
    const missing = await put(spec('{type: snapshot, snapshot_id: snap_0123456789abcdef0123456789abcdef}'));
    assert.equal(missing.status, 400);
    assert.match(missing.body.message, /agent\.snapshot_id: no agent snapshot snap_0123456789abcdef0123456789abcdef exists/);
    const mine = (await get('/v1/agents/coder/versions/1')).body;
    const pinned = await put(spec(`{type: snapshot, snapshot_id: ${mine.id}, entrypoint: [sh, run.sh]}`));
    assert.equal(pinned.status, 201, pinned.text);
    assert.equal(pinned.body.spec.agent.snapshot_id, mine.id);
    const theirs = await put(spec(`{type: snapshot, snapshot_id: ${mine.id}}`), other);
    assert.equal(theirs.status, 400, "another tenant's snapshot does not exist for you");
    const byName = await put(spec('{type: snapshot, snapshot: coder}'));
    assert.equal(byName.status, 201, byName.text);
  });

  test('deleting frees the blob with the last row using it; versions are never reused', async () => {
    const bytes = await makeBundle({ 'only.py': 'print(1)\n' });
    const a = (await uploadAgent(server, key, { ...META, name: 'solo' }, bytes)).body;
    const b = (await uploadAgent(server, key, { ...META, name: 'solo' }, bytes)).body;
    const blob = a.storage_path.slice('sha256/'.length);
    assert.ok((await blobFiles(server)).includes(blob));
    const del = await server.request('DELETE', `/v1/snapshots/${a.id}`, { key });
    assert.equal(del.status, 200, del.text);
    assert.equal((await get(`/v1/snapshots/${a.id}`)).status, 404);
    assert.ok((await blobFiles(server)).includes(blob), 'still used by version 2');
    assert.equal((await server.request('DELETE', `/v1/snapshots/${b.id}`, { key })).status, 200);
    assert.ok(!(await blobFiles(server)).includes(blob), 'freed with the last row');
    assert.equal((await get('/v1/agents/solo/latest')).status, 404);
    assert.equal((await server.request('DELETE', `/v1/snapshots/${b.id}`, { key })).status, 404);
    const again = await uploadAgent(server, key, { ...META, name: 'solo' }, bytes);
    assert.equal(again.body.version, 3);
    assert.notEqual(again.body.id, a.id);
    assert.ok((await blobFiles(server)).includes(blob));
  });

  test('snapshots survive a restart', async () => {
    const before = (await get('/v1/agents/coder/latest')).body;
    await server.stop();
    await server.restart();
    assert.deepEqual((await get('/v1/agents/coder/latest')).body, before);
    const next = await uploadAgent(server, key, { ...META, name: 'solo' }, bundle);
    assert.equal(next.body.version, 4);
  });
});

describe('snapshot retention', () => {
  test('retention.snapshots deletes old versions but never the newest of an agent', async () => {
    const server = await startServer({ SVC_RETENTION_SNAPSHOTS: '1s' });
    try {
      const key = (await createTenantKey(server, 'acme')).key;
      const bytes = await makeBundle({ 'a.py': 'print(1)\n' });
      const v1 = (await uploadAgent(server, key, META, bytes)).body;
      const v2 = (await uploadAgent(server, key, META, bytes)).body;
      const deadline = Date.now() + 10_000;
      while ((await server.request('GET', `/v1/snapshots/${v1.id}`, { key })).status !== 404) {
        assert.ok(Date.now() < deadline, 'version 1 expired within 10 s');
        await new Promise((r) => setTimeout(r, 200));
      }
      assert.equal((await server.request('GET', '/v1/agents/coder/latest', { key })).body.id, v2.id, 'the newest version stays');
    } finally {
      await server.cleanup();
    }
  });
});
