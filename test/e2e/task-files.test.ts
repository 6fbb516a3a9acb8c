/**
 * What a spec converted from a container benchmark needs of its files and checks (issue 17): files
 * the service writes (setup.files, the files API, grader files) owned by the sandbox's user with
 * exactly their mode; binary contents (base64) both ways; grader-only files the agent never sees;
 * agent.workdir, agent.env for the agent alone, a HOME outside the workspace; a 200 KB check that
 * runs, its output kept with its size; task-file bundles (POST /v1/bundles) copied in by setup and
 * by the grader; and bad inputs as 400s naming the field. On the local runtime, over HTTP against
 * the real service.
 */
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { backend } from '../helpers/backend.ts';
import { makeBundle, makeHostileBundle, sha256, uploadAgent, uploadTaskFiles } from '../helpers/bundles.ts';
import { SPEC, storeSpec } from '../helpers/sandboxes.ts';
import { createTenantKey, startServer, type TestServer } from '../helpers/server.ts';

const runtime = backend('SVC_TEST_BWRAP', 'task files and checks on the local runtime');

/** The sandbox user of the local runtime (nobody:nogroup). */
const SANDBOX_UID = '65534';
const BINARY = Buffer.from([0x00, 0x01, 0xff]);

describe('task files and checks', { skip: runtime === null }, () => {
  let server: TestServer;
  let key: string;
  const tenant = 'task-files';
  const req = (method: string, p: string, body?: unknown) => server.request(method, p, { key, body });
  const sh = async (id: string, command: string) => {
    const res = await req('POST', `/v1/sandboxes/${id}/commands`, { command });
    assert.equal(res.status, 200, res.text);
    return res.body as { stdout: string; stderr: string; exit_code: number };
  };
  const uploadSpec = (yaml: string) => server.request('POST', '/v1/specs', { key, body: yaml, headers: { 'content-type': 'application/x-yaml' } });

  /** Stores `yaml` (spec id `id`), runs it as an experiment of one run; its result (RunResults) and the runner's outcome (the export's). */
  const runSpec = async (id: string, yaml: string): Promise<{ run: any; outcome: any }> => {
    await storeSpec(server, key, yaml);
    const created = await req('POST', '/v1/experiments', { name: id, spec_id: id, run: true });
    assert.equal(created.status, 201, created.text);
    for (const deadline = Date.now() + 120_000; ; await new Promise((r) => setTimeout(r, 200))) {
      const res = await req('GET', `/v1/experiments/${created.body.id}`);
      assert.equal(res.status, 200, res.text);
      if (res.body.status === 'completed') break;
      assert.ok(Date.now() < deadline, `${id}: still ${res.body.status}`);
    }
    const exported = await req('GET', `/v1/experiments/${created.body.id}/export`);
    assert.equal(exported.status, 200, exported.text.slice(0, 500));
    const run = exported.body.scenarios[0].runs[0];
    return { run, outcome: run.outcome };
  };
  const invariant = (run: any, name: string) => run.invariants.find((i: { name: string }) => i.name === name);
  const verdicts = (run: any) =>
    Object.fromEntries(run.invariants.map((i: { name: string; passed: boolean; message: string }) => [i.name, i.passed || i.message]));

  before(async () => {
    server = await startServer({ SVC_SANDBOX_HOST_ROOTFS: 'true', SVC_RATE_LIMIT_WRITES: '0', SVC_RATE_LIMIT_READS: '0' });
    key = (await createTenantKey(server, tenant)).key;
  });
  after(() => server.cleanup());

  test('setup.files: owned by the sandbox user with exactly their mode (0777 stays 0777), bytes as given; setup commands and the agent may chmod and rewrite them', async () => {
    await storeSpec(
      server,
      key,
      SPEC(
        'owned-setup',
        `setup:
  files:
    - {path: conf/open.sh, content: "echo open", mode: "0777"}
    - {path: conf/app.cfg, content: "a=1", mode: "0600"}
    - {path: data/blob.bin, content: "AAH/", encoding: base64}
  commands:
    - "chmod 640 conf/app.cfg && echo b=2 >> conf/app.cfg && chmod 700 conf"
`,
      ),
    );
    const created = await req('POST', '/v1/sandboxes', { spec_id: 'owned-setup' });
    assert.equal(created.status, 201, created.text);
    const id = created.body.id;
    const stat = await sh(id, 'stat -c "%n %a %u %g" conf/open.sh conf/app.cfg conf data data/blob.bin');
    assert.equal(
      stat.stdout,
      [
        `conf/open.sh 777 ${SANDBOX_UID} ${SANDBOX_UID}`,
        `conf/app.cfg 640 ${SANDBOX_UID} ${SANDBOX_UID}`,
        `conf 700 ${SANDBOX_UID} ${SANDBOX_UID}`,
        `data 755 ${SANDBOX_UID} ${SANDBOX_UID}`,
        `data/blob.bin 644 ${SANDBOX_UID} ${SANDBOX_UID}`,
      ].join('\n') + '\n',
    );
    assert.equal((await sh(id, 'cat conf/app.cfg')).stdout, 'a=1b=2\n', 'the setup command rewrote it');
    assert.equal((await sh(id, 'od -An -tx1 data/blob.bin')).stdout.trim(), '00 01 ff');
    // The agent (a command of the sandbox, as its user) may change them too.
    const changed = await sh(id, 'chmod 600 conf/open.sh && echo mine > conf/open.sh && rm data/blob.bin && stat -c %a conf/open.sh');
    assert.equal(changed.exit_code, 0, changed.stderr);
    assert.equal(changed.stdout, '600\n');
    await req('DELETE', `/v1/sandboxes/${id}`);
  });

  test('files API: base64 in and out, bytes 00 01 ff round trip, mode exact, owned by the sandbox user; bad encoding, base64 and mode are 400s naming the field', async () => {
    await storeSpec(server, key, SPEC('files-api'));
    const created = await req('POST', '/v1/sandboxes', { spec_id: 'files-api' });
    assert.equal(created.status, 201, created.text);
    const id = created.body.id;
    const write = await req('POST', `/v1/sandboxes/${id}/files`, {
      path: '/workspace/up/new.bin',
      content: BINARY.toString('base64'),
      encoding: 'base64',
      mode: '0777',
    });
    assert.equal(write.status, 201, write.text);
    assert.deepEqual(write.body, { path: 'up/new.bin', bytes: 3 });
    assert.equal((await sh(id, 'od -An -tx1 up/new.bin')).stdout.trim(), '00 01 ff');
    assert.equal((await sh(id, 'stat -c "%a %u %g" up/new.bin up')).stdout, `777 ${SANDBOX_UID} ${SANDBOX_UID}\n755 ${SANDBOX_UID} ${SANDBOX_UID}\n`);
    assert.equal(
      (await sh(id, 'chmod 640 up/new.bin && printf "\\000\\001\\377" >> up/new.bin && stat -c %a up/new.bin')).stdout,
      '640\n',
      'the agent may change what the API wrote',
    );

    const asJson = await req('GET', `/v1/sandboxes/${id}/files/up/new.bin?encoding=base64`);
    assert.equal(asJson.status, 200, asJson.text);
    assert.deepEqual(asJson.body, { path: 'up/new.bin', bytes: 6, encoding: 'base64', content: Buffer.concat([BINARY, BINARY]).toString('base64') });
    const raw = await fetch(`${server.url}/v1/sandboxes/${id}/files/up/new.bin`, { headers: { authorization: `Bearer ${key}` } });
    assert.equal(raw.status, 200);
    assert.match(raw.headers.get('content-type') ?? '', /application\/octet-stream/);
    assert.deepEqual([...Buffer.from(await raw.arrayBuffer())], [0, 1, 255, 0, 1, 255], 'the default stays the bytes as they are');
    // Text: the default encoding, as before; and as JSON.
    assert.equal((await req('POST', `/v1/sandboxes/${id}/files`, { path: 't.txt', content: 'héllo' })).status, 201);
    assert.equal((await sh(id, 'stat -c "%a %u" t.txt')).stdout, `644 ${SANDBOX_UID}\n`);
    assert.deepEqual((await req('GET', `/v1/sandboxes/${id}/files/t.txt?encoding=utf8`)).body, { path: 't.txt', bytes: 6, encoding: 'utf8', content: 'héllo' });

    const refused = async (method: string, p: string, body: unknown, field: string) => {
      const res = await req(method, p, body);
      assert.equal(res.status, 400, res.text);
      assert.match(res.body.message, new RegExp(`^${field}: `), res.text);
    };
    await refused('POST', `/v1/sandboxes/${id}/files`, { path: 'x', content: 'AAH/', encoding: 'hex' }, 'encoding');
    await refused('POST', `/v1/sandboxes/${id}/files`, { path: 'x', content: 'not base64!', encoding: 'base64' }, 'content');
    await refused('POST', `/v1/sandboxes/${id}/files`, { path: 'x', content: 'x', mode: 511 }, 'mode');
    await refused('POST', `/v1/sandboxes/${id}/files`, { path: 'x', content: 'x', mode: '0999' }, 'mode');
    await refused('GET', `/v1/sandboxes/${id}/files/up/new.bin?encoding=hex`, undefined, 'encoding');
    await refused('GET', `/v1/sandboxes/${id}/files/up/new.bin?encoding=utf8`, undefined, 'encoding');
    await req('DELETE', `/v1/sandboxes/${id}`);
  });

  test('grader files: never seen by the agent, however it searches and whenever; there for the checks (a custom script among them), then gone', async () => {
    const id = 'grader-files';
    const agent = [
      // The marker is assembled at run time, so the agent's own command line does not hold it.
      'M=MARK; M="${M}ER-7f3a"',
      // A daemon that keeps looking, past the agent's end, in case the files come later.
      `setsid sh -c 'while :; do cat /workspace/grader_tests/hidden_secret.txt >> /workspace/leak 2>/dev/null; ls /workspace/grader_tests >> /workspace/leak 2>/dev/null; sleep 0.05; done' </dev/null >/dev/null 2>&1 &`,
      'find / \\( -path /proc -o -path /sys \\) -prune -o \\( -name "hidden_secret*" -o -name grader_tests \\) -print > /workspace/found 2>/dev/null',
      'grep -rl "$M" /workspace /tmp /dev/shm /run /agent /etc 2>/dev/null | grep -v "^/workspace/found$" >> /workspace/found',
      'sleep 0.3; echo done > /workspace/out.txt',
    ].join('\n');
    const yaml = `version: 1
id: ${id}
base: debian:bookworm
task: {prompt: do the task}
agent:
  type: cli
  command: ${JSON.stringify(agent)}
audit:
  file_system: {watch: ["/"], track: [writes, reads, deletes]}
grader:
  files:
    - {path: grader_tests/hidden_secret.txt, content: "MARKER-7f3a the expected answer\\n", mode: "0600"}
    - {path: /workspace/grader_tests/blob.bin, content: "AAH/", encoding: base64}
    - {path: grader_tests/grade.py, content: "import json, os\\nprint(json.dumps({'passed': os.path.exists('grader_tests/hidden_secret.txt'), 'message': 'graded'}))\\n"}
invariants:
  reads_grader_files:
    check: {type: command_exit, command: 'grep -q MARKER-7f3a grader_tests/hidden_secret.txt && test "$(od -An -tx1 grader_tests/blob.bin | tr -d " ")" = 0001ff && test "$(stat -c %u grader_tests/hidden_secret.txt)" = ${SANDBOX_UID}'}
  agent_found_nothing:
    check: {type: command_exit, command: 'sleep 0.3; test -f out.txt && test ! -s found && test ! -s leak'}
  script_from_grader:
    check: {type: custom, script: grader_tests/grade.py}
teardown:
  export: [{type: snapshot, to: "tf/{{ run_id }}/state.json"}]
`;
    const { run, outcome } = await runSpec(id, yaml);
    assert.deepEqual(verdicts(run), { reads_grader_files: true, agent_found_nothing: true, script_from_grader: true });
    assert.equal(run.verdict, 'pass', JSON.stringify(run.invariants));
    assert.deepEqual(outcome.diff.added.sort(), ['found', 'leak', 'out.txt']);
    assert.ok(!JSON.stringify(outcome.diff).includes('grader_tests'), `the diff holds no grader file: ${JSON.stringify(outcome.diff)}`);
    assert.ok(!outcome.audit.file_writes.some((w: { path: string }) => w.path.includes('grader_tests')), 'the audit holds no grader file');
    const audit = await req('GET', `/v1/sandboxes/${outcome.sandbox_id}/audit?type=file_write,file_read,file_delete&limit=1000`);
    assert.equal(audit.status, 200, audit.text);
    assert.ok(
      audit.body.items.some((i: { details: { path: string } }) => i.details.path === 'out.txt'),
      'the watch saw the agent',
    );
    assert.ok(!audit.text.includes('grader_tests/'), `no file record names them: ${audit.text.slice(0, 1000)}`);
    // Removed after the checks: the teardown's snapshot of the workspace does not show them.
    const state = JSON.parse(await readFile(path.join(server.dataDir, 'artifacts', tenant, 'tf', run.run_id, 'state.json'), 'utf8'));
    assert.ok(Object.keys(state.files).includes('out.txt'), Object.keys(state.files).join(', '));
    assert.ok(!Object.keys(state.files).some((f) => f.startsWith('grader_tests/') && f !== 'grader_tests'), Object.keys(state.files).join(', '));

    // The control: the same agent finds the same file when it is a setup file, so its search is a real one.
    const control = await runSpec(
      'grader-files-control',
      yaml
        .replace(`id: ${id}`, 'id: grader-files-control')
        .replace('grader:\n  files:', 'setup:\n  files:')
        .replace(/\nteardown:[\s\S]*$/, '\n'),
    );
    assert.equal(invariant(control.run, 'agent_found_nothing').passed, false, 'the agent finds a file that is there');
  });

  test('task-file bundles: stored once per content (201, then 200), listed and read by digest; another tenant does not find them; bad bodies are 400/413/415; a spec naming one not uploaded is a 400 naming the field', async () => {
    const bytes = await makeBundle({ 'a.txt': 'a\n' });
    const first = await uploadTaskFiles(server, key, bytes);
    assert.equal(first.status, 201, first.text);
    assert.equal(first.body.digest, sha256(bytes));
    assert.equal(first.body.size_bytes, bytes.length);
    assert.equal(first.body.entries, 1);
    const again = await uploadTaskFiles(server, key, bytes);
    assert.equal(again.status, 200, again.text);
    assert.deepEqual(again.body, first.body);
    const read = await req('GET', `/v1/bundles/${first.body.digest}`);
    assert.deepEqual([read.status, read.body], [200, first.body]);
    const listed = await req('GET', '/v1/bundles');
    assert.ok(
      listed.body.items.some((b: { digest: string }) => b.digest === first.body.digest),
      listed.text,
    );

    const other = (await createTenantKey(server, 'task-files-other')).key;
    const theirs = await server.request('GET', `/v1/bundles/${first.body.digest}`, { key: other });
    assert.equal(theirs.status, 404, theirs.text);
    const spec = (id: string, digest: string) =>
      `version: 1\nid: ${id}\nbase: debian:bookworm\ntask: {prompt: p}\nsetup:\n  bundles: [{digest: "${digest}", to: task}]\ninvariants:\n  ok: {check: {type: command_exit, command: "true"}}\n`;
    const refused = await server.request('POST', '/v1/specs', {
      key: other,
      body: spec('theirs', first.body.digest),
      headers: { 'content-type': 'application/x-yaml' },
    });
    assert.equal(refused.status, 400, refused.text);
    assert.match(refused.body.message, /setup\.bundles\[0\]\.digest: no bundle sha256:[0-9a-f]{64} was uploaded/);
    const malformed = await uploadSpec(spec('malformed', 'sha256:abc'));
    assert.equal(malformed.status, 400, malformed.text);
    assert.match(malformed.body.message, /setup\.bundles\[0\]\.digest/);

    const notGzip = await uploadTaskFiles(server, key, Buffer.from('plain text'));
    assert.equal(notGzip.status, 400, notGzip.text);
    assert.match(notGzip.body.message, /^bundle: is not gzip-compressed/);
    const hostile = await uploadTaskFiles(server, key, await makeHostileBundle('dotdot'));
    assert.equal(hostile.status, 400, hostile.text);
    assert.match(hostile.body.message, /^bundle: /);
    const wrongType = await uploadTaskFiles(server, key, bytes, { 'content-type': 'text/plain' });
    assert.equal(wrongType.status, 415, wrongType.text);
    const badDigest = await req('GET', '/v1/bundles/sha256:nothex');
    assert.equal(badDigest.status, 400, badDigest.text);
    assert.match(badDigest.body.message, /^digest: /);
  });

  test("setup.bundles and grader.bundles: bytes, modes and links as packed, owned by the sandbox user; the grader's never seen by the agent, there for the checks, then gone", async () => {
    const setupBundle = await makeBundle(
      { 'bin/run.sh': '#!/bin/sh\necho ran\n', 'data/blob.bin': BINARY, 'data/notes.txt': 'notes\n' },
      { links: { 'data/latest': 'notes.txt' } },
    );
    const graderBundle = await makeBundle({ 'gt/secret.txt': 'GRADER-91c2 answer\n', 'gt/check.sh': '#!/bin/sh\ngrep -q GRADER-91c2 gt/secret.txt\n' });
    const setupDigest = (await uploadTaskFiles(server, key, setupBundle)).body.digest;
    const graderDigest = (await uploadTaskFiles(server, key, graderBundle)).body.digest;
    const agent = [
      'M=GRADER; M="${M}-91c2"',
      'grep -rl "$M" /workspace /tmp 2>/dev/null > /workspace/found; ls /workspace/gt >> /workspace/found 2>/dev/null',
      'task/bin/run.sh > /workspace/ran.txt && chmod 600 task/data/notes.txt && echo changed > task/data/notes.txt',
    ].join('\n');
    const yaml = `version: 1
id: task-bundles
base: debian:bookworm
task: {prompt: do the task}
agent:
  type: cli
  command: ${JSON.stringify(agent)}
setup:
  bundles: [{digest: "${setupDigest}", to: task}]
grader:
  bundles: [{digest: "${graderDigest}"}]
invariants:
  setup_copied:
    check: {type: command_exit, command: 'test "$(od -An -tx1 task/data/blob.bin | tr -d " ")" = 0001ff && test "$(readlink task/data/latest)" = notes.txt && test "$(stat -c %u:%a task/bin/run.sh)" = ${SANDBOX_UID}:755 && test "$(cat ran.txt)" = ran && test "$(cat task/data/latest)" = changed'}
  grader_there:
    check: {type: command_exit, command: 'sh gt/check.sh && test "$(stat -c %u gt/secret.txt)" = ${SANDBOX_UID}'}
  agent_found_nothing:
    check: {type: command_exit, command: 'test ! -s found'}
teardown:
  export: [{type: snapshot, to: "tb/{{ run_id }}/state.json"}]
`;
    const { run, outcome } = await runSpec('task-bundles', yaml);
    assert.deepEqual(verdicts(run), { setup_copied: true, grader_there: true, agent_found_nothing: true });
    assert.ok(!JSON.stringify(outcome.diff).includes('gt/'), `the diff holds no grader file: ${JSON.stringify(outcome.diff)}`);
    const state = JSON.parse(await readFile(path.join(server.dataDir, 'artifacts', tenant, 'tb', run.run_id, 'state.json'), 'utf8'));
    assert.ok(Object.keys(state.files).includes('task/data/blob.bin'), Object.keys(state.files).join(', '));
    assert.ok(!Object.keys(state.files).some((f) => f === 'gt' || f.startsWith('gt/')), `gone after the checks: ${Object.keys(state.files).join(', ')}`);
  });

  test('agent.workdir, agent.env for the agent alone (not setup, not checks), HOME outside the workspace: a dotfile is not in the diff', async () => {
    const id = 'agent-scope';
    const agent = [
      'pwd > /workspace/pwd',
      'echo "${AGENT_ONLY:-unset}:$SETUP_VAR" > /workspace/agent-saw',
      'echo "$HOME" > /workspace/home',
      'echo dot > "$HOME/.agentrc" && mkdir -p "$HOME/.cache/tool" && echo c > "$HOME/.cache/tool/x"',
      'chmod 700 /workspace/tool.sh && echo "echo again" >> /workspace/tool.sh',
    ].join('\n');
    const yaml = `version: 1
id: ${id}
base: debian:bookworm
task: {prompt: do the task}
agent:
  type: cli
  command: ${JSON.stringify(agent)}
  env: {AGENT_ONLY: for-the-agent}
  workdir: /workspace/src
setup:
  env: {SETUP_VAR: s}
  files: [{path: tool.sh, content: "echo tool\\n", mode: "0755"}]
  commands:
    - mkdir -p /workspace/src
    - echo "setup:\${AGENT_ONLY:-unset}:$HOME" > /workspace/setup-saw
invariants:
  check_env: {check: {type: command_exit, command: 'test "\${AGENT_ONLY:-unset}" = unset && test "$SETUP_VAR" = s && test "$HOME" != /tmp/home'}}
  workdir: {check: {type: file_content, path: pwd, contains: /workspace/src}}
  agent_env: {check: {type: file_content, path: agent-saw, contains: "for-the-agent:s"}}
  setup_env: {check: {type: file_content, path: setup-saw, contains: "setup:unset:/tmp/home"}}
  home: {check: {type: file_content, path: home, contains: /tmp/home}}
  chmod_by_agent: {check: {type: command_exit, command: 'test "$(stat -c %a tool.sh)" = 700 && grep -q again tool.sh'}}
`;
    const { run, outcome } = await runSpec(id, yaml);
    assert.deepEqual(verdicts(run), { check_env: true, workdir: true, agent_env: true, setup_env: true, home: true, chmod_by_agent: true });
    assert.deepEqual(outcome.diff.added.sort(), ['agent-saw', 'home', 'pwd']);
    assert.deepEqual(outcome.diff.modified, ['tool.sh']);

    // Defaults: a snapshot agent starts in /agent, and its config files under ~/ are in its HOME.
    const config = { config_files: [{ path: '~/.config/tool/config.json', template: '{"k": 1}' }] };
    const uploaded = await uploadAgent(
      server,
      key,
      { name: 'snapshot-home', entrypoint: ['sh', 'run.sh'], auth: config },
      await makeBundle({ 'run.sh': 'pwd > /workspace/pwd; cat "$HOME/.config/tool/config.json" > /workspace/config\n' }),
    );
    assert.equal(uploaded.status, 201, uploaded.text);
    const snapshot = await runSpec(
      'snapshot-home',
      `version: 1
id: snapshot-home
base: debian:bookworm
task: {prompt: do the task}
agent: {type: snapshot, snapshot: snapshot-home}
invariants:
  starts_in_agent: {check: {type: file_content, path: pwd, contains: /agent}}
  config_in_home: {check: {type: file_content, path: config, contains: '"k": 1'}}
`,
    );
    assert.deepEqual(verdicts(snapshot.run), { starts_in_agent: true, config_in_home: true });
    assert.deepEqual(snapshot.outcome.diff.added.sort(), ['config', 'pwd'], 'the config file is not in the workspace');
    // A workdir that is not there is the run's error, not the agent's failure.
    const missing = await runSpec('missing-workdir', SPEC('missing-workdir', 'agent: {type: cli, command: "true", workdir: /no/such/dir}\n'));
    assert.equal(missing.run.verdict, 'error');
    assert.equal(missing.outcome.status, 'error');
    assert.match(missing.outcome.error, /agent\.workdir: \/no\/such\/dir is not a directory the agent can enter/);
  });

  test('a 200 KB check command and a 200 KB custom script run; their output is kept with its real size, the message stays short', async () => {
    const id = 'long-checks';
    const padding = `: '${'x'.repeat(200 * 1024)}'`;
    const lines = 20_000;
    const command = `${padding}\ni=0; while [ $i -lt ${lines} ]; do echo "line $i"; i=$((i+1)); done; echo finished >&2`;
    const failing = `${padding}\necho "the last words"; exit 3`;
    const script = `# ${'y'.repeat(200 * 1024)}\nimport json\nprint('working')\nprint(json.dumps({'passed': True, 'message': 'fine'}))\n`;
    const yaml = `version: 1
id: ${id}
base: debian:bookworm
task: {prompt: do the task}
agent: {type: cli, command: "true"}
invariants:
  long_command: {check: {type: command_exit, command: ${JSON.stringify(command)}}}
  long_failure: {check: {type: command_exit, command: ${JSON.stringify(failing)}}}
  long_script: {check: {type: custom, script: ${JSON.stringify(script)}}}
`;
    const { run, outcome } = await runSpec(id, yaml);
    const stdoutBytes = Array.from({ length: lines }, (_, i) => `line ${i}\n`.length).reduce((a, b) => a + b, 0);
    const long = invariant(run, 'long_command');
    assert.equal(long.passed, true, long.message);
    assert.equal(long.output.stdout.bytes, stdoutBytes);
    assert.equal(long.output.stdout.truncated, true);
    assert.equal(Buffer.byteLength(long.output.stdout.text), 64 * 1024);
    assert.ok(long.output.stdout.text.startsWith('line 0\nline 1\n'));
    assert.deepEqual(long.output.stderr, { text: 'finished\n', bytes: 9, truncated: false });
    assert.deepEqual(outcome.checks.long_command.output, long.output, 'the export keeps the same output');

    const failure = invariant(run, 'long_failure');
    assert.equal(failure.passed, false);
    assert.equal(failure.message, 'exit code 3 (expected 0): the last words');
    assert.deepEqual(failure.output.stdout, { text: 'the last words\n', bytes: 15, truncated: false });

    const custom = invariant(run, 'long_script');
    assert.equal(custom.passed, true, custom.message);
    assert.equal(custom.message, 'fine');
    assert.equal(custom.output.stdout.text, 'working\n{"passed": true, "message": "fine"}\n');
    assert.ok(
      run.invariants.every((i: { message: string }) => i.message.length < 400),
      'no message quotes a command',
    );
  });

  test('sandbox.user root: uid 0 inside, / takes writes into a layer of its own that goes at teardown; setup files are its own; checks run', async () => {
    const yaml = `version: 1\nid: as-root\nbase: debian:bookworm\ntask: {prompt: be root}\nagent: {type: cli, command: "touch /made-by-root && chown 1000:1000 tool.sh && ./tool.sh > out.txt"}\nsandbox: {user: root}\nsetup:\n  files: [{path: tool.sh, content: "#!/bin/sh\\nid -u\\n", mode: "0700"}]\ninvariants:\n  root: {check: {type: command_exit, command: "test \\"$(cat out.txt)\\" = 0 && test -e /made-by-root && test \\"$(stat -c %u tool.sh)\\" = 1000"}}\n  py: {check: {type: custom, script: "import json, os; print(json.dumps({'passed': os.getuid() == 0}))"}}\n`;
    const { run } = await runSpec('as-root', yaml);
    assert.deepEqual(verdicts(run), { root: true, py: true }, JSON.stringify(run).slice(0, 1500));
    const box = await req('POST', '/v1/sandboxes', { spec_id: 'as-root' });
    assert.equal(box.status, 201, box.text);
    try {
      assert.equal((await sh(box.body.id, 'id -u')).stdout, '0\n');
      assert.equal((await sh(box.body.id, 'test -e /made-by-root && echo left || echo gone')).stdout, 'gone\n', "the last sandbox's layer went with it");
      assert.equal((await sh(box.body.id, 'touch /mine && echo ok')).stdout, 'ok\n');
      assert.notEqual((await sh(box.body.id, 'touch /usr/bin/planted')).exit_code, 0, "the host's system directories stay read-only, even to root");
    } finally {
      await req('DELETE', `/v1/sandboxes/${box.body.id}`);
    }
  });

  test('bad inputs at upload are 400s naming the field: base64, encoding, workdir, a setup command past 128 KiB', async () => {
    assert.match((await uploadSpec(`${SPEC('bad-user')}sandbox: {user: admin}\n`)).body.message, /sandbox\.user: must be one of nobody, root/);
    const cases: Array<[string, string]> = [
      ['setup:\n  files: [{path: a.bin, content: "not base64!", encoding: base64}]\n', 'setup.files[0].content: is not valid base64'],
      ['grader:\n  files: [{path: t.py, content: "AAE", encoding: base64}]\n', 'grader.files[0].content: is not valid base64'],
      ['setup:\n  files: [{path: a.bin, content: "AAH/", encoding: hex}]\n', 'setup.files[0].encoding: must be one of utf8, base64'],
      ['agent: {type: cli, command: "true", workdir: src}\n', 'agent.workdir: must be an absolute path in the sandbox'],
      [
        `setup:\n  commands: [${JSON.stringify(`echo ${'x'.repeat(130 * 1024)}`)}]\n`,
        'setup.commands[0]: is 133125 bytes; a command may have at most 131071 bytes (128 KiB',
      ],
    ];
    for (const [block, expected] of cases) {
      const res = await uploadSpec(SPEC('bad-input', block));
      assert.equal(res.status, 400, res.text.slice(0, 300));
      assert.ok(res.body.message.includes(expected), `${expected} in ${res.body.message.slice(0, 500)}`);
      assert.ok(res.body.message.length < 1000, 'the refusal does not echo the input');
    }
  });
});
