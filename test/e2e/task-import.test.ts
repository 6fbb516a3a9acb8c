/**
 * `svc import` (issue 17): a Terminal-Bench task folder (task.yaml, Dockerfile with a COPY from
 * its folder, run-tests.sh, tests/, solution.sh) imported with the real CLI into the service's
 * image store, its two specs stored and run as experiments: the reference solution passes, no
 * agent fails. The task's image comes FROM an image on a registry on loopback.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { promisify } from 'node:util';
import { backend } from '../helpers/backend.ts';
import { buildImage, push, REGISTRY_BINARY, shellLayer, startRegistry, tarOf, type TestRegistry } from '../helpers/oci-registry.ts';
import { storeSpec } from '../helpers/sandboxes.ts';
import { createTenantKey, REPO, startServer, type TestServer } from '../helpers/server.ts';

const run = promisify(execFile);
const runtime = backend('SVC_TEST_BWRAP', 'svc import on the local runtime');

describe('svc import of a Terminal-Bench task', { skip: runtime === null || !existsSync(REGISTRY_BINARY) }, () => {
  let registry: TestRegistry;
  let server: TestServer;
  let key: string;
  let dir: string;

  before(async () => {
    registry = await startRegistry();
    await push(registry, 'shell', '1', buildImage([tarOf(shellLayer())]));
    server = await startServer({ SVC_REGISTRY_INSECURE: registry.host, SVC_RATE_LIMIT_WRITES: '0', SVC_RATE_LIMIT_READS: '0' });
    key = (await createTenantKey(server, 'bench')).key;
    dir = mkdtempSync(path.join(os.tmpdir(), 'svc-task-'));
    const task = path.join(dir, 'copy-secret');
    mkdirSync(path.join(task, 'tests'), { recursive: true });
    const files: Record<string, string> = {
      'task.yaml':
        'instruction: |\n  Copy the line of /app/data.txt into /app/answer.txt.\nmax_agent_timeout_sec: 60\nmax_test_timeout_sec: 30\ndifficulty: easy\n',
      Dockerfile: `FROM ${registry.host}/shell:1\nWORKDIR /app\nCOPY data.txt /app/data.txt\n`,
      'data.txt': 'secret-input\n',
      'solution.sh': 'read line < /app/data.txt\necho "$line" > /app/answer.txt\n',
      'run-tests.sh': 'read got < /app/answer.txt || exit 1\nread want < "$TEST_DIR/expected.txt"\n[ "$got" = "$want" ]\n',
      'tests/expected.txt': 'secret-input\n',
    };
    for (const [file, content] of Object.entries(files)) writeFileSync(path.join(task, file), content);
  });
  after(async () => {
    await server?.cleanup();
    await registry?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  /** Runs spec `id` as an experiment of one run; its run's RunResult. */
  const runSpec = async (id: string) => {
    const created = await server.request('POST', '/v1/experiments', { key, body: { name: id, spec_id: id, run: true } });
    assert.equal(created.status, 201, created.text);
    for (const deadline = Date.now() + 120_000; ; await new Promise((r) => setTimeout(r, 250))) {
      const res = await server.request('GET', `/v1/experiments/${created.body.id}`, { key });
      if (res.body.status === 'completed') return res.body.scenarios[0].runs[0];
      assert.ok(Date.now() < deadline, `${id}: still ${res.body.status}`);
    }
  };

  test("the reference solution passes, no agent fails; the tests were the grader's only", { timeout: 240_000 }, async () => {
    const out = path.join(dir, 'specs');
    const cli = await run(process.execPath, ['--import', 'tsx', path.join(REPO, 'services', 'cli.ts'), 'import', path.join(dir, 'copy-secret'), '--out', out], {
      cwd: REPO,
      env: { ...process.env, SVC_DATA_DIR: server.dataDir, SVC_REGISTRY_INSECURE: registry.host },
    });
    assert.match(cli.stdout, /built imported\/copy-secret:1/);
    const spec = readFileSync(path.join(out, 'copy-secret.yaml'), 'utf8');
    assert.match(spec, /base: imported\/copy-secret:1/);
    assert.match(spec, /Copy the line of \/app\/data\.txt/);
    await storeSpec(server, key, spec);
    await storeSpec(server, key, readFileSync(path.join(out, 'copy-secret.solution.yaml'), 'utf8'));
    const solved = await runSpec('copy-secret-solution');
    assert.equal(solved.verdict, 'pass', JSON.stringify(solved).slice(0, 1500));
    const empty = await runSpec('copy-secret');
    assert.equal(empty.verdict, 'fail', JSON.stringify(empty).slice(0, 1500));
  });

  test('a folder that is no task is one clear line', async () => {
    const err = await run(process.execPath, ['--import', 'tsx', path.join(REPO, 'services', 'cli.ts'), 'import', dir], {
      cwd: REPO,
      env: { ...process.env, SVC_DATA_DIR: server.dataDir },
    }).then(
      () => null,
      (e: { stderr: string }) => e,
    );
    assert.ok(err, 'it fails');
    assert.match(err.stderr, /is neither a Terminal-Bench task \(task\.yaml\) nor a Harbor task \(task\.toml\)/);
    assert.equal(err.stderr.trim().split('\n').length, 1, err.stderr);
  });
});
