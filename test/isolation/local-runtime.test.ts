// The `local` sandbox runtime against the real kernel: namespaces (bubblewrap), the supervisor,
// seccomp, cgroups. No mocks. Skipped with a reason where bubblewrap/root/cgroups are missing;
// under CI=true that is a failure instead.
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, describe, test } from 'node:test';
import { imagesCommand, ImageStore, normalizeReference } from '../../services/sandbox-runner/images/images.ts';
import { LocalRuntime } from '../../services/sandbox-runner/runtimes/local/local-runtime.ts';
import type { CreateSandboxOptions, SandboxHandle, SandboxResources } from '../../services/sandbox-runner/runtimes/runtime.ts';
import { countingListener } from '../helpers/ports.ts';

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'svc-isolation-'));
const runtime = new LocalRuntime({ stateDir: path.join(root, 'state') });
const unavailable = await runtime.available();
const live: SandboxHandle[] = [];

after(async () => {
  await Promise.all(live.map((sb) => sb.destroy()));
  await runtime.close();
  fs.rmSync(root, { recursive: true, force: true });
});

const RESOURCES: SandboxResources = { memoryBytes: 256 * 1024 * 1024, cpus: 1, pids: 256, diskBytes: null };

async function sandbox(overrides: Partial<CreateSandboxOptions> = {}): Promise<SandboxHandle & { workspace: string }> {
  const id = `sb-${randomBytes(6).toString('hex')}`;
  const workspace = path.join(root, 'workspaces', id);
  fs.mkdirSync(workspace, { recursive: true });
  const sb = await runtime.create({ id, workspace, rootfs: null, env: {}, resources: RESOURCES, ...overrides });
  live.push(sb);
  return Object.assign(sb, { workspace });
}

/** processes of the sandbox other than bwrap's pid 1, the supervisor and its shepherds, the ps itself */
async function agentProcesses(sb: SandboxHandle): Promise<string[]> {
  const r = await sb.exec({ command: 'ps -eo user=,comm=' });
  return r.stdout
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l && !/^root\s+(bwrap|supervisor)$/.test(l) && !/\s(ps|sh)$/.test(l));
}

if (unavailable) {
  if (process.env.CI === 'true') test('local runtime', () => assert.fail(`${unavailable}; under CI=true the local runtime is mandatory`));
  else test('local runtime', { skip: unavailable }, () => {});
} else {
  describe('local runtime: filesystem', () => {
    test('a command runs in /workspace, sees its files, gets the env, exit code and both streams', async () => {
      const sb = await sandbox({ env: { BASE: 'one', OVER: 'base' } });
      fs.writeFileSync(path.join(sb.workspace, 'hello.txt'), 'hello from the host\n');
      const r = await sb.exec({ command: 'pwd; cat hello.txt; echo "$BASE $OVER $EXTRA"; hostname; echo oops >&2; exit 7', env: { OVER: 'exec', EXTRA: 'x' } });
      assert.equal(r.exitCode, 7);
      assert.equal(r.stdout, `/workspace\nhello from the host\none exec x\n${sb.id}\n`);
      assert.equal(r.stderr, 'oops\n');
      assert.equal(r.timedOut, false);
      assert.equal(r.outputBytes, r.stdout.length + r.stderr.length);
      // what the agent writes lands in the host workspace, owned by the sandbox uid
      assert.equal((await sb.exec({ command: 'echo made > made.txt' })).exitCode, 0);
      assert.equal(fs.readFileSync(path.join(sb.workspace, 'made.txt'), 'utf8'), 'made\n');
      assert.equal(fs.statSync(path.join(sb.workspace, 'made.txt')).uid, 65534);
    });

    test('the root filesystem is read-only; /tmp is private to each sandbox', async () => {
      const [a, b] = await Promise.all([sandbox(), sandbox()]);
      const ro = await a.exec({ command: 'touch /usr/x; touch /etc/x; touch /x; mkdir /newdir' });
      assert.match(ro.stderr, /\/usr\/x': Read-only file system/);
      assert.match(ro.stderr, /\/etc\/x': Read-only file system/);
      assert.match(ro.stderr, /\/x': Read-only file system/);
      assert.notEqual(ro.exitCode, 0);
      assert.equal((await a.exec({ command: 'echo a > /tmp/mine && cat /tmp/mine' })).stdout, 'a\n');
      assert.equal((await b.exec({ command: 'ls -A /tmp' })).stdout, '');
      assert.equal(fs.existsSync('/tmp/mine'), false);
    });

    test('/tmp and /dev/shm are one tmpfs of the memory limit, seen by the host (writablePlaces), apart from each other, gone at destroy', async () => {
      const sb = await sandbox();
      const places = Object.fromEntries(sb.writablePlaces.map((p) => [p.at, p.host]));
      assert.deepEqual(Object.keys(places).sort(), ['/dev/shm', '/tmp']);
      const r = await sb.exec({
        command: 'echo t > /tmp/t; echo s > /dev/shm/s; ln /tmp/t /dev/shm/link; stat -f -c "%T %b %S" /tmp; stat -c %a /tmp /dev/shm',
      });
      assert.match(r.stderr, /Invalid cross-device link/, 'a hard link between /tmp and /dev/shm fails as between two filesystems');
      const [fsLine, ...modes] = r.stdout.trim().split('\n');
      const [type, blocks, blockSize] = fsLine!.split(' ');
      assert.equal(type, 'tmpfs');
      assert.equal(Number(blocks) * Number(blockSize), RESOURCES.memoryBytes);
      assert.deepEqual(modes, ['1777', '1777']);
      assert.equal(fs.readFileSync(path.join(places['/tmp']!, 't'), 'utf8'), 't\n');
      assert.equal(fs.readFileSync(path.join(places['/dev/shm']!, 's'), 'utf8'), 's\n');
      await sb.destroy();
      assert.equal(fs.existsSync(places['/tmp']!), false, 'unmounted and removed at destroy');
    });

    test('host files outside its view, the service state and other workspaces are invisible', async () => {
      const secretDir = fs.mkdtempSync(path.join(os.tmpdir(), 'svc-secret-'));
      const secret = path.join(secretDir, 'secret.txt');
      fs.writeFileSync(secret, 'TOP SECRET');
      fs.chmodSync(secretDir, 0o755);
      fs.chmodSync(secret, 0o644);
      try {
        const [a, b] = await Promise.all([sandbox(), sandbox()]);
        fs.writeFileSync(path.join(b.workspace, 'b-only.txt'), 'b');
        const r = await a.exec({ command: `cat ${secret}; ls ${b.workspace}; ls ${root}; ls /root /home /var 2>&1; cat /workspace/b-only.txt` });
        assert.notEqual(r.exitCode, 0);
        assert.doesNotMatch(r.stdout, /TOP SECRET|b-only/);
        assert.match(r.stderr, /No such file or directory/);
      } finally {
        fs.rmSync(secretDir, { recursive: true, force: true });
      }
    });

    test('read-only mounts can be read, not changed; static hosts entries resolve', async () => {
      const audit = path.join(root, 'audit-' + randomBytes(4).toString('hex'));
      fs.mkdirSync(audit);
      fs.writeFileSync(path.join(audit, 'log.jsonl'), '{"ok":true}\n');
      const sb = await sandbox({
        readOnlyMounts: [
          { host: audit, sandbox: '/workspace/.svc' },
          { host: audit, sandbox: '/agent' },
        ],
        hosts: { 'judge.internal': '10.1.2.3' },
      });
      const r = await sb.exec({
        command:
          'cat /workspace/.svc/log.jsonl /agent/log.jsonl; echo x >> /workspace/.svc/log.jsonl; rm -f /agent/log.jsonl; mv /workspace/.svc /workspace/moved; getent hosts judge.internal',
      });
      assert.equal(r.stdout, '{"ok":true}\n{"ok":true}\n10.1.2.3        judge.internal\n');
      assert.match(r.stderr, /Read-only file system/);
      assert.equal(fs.readFileSync(path.join(audit, 'log.jsonl'), 'utf8'), '{"ok":true}\n');
    });
  });

  describe('local runtime: processes, network, privileges', () => {
    test('the sandbox sees only its own processes', async () => {
      const sb = await sandbox();
      const r = await sb.exec({ command: 'ls /proc | grep -c "^[0-9]"; ps -eo pid=,comm=' });
      const [count, ...ps] = r.stdout.trim().split('\n');
      assert.ok(Number(count) <= 6, `pids in /proc: ${count}`);
      assert.ok(!ps.some((l) => /node|systemd|init$/.test(l)), ps.join('\n'));
      const host = await sb.exec({ command: `kill -0 ${process.pid}` });
      assert.notEqual(host.exitCode, 0);
      // the agent cannot signal the supervisor (another uid): killing "everything" leaves it running
      const supervisor = await sb.exec({ command: 'kill -9 2 2>/dev/null || echo denied; kill -9 -1' });
      assert.equal(supervisor.stdout, 'denied\n');
      assert.equal((await sb.exec({ command: 'echo alive' })).stdout, 'alive\n');
    });

    test('no route out and no way to the host loopback', async () => {
      const listener = await countingListener();
      const { port } = listener;
      try {
        const sb = await sandbox();
        const r = await sb.exec({
          command: `ip route; ip -6 route; ip -o link | grep -v ' lo:'; bash -c 'echo > /dev/tcp/127.0.0.1/${port}' && echo CONNECTED-LOOPBACK; bash -c 'echo > /dev/tcp/1.1.1.1/80' && echo CONNECTED-OUT; true`,
          timeoutMs: 10_000,
        });
        assert.equal(r.timedOut, false);
        assert.equal(r.stdout, '');
        assert.match(r.stderr, /Connection refused/);
        assert.match(r.stderr, /Network is unreachable/);
        assert.equal(listener.connections(), 0);
      } finally {
        listener.close();
      }
    });

    test('commands run unprivileged: own uid, no capabilities, no_new_privs, seccomp', async () => {
      const sb = await sandbox();
      const r = await sb.exec({ command: 'id -u; id -G; grep -E "^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):" /proc/self/status' });
      assert.equal(
        r.stdout,
        '65534\n65534\nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\n',
      );
    });

    test('denied syscalls fail: new namespaces, mount, ptrace', async () => {
      const sb = await sandbox();
      const userns = await sb.exec({ command: 'unshare -U true' });
      assert.notEqual(userns.exitCode, 0);
      assert.match(userns.stderr, /Operation not permitted/);
      const netns = await sb.exec({ command: 'unshare -r -n true' });
      assert.notEqual(netns.exitCode, 0);
      const mount = await sb.exec({ command: 'mount -t tmpfs none /tmp' });
      assert.notEqual(mount.exitCode, 0);
      const py = await sb.exec({
        command: `python3 -c 'import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print(libc.ptrace(0, 0, 0, 0), ctypes.get_errno())
print(libc.syscall(272, 0x10000000), ctypes.get_errno())'`,
      });
      // ptrace(PTRACE_TRACEME) and unshare(CLONE_NEWUSER) → -1 EPERM
      assert.equal(py.stdout, '-1 1\n-1 1\n', py.stderr);
    });
  });

  describe('local runtime: resources', () => {
    test('a fork bomb is held at pids.max and reported; the sandbox and the host carry on', async () => {
      const sb = await sandbox({ resources: { ...RESOURCES, pids: 64 } });
      // The bomb runs in a subshell: dash exits at a failed fork, and the command's own shell must
      // reach the loop whatever the bomb's first forks meet, so that only the timeout ends it.
      const r = await sb.exec({ command: '(bomb() { bomb | bomb & }; bomb); while :; do :; done', timeoutMs: 2500 });
      const usage = await sb.usage();
      const seen = JSON.stringify({ ...r, stderr: r.stderr.slice(0, 300), usage });
      assert.equal(r.exitCode, 124, seen);
      assert.equal(r.timedOut, true);
      assert.ok(usage.pidsLimitHits > 0, seen);
      assert.ok(usage.pids <= 64, seen);
      await sb.killAll();
      assert.deepEqual(await agentProcesses(sb), []);
      assert.equal((await sb.exec({ command: 'echo alive' })).stdout, 'alive\n');
      assert.equal(execFileSync('sh', ['-c', 'echo host ok'], { encoding: 'utf8' }), 'host ok\n');
    });

    test('a memory hog is OOM-killed at the memory limit: exit 137, oomKilled', async () => {
      const sb = await sandbox({ resources: { ...RESOURCES, memoryBytes: 64 * 1024 * 1024 } });
      const r = await sb.exec({ command: 'head -c 500M /dev/zero | tail', timeoutMs: 30_000 });
      assert.equal(r.exitCode, 137);
      assert.equal(r.oomKilled, true);
      assert.equal(r.timedOut, false);
      assert.ok((await sb.usage()).oomKills >= 1);
      assert.equal((await sb.exec({ command: 'echo alive' })).stdout, 'alive\n');
    });

    test('a timeout kills the whole process tree, even processes that left the session', async () => {
      const sb = await sandbox();
      const r = await sb.exec({ command: 'sleep 1000 & setsid sleep 1001 & (sleep 1002 &) ; sleep 1003', timeoutMs: 300 });
      assert.equal(r.exitCode, 124);
      assert.equal(r.timedOut, true);
      assert.deepEqual(await agentProcesses(sb), []);
    });

    test('a finished command may leave background processes; killAll ends them', async () => {
      const sb = await sandbox();
      const r = await sb.exec({ command: 'sleep 1000 > /dev/null 2>&1 & echo started; until [ "$(cat /proc/$!/comm)" = sleep ]; do :; done' });
      assert.equal(r.stdout, 'started\n');
      assert.deepEqual(await agentProcesses(sb), ['nobody   sleep']);
      await sb.killAll();
      assert.deepEqual(await agentProcesses(sb), []);
    });
  });

  describe('local runtime: commands and lifecycle', () => {
    test('two commands run concurrently in one sandbox; output streams live', async () => {
      const sb = await sandbox();
      const chunks: string[] = [];
      const waiting = await sb.spawnBackground({
        command: 'echo waiting; while [ ! -e /tmp/flag ]; do sleep 0.01; done; echo done',
        timeoutMs: 10_000,
        onOutput: (stream, chunk) => chunks.push(`${stream}:${chunk.toString()}`),
      });
      // Live: the first line arrives while the command still waits for the flag.
      for (const deadline = Date.now() + 5000; !chunks.join('').includes('waiting'); ) {
        assert.ok(Date.now() < deadline, 'the first line streamed before the command ended');
        await new Promise((r) => setTimeout(r, 10));
      }
      const other = await sb.exec({ command: 'touch /tmp/flag; echo flagged' });
      assert.equal(other.stdout, 'flagged\n');
      const r = await waiting.done;
      assert.equal(r.timedOut, false);
      assert.equal(r.stdout, 'waiting\ndone\n');
      assert.equal(chunks.join(''), 'stdout:waiting\nstdout:done\n');
    });

    test('output beyond maxCaptureBytes is counted, not kept', async () => {
      const sb = await sandbox();
      const r = await sb.exec({ command: 'head -c 100000 /dev/zero | tr "\\0" a', maxCaptureBytes: 1000 });
      assert.equal(r.stdout.length, 1000);
      assert.equal(r.outputBytes, 100000);
    });

    test('every thread of every sandbox process is in each of its groups; the reaper outside is in none', async () => {
      const sb = await sandbox();
      // A multi-threaded process too: python's threads start inside, after the join.
      await sb.spawnBackground({ command: 'sleep 1002' });
      await sb.exec({
        command:
          'python3 -c "import threading,time; [threading.Thread(target=time.sleep, args=(1003,), daemon=True).start() for _ in range(3)]; time.sleep(1003)" > /dev/null 2>&1 &',
      });
      // Per task: the group of each v1 controller the runtime limits, else (v2 only) its one group.
      const groupsOf = (pid: string, tid: string): Map<string, string> => {
        const lines = fs
          .readFileSync(`/proc/${pid}/task/${tid}/cgroup`, 'utf8')
          .trim()
          .split('\n')
          .map((line) => line.split(':'));
        const v1 = lines.flatMap(([, controllers, group]) =>
          controllers!
            .split(',')
            .filter((c) => ['memory', 'pids', 'cpu'].includes(c))
            .map((c) => [c, group!] as const),
        );
        return new Map(v1.length > 0 ? v1 : lines.filter(([, controllers]) => controllers === '').map(([, , group]) => ['v2', group!] as const));
      };
      const mine = `/svc/${sb.id}`;
      const tasks: Array<{ pid: string; tid: string; cmd: string; groups: Map<string, string> }> = [];
      let python = false;
      let sleeping = false; // `sleep` itself, not its `sh -c` before the exec (CI once listed that)
      for (let i = 0; i < 100 && !(python && sleeping); i++) {
        tasks.length = 0;
        for (const pid of fs.readdirSync('/proc').filter((p) => /^\d+$/.test(p))) {
          try {
            const cmd = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').join(' ').trim();
            for (const tid of fs.readdirSync(`/proc/${pid}/task`)) tasks.push({ pid, tid, cmd, groups: groupsOf(pid, tid) });
          } catch {
            // gone meanwhile
          }
        }
        python = tasks.filter((t) => t.cmd.startsWith('python3') && [...t.groups.values()].includes(mine)).length >= 4;
        sleeping = tasks.some((t) => t.cmd.startsWith('sleep 1002') && [...t.groups.values()].includes(mine));
        if (!(python && sleeping)) await new Promise((r) => setTimeout(r, 50));
      }
      const inside = tasks.filter((t) => [...t.groups.values()].includes(mine));
      for (const t of inside)
        assert.ok(
          [...t.groups.values()].every((g) => g === mine),
          `${t.cmd} (task ${t.tid}) is only partly in the sandbox's groups: ${[...t.groups]}`,
        );
      const commands = inside.map((t) => t.cmd);
      for (const expected of ['bwrap', '/run/svc/supervisor serve', 'sleep 1002'])
        assert.ok(
          commands.some((c) => c.startsWith(expected)),
          `${expected} is in the groups: ${commands}`,
        );
      assert.ok(python, `the python process's 4 threads are in the groups: ${commands}`);
      const reaper = tasks.filter((t) => t.cmd.includes(' launch ') && t.cmd.includes(sb.id));
      assert.ok(reaper.length > 0, 'the launch process is there');
      for (const t of reaper) assert.ok(![...t.groups.values()].includes(mine), 'the reaper stays outside the sandbox’s groups');
    });

    test('destroy kills everything, removes the cgroups and is idempotent', async () => {
      const sb = await sandbox();
      const bg = await sb.spawnBackground({ command: 'sleep 1000' });
      await sb.exec({ command: 'sleep 1001 > /dev/null &' });
      const cgroups = ['memory', 'pids', 'cpu'].map((c) => `/sys/fs/cgroup/${c}/svc/${sb.id}`).filter((d) => fs.existsSync(d));
      const procs = cgroups.length ? fs.readFileSync(path.join(cgroups[0]!, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean).map(Number) : [];
      assert.ok(procs.length >= 4, `processes in the cgroup: ${procs.length}`);
      await Promise.all([sb.destroy(), sb.destroy()]);
      await sb.destroy();
      await sb.exited;
      await assert.rejects(bg.done, /destroyed/);
      await assert.rejects(sb.exec({ command: 'true' }), /destroyed/);
      for (const dir of cgroups) assert.equal(fs.existsSync(dir), false, `${dir} remains`);
      for (const pid of procs) assert.equal(fs.existsSync(`/proc/${pid}`), false, `process ${pid} survived`);
      assert.equal(fs.existsSync(sb.workspace), true, 'the workspace is the caller’s to delete');
    });

    test('the workspace is a filesystem of diskBytes, with what it held kept; destroy unmounts it; a new runtime sweeps what a dead one left', async () => {
      const mounted = (dir: string) =>
        fs
          .readFileSync('/proc/self/mountinfo', 'utf8')
          .split('\n')
          .some((l) => l.split(' ')[4] === dir);
      const create = async () => {
        const id = `sb-${randomBytes(6).toString('hex')}`;
        const workspace = path.join(root, 'workspaces', id);
        fs.mkdirSync(path.join(workspace, 'kept'), { recursive: true });
        fs.writeFileSync(path.join(workspace, 'kept', 'f.txt'), 'before');
        const sb = await runtime.create({ id, workspace, rootfs: null, env: {}, resources: { ...RESOURCES, diskBytes: 32 * 1024 * 1024 } });
        live.push(sb);
        return Object.assign(sb, { workspace, image: path.join(root, 'state', 'disks', `${id}.img`) });
      };
      const sb = await create();
      assert.ok(mounted(sb.workspace));
      const r = await sb.exec({ command: 'cat kept/f.txt; echo; ls -A; stat -c %U kept/f.txt; stat -f -c "%b %S" .' });
      const [kept, entries, owner, size] = r.stdout.trim().split('\n');
      assert.equal(kept, 'before');
      assert.equal(entries, 'kept', 'no lost+found');
      assert.equal(owner, 'nobody');
      const [blocks, blockSize] = size!.split(' ').map(Number) as [number, number];
      assert.ok(blocks * blockSize <= 32 * 1024 * 1024, `${blocks * blockSize} bytes`);
      await sb.destroy();
      assert.equal(mounted(sb.workspace), false, 'unmounted at destroy');
      assert.equal(fs.existsSync(sb.image), false, 'its file deleted');

      // A runner that dies with a sandbox up leaves its mount; the next runtime on that state dir sweeps it.
      const left = await create();
      const next = new LocalRuntime({ stateDir: path.join(root, 'state') });
      assert.equal(await next.available(), null);
      assert.equal(mounted(left.workspace), false, 'swept');
      // It removes the groups of sandboxes left behind only once empty: one still running (here
      // its runtime is alive) is not killed.
      assert.equal((await left.exec({ command: 'echo alive' })).stdout, 'alive\n');
      assert.equal(fs.existsSync(left.image), false);
      await left.destroy();
      await next.close();
    });

    test('the spare disk the launch moves into place keeps what the workspace held; a create that fails after the move leaves nothing mounted', async () => {
      const mountedAt = () =>
        fs
          .readFileSync('/proc/self/mountinfo', 'utf8')
          .split('\n')
          .map((l) => l.split(' ')[4]);
      const disks = path.join(root, 'state', 'disks');
      const staging = () => (fs.existsSync(disks) ? fs.readdirSync(disks) : []).filter((n) => n.endsWith('.mnt')).map((n) => path.join(disks, n));
      const prepared = () => {
        const id = `sb-${randomBytes(6).toString('hex')}`;
        const workspace = path.join(root, 'workspaces', id);
        fs.mkdirSync(path.join(workspace, 'kept'), { recursive: true });
        fs.writeFileSync(path.join(workspace, 'kept', 'f.txt'), 'before');
        return { id, workspace };
      };
      // The default size: the spare's, made and mounted aside ahead (once the last create's refill is done; a create makes the first).
      if (staging().length === 0) await (await sandbox()).destroy();
      let spare: string | undefined;
      for (let i = 0; i < 200 && !spare; i++) {
        spare = staging().find((dir) => mountedAt().includes(dir));
        if (!spare) await new Promise((r) => setTimeout(r, 25));
      }
      assert.ok(spare, 'a spare waits aside');
      const { id, workspace } = prepared();
      const sb = await runtime.create({ id, workspace, rootfs: null, env: {}, resources: RESOURCES });
      live.push(sb);
      assert.ok(mountedAt().includes(workspace));
      const r = await sb.exec({ command: 'cat kept/f.txt; echo; ls -A; stat -c %U kept/f.txt' });
      assert.equal(r.stdout, 'before\nkept\nnobody\n');
      assert.equal(fs.existsSync(spare), false, "the spare's staging place went with the move");
      await sb.destroy();
      assert.equal(mountedAt().includes(workspace), false, 'unmounted at destroy');

      // bwrap fails (a bind of a missing host path) after the launch moved the disk.
      const failing = prepared();
      await assert.rejects(
        runtime.create({
          id: failing.id,
          workspace: failing.workspace,
          rootfs: null,
          env: {},
          resources: RESOURCES,
          readOnlyMounts: [{ host: path.join(root, 'missing'), sandbox: '/opt/missing' }],
        }),
      );
      assert.equal(mountedAt().includes(failing.workspace), false, "the failed sandbox's workspace is not left mounted");
      assert.equal(fs.readFileSync(path.join(failing.workspace, 'kept', 'f.txt'), 'utf8'), 'before', 'the directory below is as it was');
    });

    test('the launch moves the disk onto the workspace directory, never through a symlink swapped in for it', async () => {
      const supervisor = await runtime.supervisorBinary();
      const mountedAt = () =>
        fs
          .readFileSync('/proc/self/mountinfo', 'utf8')
          .split('\n')
          .map((l) => l.split(' ')[4]);
      const dir = fs.mkdtempSync(path.join(root, 'move-'));
      const [from, workspace, elsewhere] = ['from', 'workspace', 'elsewhere'].map((n) => path.join(dir, n));
      for (const d of [from, workspace, elsewhere]) fs.mkdirSync(d);
      // No cgroup to join: the launch fails after the move, which is all this looks at.
      const launch = (to: string) =>
        spawnSync(supervisor, ['launch', path.join(dir, 'no-such-group', 'tasks'), '--move', from, to, '--', '/bin/true'], { encoding: 'utf8' });
      execFileSync('mount', ['-t', 'tmpfs', 'tmpfs', from]);
      try {
        // The workspace replaced by a symlink to a host directory after the runner looked at it.
        fs.rmdirSync(workspace);
        fs.symlinkSync(elsewhere, workspace);
        const attacked = launch(workspace);
        assert.equal(attacked.status, 125, attacked.stderr);
        assert.match(attacked.stderr, /cannot move the workspace's disk/);
        assert.equal(mountedAt().includes(elsewhere), false, 'nothing is mounted where the symlink points');
        assert.ok(mountedAt().includes(from), 'the disk stays aside');
        // A directory there, as the runner leaves it: the disk is moved onto it.
        fs.unlinkSync(workspace);
        fs.mkdirSync(workspace);
        launch(workspace);
        assert.ok(mountedAt().includes(workspace), 'moved onto the workspace');
        assert.equal(mountedAt().includes(from), false);
      } finally {
        for (const at of [workspace, from, elsewhere]) if (mountedAt().includes(at)) execFileSync('umount', ['-l', at]);
        fs.rmSync(dir, { recursive: true, force: true });
      }
    });

    test('20 sandboxes created concurrently all come up', async () => {
      const all = await Promise.all(Array.from({ length: 20 }, () => sandbox()));
      const names = await Promise.all(all.map(async (sb) => (await sb.exec({ command: 'hostname' })).stdout.trim()));
      assert.deepEqual(
        names,
        all.map((sb) => sb.id),
      );
      await Promise.all(all.map((sb) => sb.destroy()));
    });
  });

  describe('local runtime: images', () => {
    test('references map to store names', () => {
      assert.equal(normalizeReference('python:3.12-slim'), 'python:3.12-slim');
      assert.equal(normalizeReference('docker.io/library/python:3.12-slim'), 'python:3.12-slim');
      assert.equal(normalizeReference('debian'), 'debian:latest');
      assert.equal(normalizeReference('ghcr.io/acme/tools:1'), 'ghcr.io/acme/tools:1');
      assert.equal(normalizeReference('localhost:5000/x'), 'localhost:5000/x:latest');
      assert.throws(() => normalizeReference('../etc'), /invalid image reference/);
    });

    test('an imported root filesystem (directory or tarball) becomes the sandbox root', async () => {
      // a tiny root filesystem: dash and the libraries it links
      const src = path.join(root, 'mini-rootfs');
      const sh = fs.realpathSync('/bin/sh');
      const libs = execFileSync('ldd', [sh], { encoding: 'utf8' }).match(/\/\S+/g) ?? [];
      for (const file of [sh, ...libs]) {
        fs.mkdirSync(path.join(src, path.dirname(file)), { recursive: true });
        fs.copyFileSync(file, path.join(src, file));
        fs.chmodSync(path.join(src, file), 0o755);
      }
      if (sh !== '/bin/sh') {
        fs.mkdirSync(path.join(src, 'bin'), { recursive: true });
        fs.symlinkSync(sh, path.join(src, 'bin/sh'));
      }
      fs.mkdirSync(path.join(src, 'etc'), { recursive: true });
      fs.writeFileSync(path.join(src, 'etc/os-release'), 'ID=mini\n');
      const tarball = path.join(root, 'mini.tar.gz');
      execFileSync('tar', ['-czf', tarball, '-C', src, '.']);

      const store = new ImageStore(path.join(root, 'data', 'images'));
      assert.equal(store.resolveImage('mini:1'), null);
      await store.importImage('mini:1', src);
      await store.importImage('docker.io/library/mini:2', tarball);
      assert.deepEqual(
        (await store.listImages()).map((i) => i.name),
        ['mini:1', 'mini:2'],
      );
      for (const ref of ['mini:1', 'mini:2']) {
        const rootfs = store.resolveImage(ref);
        assert.ok(rootfs);
        const sb = await sandbox({ rootfs });
        const r = await sb.exec({ command: 'read line < /etc/os-release; echo $line; echo x > /etc/x; echo y > /tmp/y && echo tmp-ok; echo $PWD' });
        assert.equal(r.stdout, 'ID=mini\ntmp-ok\n/workspace\n', r.stderr);
        assert.match(r.stderr, /Read-only file system/);
        await sb.destroy();
      }
      // An image may carry the command of an `image` agent.
      const said: string[] = [];
      assert.equal(
        await imagesCommand(['import', 'mini:3', src, '--entrypoint', '["python3", "agent.py"]'], path.join(root, 'data'), (l) => said.push(l)),
        0,
        said.join('\n'),
      );
      assert.deepEqual((await store.listImages()).find((i) => i.name === 'mini:3')?.entrypoint, ['python3', 'agent.py']);
      assert.equal(await imagesCommand(['import', 'mini:4', src, '--entrypoint', '[]'], path.join(root, 'data'), (l) => said.push(l)), 1);
      assert.match(said.at(-1)!, /--entrypoint must be a JSON list/);
    });
  });
}
