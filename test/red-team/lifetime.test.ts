/**
 * Red team: a sandbox's lifetime. An agent tried to make its sandbox immortal with its own token
 * (`3650d`), a huge timeout was a 500 after the runner had applied it, and a DELETE after a
 * failed step left the sandbox `running`, holding its quota slot, with a live token. Every
 * duration is now bounded by SVC_SANDBOX_MAX_LIFETIME (a 400 naming the field, nothing sent to
 * the runner), the sandbox token cannot change its lifetime, and DELETE always ends a sandbox.
 */
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readdir, rm } from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { createTenantKey, startServer, type TestServer } from '../helpers/server.ts';
import { backend } from '../helpers/backend.ts';
import { SPEC, sandboxPids } from '../helpers/sandboxes.ts';

const QUOTA = 3;

const runtime = backend('SVC_TEST_BWRAP', 'red team: sandbox lifetime');

if (runtime) {
  describe('red team: a sandbox cannot outlive the maximum lifetime, and DELETE always ends it', () => {
    let server: TestServer;
    let key: string;
    const req = (method: string, p: string, body?: unknown, k = key) => server.request(method, p, { key: k, body });
    const create = async (body: Record<string, unknown> = {}, k = key) => {
      const res = await req('POST', '/v1/sandboxes', { spec_id: 'basic', ...body }, k);
      assert.equal(res.status, 201, res.text);
      return res.body;
    };
    const tokenOf = async (id: string, k = key) =>
      (await req('POST', `/v1/sandboxes/${id}/commands`, { command: 'printf %s "$SVC_API_KEY"' }, k)).body.stdout as string;
    const putSpec = async (yaml: string, k = key) =>
      server.request('POST', '/v1/specs', { key: k, body: yaml, headers: { 'content-type': 'application/x-yaml' } });

    before(async () => {
      server = await startServer({
        SVC_SANDBOX_HOST_ROOTFS: 'true',
        SVC_RATE_LIMIT_WRITES: '0',
        SVC_RATE_LIMIT_READS: '0',
        SVC_SANDBOX_MAX_LIFETIME: '1h',
        SVC_DEFAULT_PLAN: 'free',
        SVC_CONCURRENT_SANDBOXES_FREE: String(QUOTA),
      });
      key = (await createTenantKey(server, 'acme')).key;
      assert.equal((await putSpec(SPEC('basic'))).status, 201);
    });
    after(async () => server?.cleanup());

    test('the agent, through the bridge with its own token, cannot extend its sandbox (3650d)', async () => {
      const sb = await create();
      // The attack as the agent ran it: from inside, to the service through the sandbox's bridge.
      const script = `
import json, os, urllib.request, urllib.error
def post(body):
    r = urllib.request.Request(os.environ["SVC_BASE_URL"] + "/v1/sandboxes/" + os.environ["SVC_SANDBOX_ID"] + "/timeout", data=json.dumps(body).encode(), method="POST",
        headers={"authorization": "Bearer " + os.environ["SVC_API_KEY"], "content-type": "application/json"})
    try:
        return urllib.request.urlopen(r, timeout=20).status
    except urllib.error.HTTPError as e:
        return e.code
print(post({"timeout": "3650d"}), post({"extend": "3650d"}), post({"timeout": "99999999999999"}), post({"extend": "1m"}))
`;
      const inside = await req('POST', `/v1/sandboxes/${sb.id}/commands`, { command: `python3 -c '${script.replace(/'/g, `'\\''`)}'` });
      assert.equal(inside.status, 200, inside.text);
      assert.equal(inside.body.stdout.trim(), '403 403 403 403', `statuses from inside: ${inside.text}`);
      const now = await req('GET', `/v1/sandboxes/${sb.id}`);
      assert.equal(now.body.expires_at, sb.expires_at, 'nothing was applied');
      assert.equal((await req('DELETE', `/v1/sandboxes/${sb.id}`)).status, 200);
    });

    test('huge timeouts on create, on the timeout endpoint and on commands are 400s naming the field, and nothing is applied', async () => {
      for (const timeout of ['99999999999999', '3650d', '2h', 99999999999999]) {
        const res = await req('POST', '/v1/sandboxes', { spec_id: 'basic', timeout });
        assert.equal(res.status, 400, `create timeout ${timeout}: ${res.text}`);
        assert.match(res.body.message, /^timeout: .*at most 1h/);
      }
      assert.equal((await req('GET', '/v1/sandboxes')).body.length, 0, 'no sandbox was created');

      const sb = await create({ timeout: '10m' });
      const cases: Array<[Record<string, unknown>, RegExp]> = [
        [{ timeout: '99999999999999' }, /^timeout: .*at most 1h/],
        [{ timeout: 99999999999999 }, /^timeout: .*at most 1h/],
        [{ timeout: '3650d' }, /^timeout: .*at most 1h/],
        [{ extend: '3650d' }, /^extend: .*at most 1h/],
        [{ extend: '99999999999999' }, /^extend: .*at most 1h/],
        // Each step within the maximum, together past it: counted from the sandbox's creation.
        [{ extend: '55m' }, /^extend: .*1h after the sandbox was created/],
      ];
      for (const [body, message] of cases) {
        const res = await req('POST', `/v1/sandboxes/${sb.id}/timeout`, body);
        assert.equal(res.status, 400, `${JSON.stringify(body)}: ${res.text}`);
        assert.match(res.body.message, message);
        assert.equal((await req('GET', `/v1/sandboxes/${sb.id}`)).body.expires_at, sb.expires_at, `${JSON.stringify(body)} applied nothing`);
      }
      const ok = await req('POST', `/v1/sandboxes/${sb.id}/timeout`, { extend: '20m' });
      assert.equal(ok.status, 200, ok.text);
      assert.equal(Date.parse(ok.body.expires_at) - Date.parse(sb.expires_at), 20 * 60_000);

      const cmd = await req('POST', `/v1/sandboxes/${sb.id}/commands`, { command: 'true', timeout: '99999999999999' });
      assert.equal(cmd.status, 400, cmd.text);
      assert.match(cmd.body.message, /^timeout: .*at most 1h/);
      assert.equal((await req('POST', `/v1/sandboxes/${sb.id}/commands`, { command: 'echo alive' })).body.stdout, 'alive\n');
      assert.equal((await req('DELETE', `/v1/sandboxes/${sb.id}`)).status, 200);
    });

    test('a spec asking for more than the maximum is refused at upload, naming the path', async () => {
      const cases: Array<[string, RegExp]> = [
        ['resources:\n  timeout: 99999999999999\n', /resources\.timeout: .*at most 1h/],
        ['resources:\n  timeout: 3650d\n', /resources\.timeout: .*at most 1h/],
        ['agent:\n  type: cli\n  command: "true"\n  timeout: 3650d\n', /agent\.timeout: .*at most 1h/],
      ];
      for (const [extra, message] of cases) {
        const res = await putSpec(SPEC('too-long', extra));
        assert.equal(res.status, 400, `${extra}: ${res.text}`);
        assert.match(res.body.message, message);
      }
    });

    test('DELETE after a failed step (supervisor killed, workspace emptied, workspace that cannot be removed) still ends the sandbox, frees its slot and kills its token', async () => {
      // A tenant of its own: its quota counts only these sandboxes.
      const own = (await createTenantKey(server, 'quota')).key;
      assert.equal((await putSpec(SPEC('basic'), own)).status, 201);
      const sandboxes = [await create({}, own), await create({}, own), await create({}, own)];
      const [killed, emptied, stuck] = sandboxes;
      const tokens = await Promise.all(sandboxes.map((sb) => tokenOf(sb.id, own)));
      assert.equal((await req('POST', '/v1/sandboxes', { spec_id: 'basic' }, own)).status, 429, 'the quota is full');

      // One loses every process, its supervisor included.
      const pids = sandboxPids(killed.id);
      assert.ok(pids.length > 0, 'the sandbox has processes');
      for (const pid of pids) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          // already gone
        }
      }
      // One loses everything in its workspace, .svc included (the directory stays where it is a mount point).
      // Where each workspace is on the host: the sandbox's `path` (a warm one stays where it was made).
      for (const entry of await readdir(emptied.path)) await rm(path.join(emptied.path, entry), { recursive: true, force: true });
      // One cannot be removed: an immutable file in its workspace (made so from the host, as root), so the teardown's rm fails.
      await req('POST', `/v1/sandboxes/${stuck.id}/files`, { path: 'stuck.txt', content: 'x' }, own);
      const stuckFile = path.join(stuck.path, 'stuck.txt');
      const immutable = spawnSync('chattr', ['+i', stuckFile]).status === 0;

      try {
        for (const [i, sb] of sandboxes.entries()) {
          const del = await req('DELETE', `/v1/sandboxes/${sb.id}`, undefined, own);
          assert.equal(del.status, 200, `DELETE ${sb.id}: ${del.text}`);
          assert.equal((await req('GET', `/v1/sandboxes/${sb.id}`, undefined, own)).status, 404, 'gone');
          assert.equal((await req('GET', `/v1/sandboxes/${sb.id}`, undefined, tokens[i])).status, 401, 'its token is dead');
          assert.equal((await req('DELETE', `/v1/sandboxes/${sb.id}`, undefined, own)).status, 200, 'a second DELETE is fine too');
        }
      } finally {
        if (immutable) spawnSync('chattr', ['-i', stuckFile]);
      }
      // Every slot is free: the quota is reached again with new sandboxes.
      const again = [await create({}, own), await create({}, own), await create({}, own)];
      assert.equal((await req('POST', '/v1/sandboxes', { spec_id: 'basic' }, own)).status, 429);
      for (const sb of again) assert.equal((await req('DELETE', `/v1/sandboxes/${sb.id}`, undefined, own)).status, 200);
    });
  });
}
