/**
 * Red team: denial of service from inside a sandbox. Renaming two files in a loop for 40 s made
 * 360k audit records (46 MB): files-API calls answered 504 and the service grew to 2.5 GB. A 9 MiB
 * command went past the supervisor's frame limit: the supervisor exited, every later command was
 * a 500 and the API still said `running`. The workspace had no size limit, on a host filesystem
 * that even lets uid 65534 use the root-reserved blocks.
 *
 * Now audit records are bounded per second and in all (SVC_AUDIT_RECORDS_PER_SECOND,
 * SVC_AUDIT_MAX_RECORDS; the excess counted in `warning` records); a command longer than Linux
 * takes for one argument is a 400, and commands at once are bounded; the supervisor answers any
 * frame, and a sandbox whose supervisor dies ends in `error`; each workspace is a filesystem of
 * its own, `resources.disk` large (SVC_SANDBOX_DISK_DEFAULT, SVC_SANDBOX_DISK_MAX), whose
 * reserved blocks only root may use.
 */
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import type { Readable, Writable } from 'node:stream';
import { after, before, describe, test } from 'node:test';
import { MAX_COMMAND_BYTES, MAX_COMMANDS_AT_ONCE } from '../../services/domain/sandbox-limits.ts';
import { LocalRuntime } from '../../services/sandbox-runner/runtimes/local/local-runtime.ts';
import { backend } from '../helpers/backend.ts';
import { SPEC, supervisorPid } from '../helpers/sandboxes.ts';
import { adminSql, createTenantKey, startServer, type TestServer } from '../helpers/server.ts';

const PER_SECOND = 50;
const MAX_RECORDS = 150;
const MiB = 1024 * 1024;

/** Resolves with `promise`, or fails after a generous 30 s: "answers", not "answers fast". */
function answers<T>(promise: Promise<T>, what: string): Promise<T> {
  let timer: NodeJS.Timeout;
  const limit = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} did not answer within 30 s`)), 30_000);
  });
  return Promise.race([promise, limit]).finally(() => clearTimeout(timer));
}

async function until<T>(what: string, probe: () => Promise<T | undefined | null | false>, ms = 30_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await probe();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

const runtime = backend('SVC_TEST_BWRAP', 'red team: resource exhaustion');

if (runtime) {
  describe('red team: one sandbox cannot exhaust the service or the host', () => {
    let server: TestServer;
    let key: string;
    let otherKey: string;
    const req = (method: string, p: string, body?: unknown, k = key) => server.request(method, p, { key: k, body });
    const create = async (specId: string, k = key) => {
      const res = await req('POST', '/v1/sandboxes', { spec_id: specId }, k);
      assert.equal(res.status, 201, res.text);
      return res.body as { id: string; path: string };
    };
    const run = async (id: string, command: string, k = key) => {
      const res = await req('POST', `/v1/sandboxes/${id}/commands`, { command }, k);
      assert.equal(res.status, 200, res.text);
      return res.body as { stdout: string; stderr: string; exit_code: number };
    };
    const putSpec = async (yaml: string, k = key) => {
      const res = await server.request('POST', '/v1/specs', { key: k, body: yaml, headers: { 'content-type': 'application/x-yaml' } });
      assert.equal(res.status, 201, res.text);
    };
    const auditOf = async (id: string) => {
      const res = await req('GET', `/v1/sandboxes/${id}/files/.svc/audit.jsonl`);
      assert.equal(res.status, 200, res.text);
      return res.text
        .trim()
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l) as { type: string; details: Record<string, any> });
    };
    const sql = (query: string) => adminSql<Record<string, string>>(server, query);

    before(async () => {
      server = await startServer({
        SVC_SANDBOX_HOST_ROOTFS: 'true',
        SVC_RATE_LIMIT_WRITES: '0',
        SVC_RATE_LIMIT_READS: '0',
        SVC_AUDIT_RECORDS_PER_SECOND: String(PER_SECOND),
        SVC_AUDIT_MAX_RECORDS: String(MAX_RECORDS),
        SVC_SANDBOX_DISK_DEFAULT: '256Mi',
        SVC_SANDBOX_DISK_MAX: '1Gi',
      });
      key = (await createTenantKey(server, 'acme')).key;
      otherKey = (await createTenantKey(server, 'globex')).key;
      await putSpec(SPEC('basic'));
      await putSpec(SPEC('basic'), otherKey);
      await putSpec(SPEC('flood', 'audit:\n  file_system: {watch: ["/workspace"], track: [writes, deletes]}\n'));
      await putSpec(SPEC('small-disk', 'resources:\n  disk: 64Mi\n'));
      await putSpec(SPEC('huge-disk', 'resources:\n  disk: 2Gi\n'));
    });
    after(async () => server?.cleanup());

    test('a rename flood: audit records stay bounded, the drop is counted in warnings; health, another tenant and the files API answer meanwhile', async () => {
      const sb = await create('flood');
      const other = await create('basic', otherKey);
      const flood = [
        'import os, time',
        'open("a", "w").close(); open("b", "w").close()',
        'end = time.time() + 5',
        'while time.time() < end:',
        '    os.rename("a", "x"); os.rename("b", "a"); os.rename("x", "b")',
        'open("flood-done", "w").close()',
      ].join('\n');
      const started = await req('POST', `/v1/sandboxes/${sb.id}/commands`, { command: `python3 -c '${flood}'`, background: true });
      assert.equal(started.status, 202, started.text);

      for (let i = 0; i < 8; i++) {
        const health = await answers(fetch(`${server.url}/health`), 'GET /health');
        assert.equal(health.status, 200);
        const echo = await answers(run(other.id, `echo other-${i}`, otherKey), "another tenant's command");
        assert.equal(echo.stdout, `other-${i}\n`);
        const write = await answers(req('POST', `/v1/sandboxes/${sb.id}/files`, { path: `probe-${i}.txt`, content: `probe ${i}` }), 'a files-API write');
        assert.equal(write.status, 201, write.text);
        const read = await answers(req('GET', `/v1/sandboxes/${sb.id}/files/probe-${i}.txt`), 'a files-API read');
        assert.equal(read.text, `probe ${i}`);
        await new Promise((r) => setTimeout(r, 300));
      }
      await until('the flood to end', async () => (await req('GET', `/v1/sandboxes/${sb.id}/files/flood-done`)).status === 200);
      await new Promise((r) => setTimeout(r, 1500)); // the last window's summary

      const records = await auditOf(sb.id);
      assert.ok(records.length <= MAX_RECORDS + 3, `${records.length} audit records, at most ${MAX_RECORDS} + the warnings`);
      const summaries = records.filter((r) => r.type === 'warning' && r.details.dropped);
      assert.ok(summaries.length > 0, 'a warning counts what was dropped');
      const dropped = summaries.flatMap((w) => Object.entries(w.details.dropped as Record<string, number>));
      assert.ok(
        dropped.some(([type, n]) => (type === 'file_write' || type === 'file_delete') && n > 0),
        JSON.stringify(summaries),
      );
      assert.match(summaries[0]!.details.message, new RegExp(`audit records dropped: more than ${PER_SECOND} in one second`));
      assert.ok(
        records.some((r) => r.type === 'warning' && /the audit log is full/.test(r.details.message)),
        'the cap is said',
      );

      // The event stream (the log) holds no more of them than the file.
      const events = fetch(`${server.url}/v1/sandboxes/${sb.id}/events`, {
        headers: { authorization: `Bearer ${key}` },
        signal: AbortSignal.timeout(30_000),
      }).then((r) => r.text());
      await new Promise((r) => setTimeout(r, 300));
      assert.equal((await req('DELETE', `/v1/sandboxes/${sb.id}`)).status, 200);
      const audits = (await events).split('\n').filter((l) => l.startsWith('data: ') && JSON.parse(l.slice(6)).event_type === 'audit');
      assert.ok(audits.length <= MAX_RECORDS + 3, `${audits.length} audit events`);
      assert.equal((await req('DELETE', `/v1/sandboxes/${other.id}`, undefined, otherKey)).status, 200);
    });

    test('a 9 MiB command is a 400 naming the limit, and the sandbox still runs commands', async () => {
      const sb = await create('basic');
      const huge = await req('POST', `/v1/sandboxes/${sb.id}/commands`, { command: `: ${'x'.repeat(9 * MiB)}` });
      assert.equal(huge.status, 400, huge.text.slice(0, 500));
      assert.equal(huge.body.error, 'bad_request');
      assert.match(huge.body.message, new RegExp(`^command: is ${9 * MiB + 2} bytes; a command may have at most ${MAX_COMMAND_BYTES} bytes`));
      // The longest command there is still runs.
      assert.equal((await run(sb.id, `: ${'x'.repeat(MAX_COMMAND_BYTES - 2)}`)).exit_code, 0);
      assert.equal((await run(sb.id, 'echo alive')).stdout, 'alive\n');
      assert.equal((await req('DELETE', `/v1/sandboxes/${sb.id}`)).status, 200);
    });

    test(`commands at once are bounded (${MAX_COMMANDS_AT_ONCE}, each holding its output): one more fails with exit 126 and says why`, async () => {
      const sb = await create('basic');
      for (let i = 0; i < MAX_COMMANDS_AT_ONCE; i++) {
        const bg = await req('POST', `/v1/sandboxes/${sb.id}/commands`, { command: 'sleep 60', background: true });
        assert.equal(bg.status, 202, bg.text);
      }
      const more = await run(sb.id, 'echo one-more');
      assert.equal(more.exit_code, 126);
      assert.match(more.stderr, new RegExp(`${MAX_COMMANDS_AT_ONCE} commands are running in this sandbox already`));
      assert.equal((await req('DELETE', `/v1/sandboxes/${sb.id}`)).status, 200);
    });

    test('the supervisor answers a request over its frame limit with an error frame and serves the next one', async () => {
      const binary = await new LocalRuntime({ stateDir: path.join(server.dataDir, 'runtime') }).supervisorBinary();
      // Outside any sandbox: only the framing is under test (the command itself fails its chdir to /workspace).
      const child = spawn(binary, ['serve', '65534', '65534'], { stdio: ['ignore', 'ignore', 'ignore', 'pipe', 'pipe'] });
      const frames: Array<{ type: number; id: number; payload: Buffer }> = [];
      let buffer = Buffer.alloc(0);
      (child.stdio[4] as Readable).on('data', (chunk: Buffer) => {
        buffer = Buffer.concat([buffer, chunk]);
        while (buffer.length >= 4 && buffer.length >= 4 + buffer.readUInt32LE(0)) {
          const len = buffer.readUInt32LE(0);
          frames.push({ type: buffer[4]!, id: buffer.readUInt32LE(5), payload: buffer.subarray(9, 4 + len) });
          buffer = buffer.subarray(4 + len);
        }
      });
      const frame = (type: number, id: number, payload: Buffer) => {
        const header = Buffer.alloc(9);
        header.writeUInt32LE(payload.length + 5, 0);
        header.writeUInt8(type, 4);
        header.writeUInt32LE(id, 5);
        return Buffer.concat([header, payload]);
      };
      const requests = child.stdio[3] as Writable;
      requests.write(frame(1, 1, Buffer.alloc(9 * MiB, 'x')));
      requests.write(frame(1, 2, Buffer.from('true\0PATH=/usr/bin:/bin')));
      try {
        await until('the second request to end', async () => frames.some((f) => f.id === 2 && f.type === 14), 20_000);
        const refused = frames.find((f) => f.id === 1);
        assert.equal(refused?.type, 15, 'ERROR for the oversize request');
        assert.match(refused!.payload.toString(), /over the supervisor's limit of 8388608 bytes/);
        assert.ok(
          frames.some((f) => f.id === 2 && f.type === 11),
          'STARTED for the next one',
        );
        assert.equal(child.exitCode, null, 'the supervisor is still serving');
      } finally {
        requests.end();
        child.kill('SIGKILL');
      }
    });

    test('a sandbox whose supervisor is killed from the host ends in `error` with why; commands get a clear error, not a 500', async () => {
      const sb = await create('basic');
      const pid = supervisorPid(sb.id);
      assert.ok(pid, 'found the supervisor');
      process.kill(pid, 'SIGKILL');
      const row = await until('the sandbox to be `error`', async () =>
        (await sql(`SELECT State, Error FROM sandboxes FINAL WHERE SandboxId = '${sb.id}'`)).find((r) => r.State === 'error'),
      );
      assert.match(row.Error, /supervisor exited/);
      const cmd = await req('POST', `/v1/sandboxes/${sb.id}/commands`, { command: 'true' });
      assert.ok([404, 409, 410].includes(cmd.status), `${cmd.status} ${cmd.text}`);
      assert.match(cmd.body.message, new RegExp(sb.id));
      assert.ok(!(await req('GET', '/v1/sandboxes')).body.some((s: { id: string }) => s.id === sb.id), 'no longer live: its slot is free');
      assert.equal((await req('DELETE', `/v1/sandboxes/${sb.id}`)).status, 200);
    });

    test("writing past resources.disk fails inside with ENOSPC; the reserved blocks stay root's; the host holds at most the disk", async () => {
      const sb = await create('small-disk');
      const fill = await run(sb.id, 'dd if=/dev/zero of=big bs=1M count=100 2>&1; echo "exit=$?"; stat -f -c "%b %f %a %S" /workspace');
      assert.match(fill.stdout, /No space left on device/);
      assert.match(fill.stdout, /exit=1/);
      const [blocks, free, avail, blockSize] = fill.stdout.trim().split('\n').at(-1)!.split(' ').map(Number) as [number, number, number, number];
      assert.ok(blocks * blockSize <= 64 * MiB, `the workspace is ${blocks * blockSize} bytes`);
      assert.ok(avail * blockSize < MiB, 'nothing left for uid 65534');
      assert.ok(free > avail, 'blocks remain that only root may use');
      // The service (root) still writes the audit log there: this command is audited.
      assert.equal((await run(sb.id, 'echo after-the-fill')).stdout, 'after-the-fill\n');
      assert.ok((await auditOf(sb.id)).some((r) => r.type === 'process_spawn' && r.details.command === 'echo after-the-fill'));
      // The file behind the workspace's loop device (its mount point is the sandbox's `path`).
      const loop = execFileSync('findmnt', ['-n', '-o', 'SOURCE', '--mountpoint', sb.path], { encoding: 'utf8' }).trim();
      const image = execFileSync('losetup', ['-n', '-O', 'BACK-FILE', loop], { encoding: 'utf8' }).trim();
      assert.equal(path.dirname(image), path.join(server.dataDir, 'runtime', 'disks'));
      assert.ok(statSync(image).blocks * 512 <= 64 * MiB, 'the host holds at most the disk');
      assert.equal((await run(sb.id, 'rm big && echo room > room.txt && cat room.txt')).stdout, 'room\n');

      assert.equal((await req('DELETE', `/v1/sandboxes/${sb.id}`)).status, 200);
      assert.ok(!readFileSync('/proc/self/mountinfo', 'utf8').includes(` ${sb.path} `), 'unmounted');
      assert.throws(() => statSync(image), /ENOENT/);
    });

    test('without resources.disk a workspace gets SVC_SANDBOX_DISK_DEFAULT; more than SVC_SANDBOX_DISK_MAX is refused', async () => {
      const sb = await create('basic');
      const size = await run(sb.id, 'stat -f -c "%b %S" /workspace');
      const [blocks, blockSize] = size.stdout.trim().split(' ').map(Number) as [number, number];
      assert.ok(blocks * blockSize <= 256 * MiB && blocks * blockSize > 200 * MiB, `the workspace is ${blocks * blockSize} bytes`);
      assert.equal((await req('DELETE', `/v1/sandboxes/${sb.id}`)).status, 200);

      const huge = await req('POST', '/v1/sandboxes', { spec_id: 'huge-disk' });
      assert.equal(huge.status, 400, huge.text);
      assert.match(huge.body.message, /resources\.disk: 2147483648 bytes is more than this server allows a sandbox \(1073741824 bytes/);
    });

    // Last: it kills the service.
    test('a runner killed with sandboxes up leaves no workspace mounted on the host', async () => {
      const sandboxes = [await create('basic'), await create('small-disk')];
      // Each workspace's mount point is the sandbox's `path` (a warm one stays where it was made).
      const mounted = () =>
        readFileSync('/proc/self/mountinfo', 'utf8')
          .split('\n')
          .filter((l) => sandboxes.some((sb) => l.includes(` ${sb.path} `)));
      assert.equal(mounted().length, 2);
      await server.kill9();
      await until('the workspaces to be unmounted', async () => mounted().length === 0, 10_000).catch((err: Error) => {
        throw new Error(`${err.message}: ${mounted().join('; ')}\nthe service said:\n${server.output().slice(-3000)}`);
      });
    });
  });
}
