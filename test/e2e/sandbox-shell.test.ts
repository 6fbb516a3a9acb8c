/**
 * The sandbox shell's endpoint attacked over its WebSocket (GET /v1/sandboxes/:id/shell,
 * docs/sandboxes.md "Shell"), against the running service: every refusal is one JSON answer
 * before a socket exists (another tenant, a sandbox's own token, bad sizes, terms, timeouts);
 * the shell is the sandbox's (its user, its /workspace, its processes, its seccomp) and nothing of
 * the host's; bad frames get an error frame and the session goes on; a client that leaves (also
 * while the service holds its input back), a destroyed sandbox and a session's timeout each end
 * it with nothing of it left; a flood of
 * output holds the shell while the client does not read, without the server's memory growing;
 * and (on the distributed deployment) a runner hangs up the shells of an api process that died.
 * The keystrokes are on no record.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import WebSocket from 'ws';
import { backend } from '../helpers/backend.ts';
import { SPEC, sandboxPids, sse, storeSpec } from '../helpers/sandboxes.ts';
import { createTenantKey, startServer, type TestServer } from '../helpers/server.ts';

const runtime = backend('SVC_TEST_BWRAP', 'the sandbox shell on the local runtime');

/** A client of the shell's WebSocket: what the terminal showed, and the control frames. */
interface Shell {
  ws: WebSocket;
  /** the terminal's bytes so far, as text */
  screen(): string;
  bytes(): number;
  controls: Array<Record<string, any>>;
  closed: Promise<{ code: number; reason: string }>;
  type(text: string): void;
  waitFor(pattern: RegExp, timeoutMs?: number): Promise<void>;
  waitControl(type: string, timeoutMs?: number): Promise<Record<string, any>>;
}

/** A host process's command line ('' once it is gone). */
const cmdline = (pid: number) => {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8');
  } catch {
    return '';
  }
};

const until = async (what: string, done: () => boolean | Promise<boolean>, timeoutMs = 20_000) => {
  const deadline = Date.now() + timeoutMs;
  while (!(await done())) {
    if (Date.now() > deadline) throw new Error(`${what}: not within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
};

if (runtime) {
  describe('the sandbox shell over its WebSocket', () => {
    let server: TestServer;
    let key: string;
    let other: string;
    const wsUrl = (id: string, query = '') => `${server.url.replace('http', 'ws')}/v1/sandboxes/${id}/shell${query}`;
    const create = async () => {
      const res = await server.request('POST', '/v1/sandboxes', { key, body: { spec_id: 'shell' } });
      assert.equal(res.status, 201, res.text);
      return res.body.id as string;
    };
    const run = async (id: string, command: string) =>
      (await server.request('POST', `/v1/sandboxes/${id}/commands`, { key, body: { command } })).body as { stdout: string; exit_code: number };
    /** The upgrade's answer when the service refuses it. */
    const refused = (url: string, k = key) =>
      new Promise<{ status: number; body: any }>((resolve, reject) => {
        const ws = new WebSocket(url, { headers: { authorization: `Bearer ${k}` } });
        ws.on('open', () => reject(new Error(`${url} was accepted`)));
        ws.on('unexpected-response', (_req, res) => {
          let text = '';
          res.on('data', (c: Buffer) => (text += c));
          res.on('end', () => resolve({ status: res.statusCode!, body: JSON.parse(text) }));
        });
      });
    /** Opens a shell; resolves once it is ready. */
    const open = (id: string, query = '') =>
      new Promise<Shell>((resolve, reject) => {
        const ws = new WebSocket(wsUrl(id, query), { headers: { authorization: `Bearer ${key}` } });
        const chunks: Buffer[] = [];
        let bytes = 0;
        let text = '';
        const controls: Array<Record<string, any>> = [];
        const shell: Shell = {
          ws,
          screen: () => text,
          bytes: () => bytes,
          controls,
          closed: new Promise((done) => ws.on('close', (code, reason) => done({ code, reason: String(reason) }))),
          type: (input) => ws.send(Buffer.from(input)),
          waitFor: (pattern, timeoutMs) =>
            until(`the terminal showing ${pattern} (it shows ${JSON.stringify(text.slice(-300))})`, () => pattern.test(text), timeoutMs),
          waitControl: async (type, timeoutMs) => {
            await until(`a ${type} frame (got ${JSON.stringify(controls)})`, () => controls.some((c) => c.type === type), timeoutMs);
            return controls.find((c) => c.type === type)!;
          },
        };
        ws.on('message', (data, isBinary) => {
          if (!isBinary) {
            const frame = JSON.parse(String(data));
            controls.push(frame);
            if (frame.type === 'ready') resolve(shell);
            return;
          }
          bytes += (data as Buffer).length;
          // The flood test reads tens of MB: keep only the screen's tail as text.
          chunks.push(data as Buffer);
          text = (text + Buffer.concat(chunks.splice(0)).toString('utf8')).slice(-200_000);
        });
        ws.on('unexpected-response', (_req, res) => reject(new Error(`refused: ${res.statusCode}`)));
        ws.on('error', reject);
      });
    const processesOf = async (id: string) =>
      (await run(id, 'ps -eo args=')).stdout.split('\n').filter((l) => l && !/^(bwrap|\/run\/svc\/supervisor|sh -c ps|ps -eo)/.test(l));
    const rss = () => server.processes().reduce((sum, p) => sum + Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${p.pid}/status`, 'utf8'))![1]) * 1024, 0);

    before(async () => {
      server = await startServer({ SVC_SANDBOX_HOST_ROOTFS: 'true', SVC_RATE_LIMIT_WRITES: '0', SVC_RATE_LIMIT_READS: '0' });
      key = (await createTenantKey(server, 'acme')).key;
      other = (await createTenantKey(server, 'globex')).key;
      await storeSpec(server, key, SPEC('shell'));
    });
    after(async () => server?.cleanup());

    test('every refusal is one JSON answer before any WebSocket exists', async () => {
      const id = await create();
      const token = (await run(id, 'printf %s "$SVC_API_KEY"')).stdout;
      assert.match(token, /^svc_sb_/);
      const cases: Array<[string, string, number, string, RegExp]> = [
        ['another tenant', '', 403, 'forbidden', /belongs to another tenant/],
        ["the sandbox's own token", '', 403, 'forbidden', /a sandbox token cannot open a shell/],
        ['cols 0', '?cols=0', 400, 'bad_request', /^cols: "0" is not a whole number of characters from 1 to 1000$/],
        ['rows past the most', '?rows=5000', 400, 'bad_request', /^rows: /],
        ['cols not a number', '?cols=wide', 400, 'bad_request', /^cols: /],
        ['a term that is not one', `?term=${encodeURIComponent('xterm;rm -rf /')}`, 400, 'bad_request', /^term: /],
        ['a bad timeout', '?timeout=soon', 400, 'bad_request', /^timeout: /],
        ['an unknown parameter', '?mode=line', 400, 'bad_request', /^mode: unknown query parameter/],
      ];
      for (const [what, query, status, error, message] of cases) {
        const k = what === 'another tenant' ? other : what === "the sandbox's own token" ? token : key;
        const answer = await refused(wsUrl(id, query), k);
        assert.equal(answer.status, status, what);
        assert.equal(answer.body.error, error, what);
        assert.match(answer.body.message, message, what);
      }
      assert.equal((await refused(wsUrl('sb-0000000000000000'))).status, 404);
      const plain = await server.request('GET', `/v1/sandboxes/${id}/shell`, { key });
      assert.equal(plain.status, 400, 'a GET without the upgrade is told what the endpoint is');
      assert.equal((await server.request('DELETE', `/v1/sandboxes/${id}`, { key })).status, 200);
      assert.equal((await refused(wsUrl(id))).status, 404, 'a destroyed sandbox has no shell');
    });

    test("the shell is the sandbox's: its user in /workspace with its files, its own terminal and processes, its seccomp, none of the host", async () => {
      const id = await create();
      await server.request('POST', `/v1/sandboxes/${id}/files`, { key, body: { path: 'notes/todo.txt', content: 'from the files api\n' } });
      const hostFile = path.join(os.tmpdir(), `svc-shell-host-${randomBytes(4).toString('hex')}`);
      writeFileSync(hostFile, "the host's\n");
      try {
        const shell = await open(id);
        assert.equal(shell.controls[0].sandbox_id, id);
        assert.match(shell.controls[0].session_id, /^term-[0-9a-f]{24}$/);
        assert.match(shell.controls[0].shell, /^\/bin\/(ba)?sh$/);
        shell.type(
          'echo "[$(id -un) $(id -u) $PWD $TERM]"; cat notes/todo.txt; ls -l $(tty) | cut -d" " -f1,3; echo "[host: $(cat ' +
            hostFile +
            ' 2>&1 | cut -d: -f3)]"; echo "[end-$((2+3))]"\r',
        );
        // What is typed is echoed: wait for what only the output shows.
        await shell.waitFor(/\[end-5\]/);
        assert.match(shell.screen(), /\[nobody 65534 \/workspace xterm-256color\]/);
        assert.match(shell.screen(), /from the files api/);
        assert.match(shell.screen(), /crw--w---- nobody/, "the terminal is the sandbox user's");
        assert.match(shell.screen(), /\[host: {2}No such file or directory\]/);
        // Only the sandbox's processes; new namespaces are refused as for any command.
        shell.type('ps -eo user=,args= | grep -vc "^root .*\\(bwrap\\|supervisor\\)"; unshare -r true 2>/dev/null; echo "[unshare $?]"\r');
        await shell.waitFor(/\[unshare \d+\]/);
        assert.doesNotMatch(shell.screen(), /\[unshare 0\]/);
        assert.match(shell.screen(), /^[34]\r$/m, 'bash, ps and grep (and the subshell): nothing of the host');
        shell.ws.close();
        await shell.closed;
      } finally {
        rmSync(hostFile, { force: true });
      }
    });

    test('bad frames get an error frame, and the session goes on', async () => {
      const id = await create();
      const shell = await open(id);
      const sent: Array<[string | Buffer, string, RegExp]> = [
        ['not json', 'bad_request', /JSON control/],
        [JSON.stringify({ type: 'run', command: 'id' }), 'bad_request', /"resize"/],
        [JSON.stringify({ type: 'resize', cols: 0, rows: 10 }), 'bad_request', /^cols: 0 is not/],
        [JSON.stringify({ type: 'resize', cols: '80', rows: 24 }), 'bad_request', /numbers/],
        [JSON.stringify({ type: 'resize', cols: 80, rows: 1e9 }), 'bad_request', /^rows: /],
        ['{"type":"resize","pad":"' + 'x'.repeat(5000) + '"}', 'payload_too_large', /at most 4096 bytes/],
        [Buffer.alloc(70_000, 'a'), 'payload_too_large', /at most 65536 bytes; this one had 70000/],
      ];
      for (const [frame, error, message] of sent) {
        const before = shell.controls.length;
        shell.ws.send(frame);
        await until('an error frame', () => shell.controls.length > before);
        const got = shell.controls[before];
        assert.equal(got.type, 'error', JSON.stringify(got));
        assert.equal(got.error, error);
        assert.match(got.message, message);
      }
      shell.type('echo "still $((40+2))"\r');
      await shell.waitFor(/still 42/);
      // Past the socket's limit (1 MiB) the socket closes, and the shell is hung up with it.
      shell.ws.send(Buffer.alloc(2 * 1024 * 1024));
      assert.equal((await shell.closed).code, 1009);
      await until('the shell gone', async () => !(await processesOf(id)).some((p) => p.includes('-i')));
    });

    test('closing the socket hangs the shell up: nothing of the session is left, and the keystrokes are on no record', async () => {
      const id = await create();
      const shell = await open(id);
      const marker = `typed-${randomBytes(6).toString('hex')}`;
      // Jobs of every kind: background, deaf to SIGHUP, in a session of their own, nohup'd, and one in the foreground.
      shell.type(`sleep 4242 & (trap "" HUP; exec sleep 4243) & setsid sleep 4244 & nohup sleep 4245 >/dev/null 2>&1 & echo ${marker}; sleep 4246\r`);
      await shell.waitFor(new RegExp(`^${marker}\\r$`, 'm'));
      await until('every job started', async () => (await processesOf(id)).filter((p) => /^sleep 424[2-6]$/.test(p)).length === 5);
      shell.ws.terminate();
      await until('nothing of the session left', async () => (await processesOf(id)).length === 0, 10_000);

      const session = shell.controls[0].session_id;
      let audit = '';
      await until('the shell in the audit', async () => {
        audit = (await server.request('GET', `/v1/sandboxes/${id}/audit?type=process_spawn`, { key })).text;
        return audit.includes(session);
      });
      const auditFile = (await server.request('GET', `/v1/sandboxes/${id}/files/.svc/audit.jsonl`, { key })).text;
      await server.request('DELETE', `/v1/sandboxes/${id}`, { key });
      const events = await sse(`${server.url}/v1/sandboxes/${id}/events`, key);
      const terminal = events.filter((e) => e.event_type === 'terminal');
      assert.deepEqual(
        terminal.map((e) => e.data.phase),
        ['opened', 'closed'],
        JSON.stringify(events),
      );
      assert.equal(terminal[1].data.session_id, session);
      assert.equal(terminal[1].data.reason, 'the client closed the connection');
      assert.ok(terminal[1].data.input_bytes > marker.length);
      assert.ok(!(JSON.stringify(events) + audit + auditFile).includes(marker), 'what was typed is recorded nowhere');
    });

    test('a client that leaves while its input is held back (the shell reads none of it) still ends the session', async () => {
      const id = await create();
      const shell = await open(id);
      shell.type('stty raw -echo; sleep 4248\r');
      await until('the shell waiting', async () => (await processesOf(id)).includes('sleep 4248'));
      // Far past the input window: the service stops reading the socket until the shell reads.
      for (let i = 0; i < 16; i++) shell.ws.send(Buffer.alloc(60_000, 'x'));
      await new Promise((r) => setTimeout(r, 1000));
      shell.ws.terminate();
      await until('nothing of the session left', async () => (await processesOf(id)).length === 0, 40_000);
    });

    test("destroying the sandbox ends its sessions with an error frame; a session's timeout ends it too", async () => {
      const id = await create();
      const [a, b] = await Promise.all([open(id), open(id)]);
      a.type('sleep 1000\r');
      assert.equal((await server.request('DELETE', `/v1/sandboxes/${id}`, { key })).status, 200);
      for (const shell of [a, b]) {
        const error = await shell.waitControl('error');
        assert.equal(error.error, 'not_found');
        assert.equal(error.message, `sandbox ${id} was destroyed`);
        assert.equal((await shell.closed).code, 1000);
      }

      const timed = await open(await create(), '?timeout=2s');
      const error = await timed.waitControl('error', 10_000);
      assert.equal(error.error, 'timeout');
      assert.match(error.message, /the session's timeout \(2 s\)/);
      assert.equal((await timed.waitControl('exit')).exit_code, 129, 'the shell was hung up');
      await timed.closed;
    });

    test("the shell ends with its exit code, and a size given at the start and changed later is its terminal's", async () => {
      const shell = await open(await create(), '?cols=132&rows=43&term=vt100');
      shell.type('echo "[$(stty size) $TERM]"\r');
      await shell.waitFor(/\[43 132 vt100\]/);
      shell.ws.send(JSON.stringify({ type: 'resize', cols: 77, rows: 19 }));
      shell.type('echo "[$(stty size)]"; exit 7\r');
      await shell.waitFor(/\[19 77\]/);
      assert.deepEqual(await shell.waitControl('exit'), { type: 'exit', exit_code: 7 });
      assert.equal((await shell.closed).code, 1000);
      assert.ok(!shell.controls.some((c) => c.type === 'error'));
    });

    test("a flood of output holds the shell while the client does not read, and the server's memory stays flat", async () => {
      const id = await create();
      const shell = await open(id);
      const before = rss();
      let peak = before;
      const sampler = setInterval(() => (peak = Math.max(peak, rss())), 100);
      try {
        shell.type('yes | head -c 50000000; echo "flood-""done"\r');
        await until('output flowing', () => shell.bytes() > 2_000_000);
        // The client stops reading: once the sockets' buffers are full, the shell is held where it is (head writes no more).
        shell.ws.pause();
        const written = async () => Number((await run(id, 'sed -n "s/^wchar: //p" /proc/$(pgrep -x head)/io')).stdout);
        let held = -1;
        await until('the flood held', async () => {
          const was = held;
          held = await written();
          return held === was;
        });
        await new Promise((r) => setTimeout(r, 1500));
        assert.equal(await written(), held, 'the flood waits for the client');
        assert.ok(held > 0 && held < 50_000_000, String(held));
        shell.ws.resume();
        await shell.waitFor(/flood-done/, 240_000);
      } finally {
        clearInterval(sampler);
      }
      // 50 MB through the terminal (\n became \r\n: about 75 MB), a few hundred KiB of it in flight at a time.
      assert.ok(shell.bytes() >= 50_000_000, `${shell.bytes()} bytes`);
      assert.ok(peak - before < 200 * 1024 * 1024, `the service grew by ${Math.round((peak - before) / 1024 / 1024)} MiB`);
      shell.type('exit\r');
      assert.equal((await shell.waitControl('exit')).exit_code, 0);
    });

    test('on the distributed deployment, the runner hangs up the shells of an api process that died', async (t) => {
      const api = server.processes().find((p) => p.services.includes('api'));
      if (!api || server.processes().length === 1) return t.skip('embedded: the api and the runner are one process');
      const id = await create();
      const shell = await open(id);
      shell.type('sleep 4247\r');
      const sleeping = () => sandboxPids(id).some((pid) => cmdline(pid).startsWith('sleep\u00004247'));
      await until('the job started', sleeping);
      process.kill(api.pid, 'SIGKILL');
      // The runner hears nothing of the api for TERMINAL.idleMs (20 s), then hangs up.
      await until('the shell hung up', () => !sleeping(), 45_000);
    });
  });
}
