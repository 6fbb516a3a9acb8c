// Terminals of the `local` runtime (SandboxHandle.openTerminal: the supervisor's TERMINAL
// operation) against the real kernel: the shell on its pty is confined exactly as a command is
// (its user, capabilities, no_new_privs, seccomp, cgroups; root inside too), the pty is the
// controlling terminal of its own session with job control and SIGWINCH, and both directions are
// bounded: output stops at the window until acknowledged, input waits (and says so) while
// nothing reads it. No mocks. Skipped with a reason where bubblewrap/root/cgroups are missing;
// under CI=true that is a failure instead.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, describe, test } from 'node:test';
import { LocalRuntime } from '../../services/sandbox-runner/runtimes/local/local-runtime.ts';
import type { CreateSandboxOptions, SandboxHandle, SandboxTerminal, TerminalOptions } from '../../services/sandbox-runner/runtimes/runtime.ts';
import { sandboxPids } from '../helpers/sandboxes.ts';

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'svc-terminal-'));
const runtime = new LocalRuntime({ stateDir: path.join(root, 'state') });
const unavailable = await runtime.available();
const live: SandboxHandle[] = [];
const WINDOW = 64 * 1024;
/** What /proc says of a process's confinement. */
const CONFINEMENT = 'grep -E "^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):"';

after(async () => {
  await Promise.all(live.map((sb) => sb.destroy()));
  await runtime.close();
  fs.rmSync(root, { recursive: true, force: true });
});

async function sandbox(overrides: Partial<CreateSandboxOptions> = {}): Promise<SandboxHandle> {
  const id = `sb-${randomBytes(6).toString('hex')}`;
  const workspace = path.join(root, 'workspaces', id);
  fs.mkdirSync(workspace, { recursive: true });
  const sb = await runtime.create({
    id,
    workspace,
    rootfs: null,
    env: { HOME: '/workspace' },
    resources: { memoryBytes: 256 * 1024 * 1024, cpus: 1, pids: 256, diskBytes: null },
    ...overrides,
  });
  live.push(sb);
  return sb;
}

/** A terminal with its output kept as text (\r dropped); `acking: false` leaves the output unacknowledged. */
async function terminal(sb: SandboxHandle, options: Partial<TerminalOptions> & { acking?: boolean } = {}) {
  let text = '';
  let bytes = 0;
  // Output may come before openTerminal resolves: acknowledged once `t` is there.
  let early = 0;
  let t: SandboxTerminal | null = null;
  const { acking = true, ...rest } = options;
  t = await sb.openTerminal({
    cols: 80,
    rows: 24,
    term: 'xterm',
    outputWindow: WINDOW,
    onData: (chunk) => {
      bytes += chunk.length;
      text = (text + chunk.toString('utf8').replace(/\r|\x1b\[[0-9;?]*[A-Za-z]/g, '')).slice(-100_000);
      if (acking && t) t.ack(chunk.length);
      else if (acking) early += chunk.length;
    },
    ...rest,
  });
  if (early > 0) t.ack(early);
  const waitFor = async (pattern: RegExp, timeoutMs = 15_000) => {
    const deadline = Date.now() + timeoutMs;
    while (!pattern.test(text)) {
      if (Date.now() > deadline) throw new Error(`the terminal never showed ${pattern}: ${JSON.stringify(text.slice(-500))}`);
      await new Promise((r) => setTimeout(r, 20));
    }
    return text;
  };
  const opened = t;
  return { t: opened, waitFor, bytes: () => bytes, type: (s: string) => opened.write(Buffer.from(s)) };
}

const lines = (text: string) =>
  text
    .trim()
    .split('\n')
    .map((l) => l.replace(/\s+/g, ' '));

if (unavailable) {
  if (process.env.CI === 'true') test('local runtime terminals', () => assert.fail(`${unavailable}; under CI=true the local runtime is mandatory`));
  else test('local runtime terminals', { skip: unavailable }, () => {});
} else {
  describe('local runtime: terminals', () => {
    test('the shell is confined as a command is, in its cgroups, leading a session of its own on its pty', async () => {
      const sb = await sandbox();
      const command = lines((await sb.exec({ command: `${CONFINEMENT} /proc/self/status` })).stdout);
      const { t, waitFor, type } = await terminal(sb);
      assert.match(t.shell, /^\/bin\/(ba)?sh$/);
      type(`${CONFINEMENT} /proc/$$/status; echo "[pid $$ sid $(ps -o sid= -p $$) $(tty) $(stat -c %U $(tty)) $PWD $TERM]"\n`);
      const screen = await waitFor(/\[pid \d+ sid +\d+ .*\]/);
      for (const line of command) assert.ok(lines(screen).includes(line), `${line} is the shell's too:\n${screen}`);
      const [, pid, sid, rest] = /\[pid (\d+) sid +(\d+) (.*)\]/.exec(screen)!;
      assert.equal(sid, pid, 'the shell leads its session');
      assert.match(rest, /^\/dev\/pts\/\d+ nobody \/workspace xterm$/);
      const shells = sandboxPids(sb.id).filter((p) => fs.readFileSync(`/proc/${p}/cmdline`, 'utf8').startsWith(`${path.basename(t.shell)}\0-i`));
      assert.equal(shells.length, 1, "the shell is in the sandbox's cgroups");
      t.close();
      assert.equal((await t.exited).exitCode, 129, 'hung up');
    });

    test('job control and signals: Ctrl-C, Ctrl-Z stops a job; a resize is a SIGWINCH with the new size', async () => {
      const { t, waitFor, type } = await terminal(await sandbox());
      type('sleep 100\n');
      await new Promise((r) => setTimeout(r, 300));
      type('\x03');
      type('echo "[after ^C: $?]"\n');
      await waitFor(/\[after \^C: 130\]/);
      type('sleep 101\n');
      await new Promise((r) => setTimeout(r, 300));
      type('\x1a');
      await waitFor(/Stopped +sleep 101/);
      type('kill %1; wait; trap \'echo "[winch $(stty size)]"\' WINCH; echo "[trapped]"\n');
      await waitFor(/^\[trapped\]$/m);
      t.resize(100, 30);
      await waitFor(/\[winch 30 100\]/);
      type('exit 5\n');
      assert.equal((await t.exited).exitCode, 5);
    });

    test("as root inside, the shell is root of the sandbox's user namespace and owns its pty", async () => {
      const { t, waitFor, type } = await terminal(await sandbox({ user: 'root' }));
      type('echo "[$(id -u) $(stat -c %U $(tty)) $(grep ^CapEff /proc/$$/status | cut -f2)]"\n');
      await waitFor(/\[0 root 00000000800001fb\]/);
      t.close();
      await t.exited;
    });

    test('output stops at the window until it is acknowledged', async () => {
      const { t, waitFor, type, bytes } = await terminal(await sandbox(), { acking: false });
      type('yes | head -c 1000000; echo "[done]"\n');
      let seen = -1;
      for (let tries = 0; bytes() !== seen && tries < 100; tries++) {
        seen = bytes();
        await new Promise((r) => setTimeout(r, 200));
      }
      assert.ok(bytes() <= WINDOW && bytes() > WINDOW / 2, `${bytes()} bytes came unacknowledged`);
      const acking = setInterval(() => t.ack(WINDOW), 5);
      try {
        await waitFor(/^\[done\]$/m, 60_000);
      } finally {
        clearInterval(acking);
      }
      // \n is \r\n on a terminal
      assert.ok(bytes() >= 1_500_000);
      t.close();
      await t.exited;
    });

    test('input waits while nothing reads it: write says false, then drains once the shell reads', async () => {
      let drained = 0;
      const { t, waitFor, type } = await terminal(await sandbox(), { onDrain: () => drained++ });
      // What is typed is echoed: waited for is only what the output shows ($((...)) computed).
      type('stty raw -echo; sleep 2; head -c 300000 > /dev/null; stty sane; echo "[took $((300*1000))]"\n');
      await new Promise((r) => setTimeout(r, 500));
      const said: boolean[] = [];
      for (let i = 0; i < 30; i++) said.push(t.write(Buffer.alloc(10_000, 'a')));
      assert.ok(said.includes(false), 'the runtime says when to wait');
      await waitFor(/\[took 300000\]/);
      assert.ok(drained >= 1, 'and when to go on');
      assert.ok(t.inputBytes >= 300_000);
      t.close();
      await t.exited;
    });

    test("killAll and destroy end every terminal with the sandbox's processes", async () => {
      const sb = await sandbox();
      const a = await terminal(sb);
      const b = await terminal(sb);
      b.type('sleep 1000\n');
      await sb.killAll();
      assert.deepEqual(await a.t.exited, { exitCode: 137 });
      assert.deepEqual(await b.t.exited, { exitCode: 137 });
      const c = await terminal(sb);
      await sb.destroy();
      assert.deepEqual(await c.t.exited, { exitCode: 137 });
      await assert.rejects(sb.openTerminal({ cols: 80, rows: 24, term: 'xterm', outputWindow: WINDOW, onData: () => {} }), /sandbox destroyed/);
    });
  });
}
