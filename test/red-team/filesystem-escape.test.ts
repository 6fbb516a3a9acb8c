/**
 * Red team: the host's filesystem through the workspace. A tenant's spec wrote a root-owned file
 * in /etc/ssl/certs (`setup.files` followed a link a `copy` fixture brought in), an agent bundle's
 * links escaped through each other, `setup.files` overwrote the audit log, and GET state listed a
 * root-only host directory the agent swapped in (renameat2 RENAME_EXCHANGE) mid-capture; the
 * audit watcher did the same for new directories, and the files API answered such a race with a
 * 500. Every host-side access now goes through one path-safe layer (workspace/beneath.ts).
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { chmod, mkdtemp, readdir, readFile, realpath, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { backend } from '../helpers/backend.ts';
import { SPEC } from '../helpers/sandboxes.ts';
import { makeBundle, uploadAgent } from '../helpers/bundles.ts';
import { createTenantKey, startServer, type TestServer } from '../helpers/server.ts';

/** Run inside the sandbox, in the background: swaps two names with renameat2(RENAME_EXCHANGE) until killed. */
const SWAP = (a: string, b: string) =>
  `python3 -c 'import ctypes,sys
libc = ctypes.CDLL(None)
a, b = sys.argv[1].encode(), sys.argv[2].encode()
while True: libc.renameat2(-100, a, -100, b, 2)' ${a} ${b}`;

/** Run inside the sandbox: new directories each swapped for a link to the host directory as soon as they exist. */
const NEW_DIRS = (host: string, rounds: number) =>
  `python3 -c 'import ctypes,os,sys
libc = ctypes.CDLL(None)
for i in range(${rounds}):
    d, l = "n%d" % i, "l%d" % i
    os.mkdir(d); os.symlink(sys.argv[1], l)
    libc.renameat2(-100, d.encode(), -100, l.encode(), 2)' ${host}`;

const runtime = backend('SVC_TEST_BWRAP', 'red team: filesystem escapes');

if (runtime) {
  describe('red team: nothing reaches the host filesystem through a workspace', () => {
    let server: TestServer;
    let key: string;
    /** A root-only host directory (0700) with a file whose name must never come back. */
    let hostDir: string;
    const marker = `host-only-${process.pid}`;
    const req = (method: string, p: string, body?: unknown) => server.request(method, p, { key, body });
    const putSpec = async (yaml: string) => {
      const res = await server.request('POST', '/v1/specs', { key, body: yaml, headers: { 'content-type': 'application/x-yaml' } });
      assert.equal(res.status, 201, res.text);
    };
    const run = async (id: string, command: string, background = false) => {
      const res = await req('POST', `/v1/sandboxes/${id}/commands`, { command, background });
      assert.ok(res.status === 200 || res.status === 202, res.text);
      return res.body;
    };

    before(async () => {
      server = await startServer({ SVC_SANDBOX_HOST_ROOTFS: 'true', SVC_RATE_LIMIT_WRITES: '0', SVC_RATE_LIMIT_READS: '0' });
      key = (await createTenantKey(server, 'acme')).key;
      hostDir = await realpath(await mkdtemp(path.join(os.tmpdir(), 'root-only-')));
      await writeFile(path.join(hostDir, marker), 'host secret');
      await chmod(hostDir, 0o700);
      await putSpec(SPEC('basic'));
      await putSpec(
        SPEC(
          'watched',
          'audit:\n  file_system: {watch: ["/"], track: [writes, reads, deletes]}\nteardown:\n  export:\n    - {type: audit_log, to: "watched/{{ run_id }}.jsonl"}\n',
        ),
      );
    });
    after(async () => {
      await server?.cleanup();
      await rm(hostDir, { recursive: true, force: true });
    });

    test('setup.files cannot follow a link a copy fixture brought in (/usr/lib/ssl/certs -> /etc/ssl/certs)', {
      skip: existsSync('/usr/lib/ssl/certs') ? false : 'no /usr/lib/ssl/certs on this host',
    }, async () => {
      const name = `svc-red-team-${process.pid}.txt`;
      const planted = path.join('/etc/ssl/certs', name);
      await putSpec(
        SPEC('ssl-attack', `fixtures:\n  - {type: copy, from: /usr/lib/ssl, to: ssl}\nsetup:\n  files:\n    - {path: ssl/certs/${name}, content: pwned}\n`),
      );
      try {
        const res = await req('POST', '/v1/sandboxes', { spec_id: 'ssl-attack' });
        assert.equal(res.status, 400, res.text);
        assert.match(res.body.message, /setup_applied: setup\.files\[0\]\.path: resolves outside the workspace/);
        assert.equal(existsSync(planted), false, `${planted} was written on the host`);
      } finally {
        await rm(planted, { force: true });
      }
    });

    test('an agent bundle whose link escapes through another of its links is refused at upload', async () => {
      const bundle = await makeBundle(
        { 'main.py': 'print(1)', 'a/b/c/d/e/f/g/h/keep.txt': 'x' },
        { links: { 'a/b/c/d/e/f/g/h/up': '../../../../../../../..', esc: 'a/b/c/d/e/f/g/h/up/../../../../../../../..' } },
      );
      const res = await uploadAgent(server, key, { name: 'escaper', entrypoint: ['python3', 'main.py'] }, bundle);
      assert.equal(res.status, 400, res.text);
      assert.match(res.body.message, /^bundle: symbolic link "esc" points outside the bundle/);
      // The same links without the escape are fine.
      const fine = await makeBundle({ 'main.py': 'print(1)', 'a/b/keep.txt': 'x' }, { links: { 'a/b/up': '../..', ok: 'a/b/up/main.py' } });
      assert.equal((await uploadAgent(server, key, { name: 'linker', entrypoint: ['python3', 'main.py'] }, fine)).status, 201);
    });

    test('a bundle whose link target is megabytes long (a pax header, tiny compressed) is refused, not checked for minutes', async () => {
      // No filesystem holds such a link, so python's tarfile writes the entry itself.
      const script =
        "import io,sys,tarfile\nb=io.BytesIO()\nt=tarfile.open(fileobj=b,mode='w:gz',format=tarfile.PAX_FORMAT)\nm=tarfile.TarInfo('main.py');m.size=8;t.addfile(m,io.BytesIO(b'print(1)'))\nl=tarfile.TarInfo('deep');l.type=tarfile.SYMTYPE;l.linkname='a/'*500000+'x';t.addfile(l)\nt.close();sys.stdout.buffer.write(b.getvalue())";
      const bundle = execFileSync('python3', ['-c', script], { maxBuffer: 64 * 1024 * 1024 });
      assert.ok(bundle.length < 64 * 1024, `${bundle.length} bytes compressed`);
      const res = await uploadAgent(server, key, { name: 'longlink', entrypoint: ['python3', 'main.py'] }, bundle);
      assert.equal(res.status, 400, res.text);
      assert.match(res.body.message, /^bundle: .*over 4096 bytes/);
    });

    test('.svc is not writable by setup.files or a copy fixture', async () => {
      await putSpec(SPEC('svc-setup', 'setup:\n  files:\n    - {path: .svc/audit.jsonl, content: "forged"}\n'));
      const setup = await req('POST', '/v1/sandboxes', { spec_id: 'svc-setup' });
      assert.equal(setup.status, 400, setup.text);
      assert.match(setup.body.message, /setup\.files\[0\]\.path: \.svc\/ is managed by the service/);
      await putSpec(SPEC('svc-fixture', 'fixtures:\n  - {type: copy, from: /usr/share/doc, to: .svc/x}\n'));
      const fixture = await req('POST', '/v1/sandboxes', { spec_id: 'svc-fixture' });
      assert.equal(fixture.status, 400, fixture.text);
      assert.match(fixture.body.message, /fixtures\[0\]\.to: \.svc\/ is managed by the service/);
    });

    test('GET state while the agent exchanges a directory with a link to a root-only host directory never lists it', async () => {
      const sb = (await req('POST', '/v1/sandboxes', { spec_id: 'basic' })).body;
      await run(sb.id, `mkdir d && echo mine > d/inside.txt && ln -s ${hostDir} l`);
      await run(sb.id, SWAP('d', 'l'), true);
      for (let i = 0; i < 60; i++) {
        const state = await req('GET', `/v1/sandboxes/${sb.id}/state`);
        assert.equal(state.status, 200, state.text);
        for (const p of Object.keys(state.body.files)) assert.ok(!p.includes(marker), `host file listed: ${p}`);
        // The files API under the same race: a 400 or a 404, never the host's file and never a 500.
        for (const name of ['d', 'l']) {
          const read = await req('GET', `/v1/sandboxes/${sb.id}/files/${name}/${marker}`);
          assert.ok(read.status === 400 || read.status === 404, `${read.status} ${read.text}`);
        }
      }
      // The swapper ran all along.
      assert.match((await run(sb.id, 'grep -l renameat2 /proc/[0-9]*/cmdline')).stdout, /cmdline/);
      await req('DELETE', `/v1/sandboxes/${sb.id}`);
      assert.deepEqual(await readdir(hostDir), [marker]);
    });

    test('the audit watcher never records names from a host directory swapped in for a new directory', async () => {
      const sb = (await req('POST', '/v1/sandboxes', { spec_id: 'watched' })).body;
      const busy = setInterval(() => void writeFile(path.join(hostDir, 'busy-host-file'), 'activity').catch(() => {}), 2);
      try {
        await run(sb.id, NEW_DIRS(hostDir, 300));
      } finally {
        clearInterval(busy);
      }
      await writeFile(path.join(hostDir, 'busy-host-file'), 'after');
      // The teardown stops the watch with every record written, then exports the log.
      assert.equal((await req('DELETE', `/v1/sandboxes/${sb.id}`)).status, 200);
      const audit = await readFile(path.join(server.dataDir, 'artifacts', 'acme', 'watched', `${sb.id}.jsonl`), 'utf8');
      assert.match(audit, /"file_write"/);
      assert.ok(!audit.includes(marker) && !audit.includes('busy-host-file'), 'a host file name is in the audit log');
      await rm(path.join(hostDir, 'busy-host-file'), { force: true });
    });
  });
}
