/**
 * Sandboxes booted from specs that name agent snapshots, on the local runtime: the bundle at
 * /agent read-only, pinned versions, auth.required_env, config files with secrets, egress.
 */
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { backend } from '../helpers/backend.ts';
import { makeBundle, uploadAgent } from '../helpers/bundles.ts';
import { storeSpec } from '../helpers/sandboxes.ts';
import { createTenantKey, startServer, type TestServer } from '../helpers/server.ts';

const SPEC = (id: string, agent: string) => `version: 1
id: ${id}
base: debian:bookworm
task: {prompt: fix it}
agent: ${agent}
invariants:
  ok: {check: {type: file_exists, path: out.txt}}
`;

const runtime = backend('SVC_TEST_BWRAP', 'agent sandboxes on the local runtime');

if (runtime) {
  describe('sandboxes of snapshot agents', () => {
    let server: TestServer;
    let key: string;
    const req = (method: string, p: string, body?: unknown) => server.request(method, p, { key, body });
    const putSpec = (yaml: string) => storeSpec(server, key, yaml);
    const run = async (id: string, command: string) => (await req('POST', `/v1/sandboxes/${id}/commands`, { command })).body;

    before(async () => {
      server = await startServer({ SVC_SANDBOX_HOST_ROOTFS: 'true', SVC_RATE_LIMIT_WRITES: '0', SVC_RATE_LIMIT_READS: '0' });
      key = (await createTenantKey(server, 'acme')).key;
      const auth = {
        required_env: ['API_TOKEN'],
        config_files: [{ path: '~/.config/coder/config.json', template: '{"token": "{{secrets.API_TOKEN}}", "mode": "{{ secrets.MODE }}"}' }],
        egress: { 'api.openai.com': ['443'] },
      };
      const v1 = await uploadAgent(
        server,
        key,
        { name: 'coder', entrypoint: ['sh', 'run.sh'], auth },
        await makeBundle({ 'run.sh': '#!/bin/sh\necho v1\n', 'lib/data.txt': 'one\n' }),
      );
      assert.equal(v1.status, 201, v1.text);
      const v2 = await uploadAgent(server, key, { name: 'coder', entrypoint: ['sh', 'run.sh'], auth }, await makeBundle({ 'run.sh': '#!/bin/sh\necho v2\n' }));
      assert.equal(v2.status, 201, v2.text);
      await putSpec(SPEC('latest-coder', '{type: snapshot, snapshot: coder}'));
      await putSpec(SPEC('pinned-coder', `{type: snapshot, snapshot_id: ${v1.body.id}, entrypoint: [sh, run.sh, --verbose]}`));
      await server.request('PUT', '/v1/secrets/MODE', { key, body: { value: 'fast' } });
    });
    after(() => server.cleanup());

    test('the newest bundle is extracted read-only at /agent, outside the workspace state', async () => {
      const res = await req('POST', '/v1/sandboxes', { spec_id: 'latest-coder', secrets: { API_TOKEN: 'tok-123456' } });
      assert.equal(res.status, 201, res.text);
      const sb = res.body;
      assert.equal((await run(sb.id, 'sh /agent/run.sh')).stdout, 'v2\n');
      const write = await run(sb.id, 'touch /agent/new 2>&1; echo $?');
      assert.notEqual(write.stdout.trim().split('\n').at(-1), '0', 'the agent cannot change its own bundle');
      assert.match(write.stdout, /Read-only file system/);
      const state = await req('GET', `/v1/sandboxes/${sb.id}/state`);
      assert.ok(!Object.keys(state.body.files).some((f) => f.includes('run.sh')), 'the bundle is not in the workspace');

      // The config file is written with the secrets filled in; nothing the agent did.
      const config = await readFile(path.join(sb.path, '.config', 'coder', 'config.json'), 'utf8');
      assert.deepEqual(JSON.parse(config), { token: 'tok-123456', mode: 'fast' });
      const diff = await req('GET', `/v1/sandboxes/${sb.id}/diff`);
      assert.deepEqual(diff.body, { added: [], modified: [], removed: [] });

      // The agent's egress hosts joined the allow list: the sandbox has a network, whose resolver
      // answers that name (no refusal) and refuses another.
      assert.equal(sb.network?.egress, 'deny', JSON.stringify(sb.network));
      await run(sb.id, 'getent hosts api.openai.com; getent hosts not-allowed.example; true');
      let denied: string[] = [];
      for (let i = 0; i < 50 && !denied.includes('not-allowed.example'); i++) {
        const audit = await req('GET', `/v1/sandboxes/${sb.id}/files/.svc/audit.jsonl`);
        denied = audit.text
          .split('\n')
          .filter(Boolean)
          .map((l) => JSON.parse(l))
          .filter((r) => r.type === 'network_denied')
          .map((r) => r.details.host);
        await new Promise((r) => setTimeout(r, 100));
      }
      assert.deepEqual([...new Set(denied)], ['not-allowed.example']);
      await req('DELETE', `/v1/sandboxes/${sb.id}`);
    });

    test('a snapshot_id pins that exact version', async () => {
      const res = await req('POST', '/v1/sandboxes', { spec_id: 'pinned-coder', secrets: { API_TOKEN: 'x' } });
      assert.equal(res.status, 201, res.text);
      assert.equal((await run(res.body.id, 'sh /agent/run.sh; cat /agent/lib/data.txt')).stdout, 'v1\none\n');
      await req('DELETE', `/v1/sandboxes/${res.body.id}`);
    });

    test('a missing required env var fails the boot naming it', async () => {
      const res = await req('POST', '/v1/sandboxes', { spec_id: 'latest-coder' });
      assert.equal(res.status, 400);
      assert.match(res.body.message, /step secrets_resolved: required env var API_TOKEN of agent snapshot coder v2 is missing/);
      assert.deepEqual((await req('GET', '/v1/sandboxes')).body, []);
    });

    test('a config file whose secret is not set fails the boot naming the secret', async () => {
      await server.request('DELETE', '/v1/secrets/MODE', { key });
      const res = await req('POST', '/v1/sandboxes', { spec_id: 'latest-coder', secrets: { API_TOKEN: 'x' } });
      assert.equal(res.status, 400);
      assert.match(res.body.message, /step setup_applied: agent config file ~\/\.config\/coder\/config\.json: secret MODE is not set/);
      await server.request('PUT', '/v1/secrets/MODE', { key, body: { value: 'fast' } });
    });

    test('a spec whose agent no longer has snapshots cannot boot', async () => {
      const lone = await uploadAgent(server, key, { name: 'lonely', entrypoint: ['true'] }, await makeBundle({ 'a.txt': 'a' }));
      await putSpec(SPEC('lonely-spec', '{type: snapshot, snapshot: lonely}'));
      await server.request('DELETE', `/v1/snapshots/${lone.body.id}`, { key });
      const res = await req('POST', '/v1/sandboxes', { spec_id: 'lonely-spec' });
      assert.equal(res.status, 400);
      assert.match(res.body.message, /^agent\.snapshot: spec "lonely-spec" names agent "lonely", which has no stored snapshot/);
    });
  });
}
