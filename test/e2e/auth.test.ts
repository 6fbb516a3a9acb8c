import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { ADMIN_KEY, REPO, createTenantKey, startServer, traceEvent, type TestServer } from '../helpers/server.ts';

describe('authentication and tenant keys', () => {
  let server: TestServer;
  before(async () => {
    server = await startServer();
  });
  after(async () => server?.cleanup());

  test('a missing key is 401, a bad key is 401, /health needs none', async () => {
    const missing = await server.request('GET', '/v1/traces', { key: null });
    assert.equal(missing.status, 401);
    assert.deepEqual(Object.keys(missing.body).sort(), ['error', 'message']);
    assert.equal(missing.body.error, 'unauthorized');
    const bad = await server.request('GET', '/v1/traces', { key: 'svc_live_nope' });
    assert.equal(bad.status, 401);
    const malformed = await server.request('GET', '/v1/traces', { key: null, headers: { authorization: 'Basic abc' } });
    assert.equal(malformed.status, 401);
    const health = await server.request('GET', '/health', { key: null });
    assert.equal(health.status, 200);
    assert.equal(health.body.status, 'ok');
    assert.deepEqual(health.body.log, { backend: 'embedded', ok: true });
    assert.deepEqual(health.body.store, { backend: 'chdb', ok: true });
  });

  test('tenant keys are shown once, listed without the secret, and work', async () => {
    const created = await server.request('POST', '/v1/admin/keys', { body: { tenant: 'initech', name: 'ci' } });
    assert.equal(created.status, 201);
    assert.match(created.body.key, /^svc_live_[0-9a-f]{48}$/);
    assert.equal(created.body.tenant, 'initech');
    const list = await server.request('GET', '/v1/admin/keys?tenant=initech');
    assert.equal(list.body.count, 1);
    assert.equal(list.body.items[0].key, undefined);
    assert.equal(list.body.items[0].id, created.body.id);
    assert.equal((await server.request('GET', '/v1/traces', { key: created.body.key })).status, 200);
    const tenant = await server.request('GET', '/v1/admin/tenants/initech');
    assert.equal(tenant.body.plan, 'pro', 'new tenants get the default plan');
  });

  test('a rotated key stops working at once; the new secret works; a revoked key stops too', async () => {
    const { id, key } = await createTenantKey(server, 'rotating');
    const rotated = await server.request('POST', `/v1/admin/keys/${id}/rotate`);
    assert.equal(rotated.status, 200);
    assert.notEqual(rotated.body.key, key);
    assert.equal((await server.request('GET', '/v1/traces', { key })).status, 401);
    assert.equal((await server.request('GET', '/v1/traces', { key: rotated.body.key })).status, 200);
    const revoked = await server.request('DELETE', `/v1/admin/keys/${id}`);
    assert.equal(revoked.body.status, 'revoked');
    assert.equal((await server.request('GET', '/v1/traces', { key: rotated.body.key })).status, 401);
    assert.equal((await server.request('DELETE', `/v1/admin/keys/${id}`)).status, 200, 'revoking twice is fine');
    assert.equal((await server.request('POST', `/v1/admin/keys/${id}/rotate`)).status, 409);
    assert.equal((await server.request('POST', '/v1/admin/keys/key_unknown/rotate')).status, 404);
  });

  test('a tenant key on admin endpoints, metrics or the schema registry is 403', async () => {
    const { key } = await createTenantKey(server, 'curious');
    for (const p of ['/v1/admin/keys', '/metrics', '/schema-registry/subjects']) {
      const res = await server.request('GET', p, { key });
      assert.equal(res.status, 403, p);
      assert.equal(res.body.error, 'forbidden');
    }
  });

  test('admin input is validated', async () => {
    assert.match((await server.request('POST', '/v1/admin/keys', { body: {} })).body.message, /^tenant:/);
    assert.match((await server.request('POST', '/v1/admin/keys', { body: { tenant: 'Bad Name!' } })).body.message, /^tenant:/);
    assert.match((await server.request('PUT', '/v1/admin/tenants/acme', { body: { plan: 'gold' } })).body.message, /^plan:/);
    const plan = await server.request('PUT', '/v1/admin/tenants/acme', { body: { plan: 'free', max_concurrent_sandboxes: 3 } });
    assert.equal(plan.status, 200);
    assert.equal(plan.body.plan, 'free');
    assert.equal(plan.body.max_concurrent_sandboxes, 3);
  });

  test('keys and tenants survive a restart', async () => {
    const { key } = await createTenantKey(server, 'durable');
    await server.request('POST', '/v1/traces', { key, body: { events: [traceEvent({ tool: 'before-restart' })] } });
    assert.equal(await server.stop(), 0, 'SIGTERM stops cleanly');
    await server.restart();
    const res = await server.request('GET', '/v1/traces?tool=before-restart', { key });
    assert.equal(res.status, 200);
    assert.equal(res.body.count, 1);
  });

  test('svc keys create prints the new key alone on the last line', async () => {
    const out = spawnSync(
      process.execPath,
      [path.join(REPO, 'bin', 'svc.cjs'), 'keys', 'create', '--tenant', 'from-cli', '--url', server.url, '--admin-key', ADMIN_KEY],
      { encoding: 'utf8' },
    );
    assert.equal(out.status, 0, out.stderr);
    const lines = out.stdout.trim().split('\n');
    const key = lines[lines.length - 1];
    assert.match(key, /^svc_live_[0-9a-f]{48}$/);
    assert.equal((await server.request('GET', '/v1/traces', { key })).status, 200);
    const wrong = spawnSync(
      process.execPath,
      [path.join(REPO, 'bin', 'svc.cjs'), 'keys', 'create', '--tenant', 'x', '--url', server.url, '--admin-key', 'wrong-admin-key-000000'],
      { encoding: 'utf8' },
    );
    assert.notEqual(wrong.status, 0);
    assert.match(wrong.stderr, /401/);
  });
});

describe('server start-up rules', () => {
  test('refuses to start without an admin key unless SVC_AUTH_REQUIRED=false', () => {
    const out = spawnSync(process.execPath, ['--import', 'tsx', path.join(REPO, 'services', 'main.ts')], {
      cwd: REPO,
      env: { ...process.env, SVC_API_KEY: '', SVC_AUTH_REQUIRED: '', SVC_PORT: '0' },
      encoding: 'utf8',
      timeout: 30_000,
    });
    assert.equal(out.status, 1);
    assert.match(out.stderr, /SVC_API_KEY: an admin key is required/);
  });

  test('bad settings fail at start naming the variable', () => {
    const out = spawnSync(process.execPath, ['--import', 'tsx', path.join(REPO, 'services', 'main.ts')], {
      cwd: REPO,
      env: { ...process.env, SVC_API_KEY: ADMIN_KEY, SVC_LOG_BACKEND: 'rabbit', SVC_PORT: 'eighty' },
      encoding: 'utf8',
      timeout: 30_000,
    });
    assert.equal(out.status, 1);
    assert.match(out.stderr, /SVC_PORT: expected a non-negative integer/);
    assert.match(out.stderr, /SVC_LOG_BACKEND: expected one of embedded, kafka/);
  });

  test('with SVC_AUTH_REQUIRED=false requests without a key act as the default tenant', async () => {
    const server = await startServer({ SVC_AUTH_REQUIRED: 'false', SVC_API_KEY: '' });
    try {
      const post = await server.request('POST', '/v1/traces', { key: null, body: { events: [traceEvent({ tool: 'anon' })] } });
      assert.equal(post.status, 200, post.text);
      const get = await server.request('GET', '/v1/traces?tool=anon', { key: null });
      assert.equal(get.body.items[0].tenant, 'default');
      assert.equal((await server.request('GET', '/v1/traces', { key: 'svc_live_bogus' })).status, 401, 'a bad key is still refused');
    } finally {
      await server.cleanup();
    }
  });
});
