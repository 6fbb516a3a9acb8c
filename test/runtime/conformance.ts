/**
 * The runtime contract suite: what every sandbox runtime (services/sandbox-runner/runtimes/,
 * the `Runtime` seam of runtime.ts) must do for the service to keep its contract
 * (/work/shared/spec/service-spec.md, docs/sandboxes.md): create with the spec's image, workdir
 * and environment; exec; a command's timeout; the sandbox's own timeout; memory, CPU, pids and
 * disk limits; the files API; a terminal; network readiness; ingress; destroy; a kill -9 of the
 * runner. `runtimeConformance(runtime)` runs it against one runtime; one small file per runtime
 * calls it (test/runtime/local.test.ts).
 *
 * The level: the service, through its HTTP API, with the runtime chosen by its configuration
 * (SVC_RUNTIME and the runtime's own settings, in `env`). That is how docker and nomad will be
 * chosen too, so the suite pins what a user of the service sees whatever the runtime, boot
 * pipeline and teardown included, and not only what the seam promises. What the API cannot see
 * is asked of the runtime's file instead: `leftovers`, what is left on the host of a sandbox
 * (processes, cgroups, mounts, network namespaces for `local`; containers, volumes, networks for
 * docker), after a destroy, a timeout or a killed runner. Everything else is observed from inside
 * the sandbox (its own `ps`, `id`, `df`) or from the host as a client would (the published port).
 * No case drives the seam directly: a property only the seam showed would not be the service's.
 *
 * How to add a runtime (docker, nomad):
 *   1. test/runtime/<name>.test.ts, like local.test.ts: `runtimeConformance({name, unavailable,
 *      env, leftovers})`; `unavailable` skips the suite with a reason where the machine cannot
 *      run it (use test/helpers/backend.ts where `npm test` provisions it, so CI fails instead);
 *      `env` selects it (`SVC_RUNTIME: '<name>'`, its address, its image settings);
 *      `leftovers` says what the runtime would leave of one sandbox on the host, its processes
 *      apart from everything else (both empty: nothing). The destroy case first checks that it
 *      sees a live sandbox, so a probe that looks in the wrong place fails there.
 *   2. Run it: `npm test -- test/runtime/<name>.test.ts`. A case that cannot hold for a runtime is
 *      a gap to close in the runtime (or in docs/sandboxes.md, if the contract is wrong), not a
 *      case to skip.
 *
 * One service per file (started against the outside world, test/helpers/outside-world.ts, for
 * the network cases), the embedded deployment: its one process is the runner, so the kill -9
 * cases kill and restart it, and run last.
 */
import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, describe, test } from 'node:test';
import WebSocket from 'ws';
import { startEgressService } from '../helpers/egress-lab.ts';
import { startOutsideWorld, type OutsideWorld } from '../helpers/outside-world.ts';
import { SPEC, sse, storeSpec } from '../helpers/sandboxes.ts';
import { adminSql, createTenantKey, type TestServer } from '../helpers/server.ts';

/** A sandbox, as the runtime's `leftovers` gets it: its id and its workspace on the host (`path`). */
export interface SandboxOnHost {
  id: string;
  path: string;
}

/** What is left on the host of one sandbox, one line each; both empty once the runtime released it all. */
export interface Leftovers {
  /** its processes (the sandbox's own, and the runtime's for it) */
  processes: string[];
  /** everything else it held: cgroups, mounts, network namespaces, its workspace directory; containers, volumes, networks */
  resources: string[];
}

/** A sandbox runtime the suite runs against. */
export interface RuntimeUnderTest {
  /** as the service names it (`container_started`'s `runtime`) */
  name: string;
  /** why this machine cannot run it (the suite is skipped), or null */
  unavailable: string | null;
  /** the service's environment that selects and sets up this runtime */
  env: Record<string, string>;
  /** What is left on the host of `sandbox`. */
  leftovers(sandbox: SandboxOnHost): Promise<Leftovers>;
}

interface Ran {
  command: string;
  stdout: string;
  stderr: string;
  exit_code: number;
  duration_ms: number;
  timed_out?: boolean;
  oom_killed?: boolean;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const MiB = 1024 * 1024;

/** Resolves once `probe` returns something truthy; fails naming `what` (and the last value) after `ms`. */
async function until<T>(what: string | (() => string), probe: () => Promise<T | false | null | undefined>, ms = 20_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const value = await probe();
    if (value) return value;
    if (Date.now() > deadline) assert.fail(`${typeof what === 'string' ? what : what()}: not within ${ms} ms`);
    await sleep(200);
  }
}

/** Whether a TCP connection to host:port opens within 3 s: 'open', or how it failed. */
function connects(host: string, port: number): Promise<string> {
  return new Promise((resolve) => {
    const socket = net.connect({ host, port, timeout: 3000 });
    socket.once('connect', () => {
      socket.destroy();
      resolve('open');
    });
    socket.once('timeout', () => {
      socket.destroy();
      resolve('timeout');
    });
    socket.once('error', (err: NodeJS.ErrnoException) => resolve(err.code ?? err.message));
  });
}

const SPECS = {
  plain: SPEC('rt-plain', 'setup:\n  env:\n    CONFORMANCE_VAR: from-the-spec\n'),
  limited: SPEC('rt-limited', 'resources:\n  memory: 64Mi\n  pids: 48\n  disk: 32Mi\n'),
  // A twentieth of a core: well below what 16 busy processes get even on a machine loaded 45 deep (2 cores).
  throttled: SPEC('rt-throttled', 'resources:\n  cpus: 0.05\n'),
  networked: SPEC(
    'rt-networked',
    'network:\n  egress:\n    default: deny\n    allow: [api.allowed.test]\n  ingress:\n    allow: [{from: host, to_port: 8080}]\n',
  ),
};

/** The suite: one describe whose cases share one service and the helpers at its top (long as a suite is, like test/egress/conformance.ts). */
export function runtimeConformance(runtime: RuntimeUnderTest): void {
  describe(`runtime conformance: the ${runtime.name} runtime`, { skip: runtime.unavailable ?? false }, () => {
    let world: OutsideWorld;
    let server: TestServer;
    let key: string;

    const req = (method: string, p: string, body?: unknown) => server.request(method, p, { key, body });
    const create = async (specId: string, extra: Record<string, unknown> = {}) => {
      const res = await req('POST', '/v1/sandboxes', { spec_id: specId, ...extra });
      assert.equal(res.status, 201, res.text);
      return res.body as SandboxOnHost & Record<string, any>;
    };
    /** Runs `command` (its timeout in whole seconds); a command that has not answered 30 s past its timeout fails the case rather than hanging it. */
    const sh = async (id: string, command: string, timeout = '60s'): Promise<Ran> => {
      const limitMs = (Number(/^(\d+)s$/.exec(timeout)![1]) + 30) * 1000;
      let timer: NodeJS.Timeout | undefined;
      const late = new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error(`\`${command.slice(0, 80)}\` (timeout ${timeout}) did not answer within ${limitMs} ms`)), limitMs);
      });
      const res = await Promise.race([req('POST', `/v1/sandboxes/${id}/commands`, { command, timeout }), late]).finally(() => clearTimeout(timer));
      assert.equal(res.status, 200, res.text);
      return res.body as Ran;
    };
    /** The sandbox's processes as its own `ps` sees them, but the runtime's (supervisor, init) and the `ps` itself. */
    const processesInside = async (id: string) =>
      (await sh(id, 'ps -eo args=')).stdout.split('\n').filter((l) => l && !/^(bwrap|\/run\/svc\/supervisor|sh -c ps|ps -eo)/.test(l));
    const destroy = async (id: string) => {
      const res = await req('DELETE', `/v1/sandboxes/${id}`);
      assert.equal(res.status, 200, res.text);
    };
    /** Rows of the analysts' SQL endpoint (the sandboxes' last states, also of ended ones). */
    const sql = (query: string) => adminSql<Record<string, string>>(server, query);
    const lastState = async (id: string) => (await sql(`SELECT State, Error FROM sandboxes FINAL WHERE SandboxId = '${id}'`))[0];
    /** Waits (up to 20 s: teardown may finish after its answer) until the runtime reports nothing (of `kinds`) left of `sandbox`. */
    const nothingLeft = async (sandbox: SandboxOnHost, what: string, kinds: Array<keyof Leftovers> = ['processes', 'resources']) => {
      const left = async () => {
        const leftovers = await runtime.leftovers(sandbox);
        return kinds.flatMap((kind) => leftovers[kind]);
      };
      let found = await left();
      for (const deadline = Date.now() + 20_000; found.length > 0 && Date.now() < deadline; found = await left()) await sleep(250);
      assert.deepEqual(found, [], `${what}: left on the host of ${sandbox.id}`);
    };

    before(async () => {
      world = await startOutsideWorld();
      server = await startEgressService(world, runtime.env);
      key = (await createTenantKey(server, 'runtime-conformance')).key;
      for (const yaml of Object.values(SPECS)) await storeSpec(server, key, yaml);
    });
    after(async () => {
      await server?.cleanup();
      await world?.close();
    });

    test("create: ready on this runtime, with the spec's image, /workspace as the working directory and the documented environment", async () => {
      const sb = await create('rt-plain');
      assert.equal(sb.state, 'ready');
      assert.match(sb.id, /^sb-[0-9a-f]+$/);
      const events = sse(`${server.url}/v1/sandboxes/${sb.id}/events`, key);
      const ran = await sh(
        sb.id,
        '. /etc/os-release; echo "$VERSION_CODENAME"; pwd; id -u; echo "$HOME"; echo "$CONFORMANCE_VAR"; echo "$SVC_SANDBOX_ID"; echo "$SVC_BASE_URL"; printf %s "$SVC_API_KEY" | cut -c1-7',
      );
      const [codename, cwd, uid, home, specVar, sandboxId, baseUrl, token] = ran.stdout.split('\n');
      // base: debian:bookworm (the local runtime's root is the host's, bookworm too: see local.test.ts).
      assert.equal(codename, 'bookworm', ran.stderr);
      assert.equal(cwd, '/workspace');
      assert.equal(uid, '65534', 'nobody, the default user');
      assert.equal(home, '/workspace');
      assert.equal(specVar, 'from-the-spec', 'setup.env');
      assert.equal(sandboxId, sb.id);
      assert.match(baseUrl!, /^https?:\/\/\S+$/, 'SVC_BASE_URL');
      assert.equal(token, 'svc_sb_', 'SVC_API_KEY is a sandbox token');
      assert.equal((await req('GET', `/v1/sandboxes/${sb.id}`)).body.state, 'running', 'the first command made it running');
      await destroy(sb.id);
      const started = (await events).find((e) => e.event_type === 'status' && e.data.step === 'container_started');
      assert.equal(started?.data.runtime, runtime.name, 'the configuration chose the runtime under test');
    });

    test("exec: stdout and stderr apart, the exit code, `sh -c` in /workspace with the sandbox's env; a failing command leaves the sandbox usable", async () => {
      const sb = await create('rt-plain');
      const ran = await sh(sb.id, 'echo out; echo err >&2; cd sub 2>/dev/null || mkdir sub; cat /proc/$$/cmdline | tr "\\0" " "; echo; pwd; exit 7');
      assert.equal(ran.exit_code, 7);
      assert.equal(ran.stderr, 'err\n');
      const lines = ran.stdout.split('\n');
      assert.equal(lines[0], 'out');
      assert.match(lines[1]!, /^(\/bin\/)?sh -c echo out/);
      assert.equal(lines[2], '/workspace');
      assert.ok(Number.isInteger(ran.duration_ms) && ran.duration_ms >= 0, `duration_ms ${ran.duration_ms}`);
      // Each command starts afresh in /workspace: the cd of the last one does not carry over; its mkdir does.
      const next = await sh(sb.id, 'pwd; test -d sub && echo sub-kept; echo "$CONFORMANCE_VAR"');
      assert.equal(next.stdout, '/workspace\nsub-kept\nfrom-the-spec\n');
      assert.equal((await sh(sb.id, 'exit 0')).exit_code, 0);
      await destroy(sb.id);
    });

    test("a command's timeout kills it and everything it started (its own session too): exit 124, timed_out, the output so far kept", async () => {
      const sb = await create('rt-plain');
      const started = Date.now();
      const ran = await sh(sb.id, 'sleep 301 & setsid sleep 302 & (sleep 303 &); echo before-the-kill; sleep 304', '2s');
      const took = Date.now() - started;
      assert.equal(ran.exit_code, 124, JSON.stringify(ran));
      assert.equal(ran.timed_out, true);
      assert.equal(ran.stdout, 'before-the-kill\n');
      assert.ok(took >= 1900 && took < 20_000, `answered after ${took} ms`);
      assert.ok(ran.duration_ms >= 1900, `duration_ms ${ran.duration_ms}`);
      // Killed at the answer; their exit may take the kernel a moment more to reap.
      const ours = (lines: string[]) => lines.filter((l) => /sleep 30[1-4]/.test(l));
      let left = ours(await processesInside(sb.id));
      for (const deadline = Date.now() + 10_000; left.length > 0 && Date.now() < deadline; left = ours(await processesInside(sb.id))) await sleep(250);
      assert.deepEqual(left, [], 'nothing of the timed-out command is left');
      assert.equal((await sh(sb.id, 'echo after')).stdout, 'after\n');
      await destroy(sb.id);
    });

    test("the sandbox's own timeout destroys it: the stream ends destroyed (timeout), GET is 404, it ends stopped, nothing left on the host", async () => {
      const sb = await create('rt-plain', { timeout: '3s' });
      const events = sse(`${server.url}/v1/sandboxes/${sb.id}/events`, key, {}, 30_000);
      await sh(sb.id, 'nohup sleep 600 > /dev/null 2>&1 & echo started');
      const ended = (await events).at(-1);
      assert.deepEqual(ended?.data, { state: 'destroyed', reason: 'timeout' }, JSON.stringify(ended));
      assert.equal((await req('GET', `/v1/sandboxes/${sb.id}`)).status, 404);
      assert.ok(!(await req('GET', '/v1/sandboxes')).body.some((s: { id: string }) => s.id === sb.id), 'not listed');
      assert.equal((await until('its end in the store', () => lastState(sb.id).then((r) => r?.State === 'stopped' && r))).State, 'stopped');
      await nothingLeft(sb, 'after its timeout');
    });

    test('limits: memory (OOM-killed, exit 137), pids (forks refused past the limit; a fork bomb is contained), CPU (a quota), disk (ENOSPC); the sandbox carries on', async () => {
      const sb = await create('rt-limited');
      const events = sse(`${server.url}/v1/sandboxes/${sb.id}/events`, key, {}, 120_000);
      // A fork refused at the pids limit may hit the next command's own shell a moment after a burst.
      const settled = async (command: string, timeout = '30s') => {
        let ran = await sh(sb.id, command, timeout);
        for (let i = 0; i < 40 && /pids limit|fork|Resource temporarily unavailable/i.test(ran.stderr); i++) {
          await sleep(250);
          ran = await sh(sb.id, command, timeout);
        }
        return ran;
      };

      const hog = await sh(sb.id, 'head -c 200M /dev/zero | tail > /dev/null');
      assert.equal(hog.exit_code, 137, JSON.stringify(hog));
      assert.equal(hog.oom_killed, true);

      // 80 sleepers asked for under pids: 48 (the command's shell counts too).
      const forks = await settled(`python3 -c '
import os, subprocess
started = 0
procs = []
for i in range(80):
    try:
        procs.append(subprocess.Popen(["sleep", "30"])); started += 1
    except OSError:
        pass
print(started)
for p in procs: p.kill()
'`);
      const started = Number(forks.stdout.trim());
      assert.ok(started > 10 && started < 48, `started ${started} of 80 under pids: 48 (${forks.stderr.slice(0, 300)})`);
      // Contained: it answers by its timeout (its own shell may fail a fork first: exit 2), and the
      // commands below still run in the sandbox.
      const bombStarted = Date.now();
      await sh(sb.id, 'bomb() { bomb | bomb & }; bomb; sleep 1; echo survived', '5s');
      assert.ok(Date.now() - bombStarted < 20_000, `the fork bomb's command answered after ${Date.now() - bombStarted} ms`);

      // Sixteen busy processes for 3 s of wall time under cpus: 0.05 get about 0.15 s of CPU together;
      // unlimited, on 2 cores under a load of 45, they would still get over a second.
      const throttled = await create('rt-throttled');
      const cpu = await sh(
        throttled.id,
        `python3 -c '
import os, time
pids = []
for i in range(16):
    pid = os.fork()
    if pid == 0:
        end = time.time() + 3
        while time.time() < end: pass
        os._exit(0)
    pids.append(pid)
start = time.time()
for p in pids: os.waitpid(p, 0)
t = os.times()
print(t.children_user + t.children_system, time.time() - start)
'`,
      );
      const [cpuSeconds, wallSeconds] = cpu.stdout.trim().split(' ').map(Number) as [number, number];
      assert.ok(wallSeconds >= 2.9, `wall ${wallSeconds} s (${cpu.stderr.slice(0, 300)})`);
      assert.ok(cpuSeconds <= 0.05 * wallSeconds * 1.5 + 0.1, `${cpuSeconds} s of CPU in ${wallSeconds} s under cpus: 0.05`);
      await destroy(throttled.id);

      const fill = await settled('dd if=/dev/zero of=big bs=1M count=64 2>&1; echo "exit=$?"; df -k /workspace | tail -1');
      assert.match(fill.stdout, /No space left on device/);
      assert.match(fill.stdout, /exit=1/);
      const sizeKiB = Number(fill.stdout.trim().split('\n').at(-1)!.split(/\s+/)[1]);
      assert.ok(sizeKiB * 1024 <= 32 * MiB, `the workspace is ${sizeKiB} KiB`);
      assert.equal((await settled('rm big; echo still here')).stdout, 'still here\n');
      await destroy(sb.id);
      const warnings = (await events).filter((e) => e.event_type === 'warning').map((e) => String(e.data.message));
      assert.ok(
        warnings.some((m) => /process limit/.test(m)),
        `a warning says the process limit was hit: ${warnings.join('; ')}`,
      );
      assert.ok(
        warnings.some((m) => /out of memory/.test(m)),
        `a warning says a process ran out of memory: ${warnings.join('; ')}`,
      );
    });

    test('files: write, read (also from inside), delete round trip; `..` and a symlink out of the workspace are refused', async () => {
      const sb = await create('rt-plain');
      const text = 'line one\nünïcode ✓\n';
      const wrote = await req('POST', `/v1/sandboxes/${sb.id}/files`, { path: '/workspace/deep/dir/note.txt', content: text });
      assert.equal(wrote.status, 201, wrote.text);
      assert.equal(wrote.body.bytes, Buffer.byteLength(text));
      const inside = await sh(sb.id, 'cat deep/dir/note.txt; stat -c "%a %u" deep/dir/note.txt; echo from-inside > made-inside.txt');
      assert.equal(inside.stdout, `${text}644 65534\n`, "the sandbox sees the file, 0644, its own user's");
      const read = await req('GET', `/v1/sandboxes/${sb.id}/files/deep/dir/note.txt`);
      assert.equal(read.status, 200);
      assert.equal(read.text, text);
      assert.equal((await req('GET', `/v1/sandboxes/${sb.id}/files/made-inside.txt`)).text, 'from-inside\n');
      assert.equal((await req('DELETE', `/v1/sandboxes/${sb.id}/files/deep/dir/note.txt`)).status, 200);
      assert.equal((await sh(sb.id, 'test -e deep/dir/note.txt; echo $?')).stdout, '1\n', 'gone inside too');
      assert.equal((await req('GET', `/v1/sandboxes/${sb.id}/files/deep/dir/note.txt`)).status, 404);

      const up = await req('POST', `/v1/sandboxes/${sb.id}/files`, { path: '../escape.txt', content: 'x' });
      assert.equal(up.status, 400, up.text);
      assert.equal((await req('GET', `/v1/sandboxes/${sb.id}/files/a/..%2F..%2Fetc%2Fpasswd`)).status, 400);
      await sh(sb.id, 'ln -s /etc/passwd link-out; ln -s /etc link-dir');
      const viaLink = await req('GET', `/v1/sandboxes/${sb.id}/files/link-out`);
      assert.equal(viaLink.status, 400, viaLink.text.slice(0, 300));
      assert.match(viaLink.body.message, /outside the workspace/);
      const writeViaLink = await req('POST', `/v1/sandboxes/${sb.id}/files`, { path: 'link-dir/conformance-escape', content: 'x' });
      assert.equal(writeViaLink.status, 400, writeViaLink.text);
      await destroy(sb.id);
    });

    test('a terminal: open, type, read the output, exit with a code', async () => {
      const sb = await create('rt-plain');
      const ws = new WebSocket(`${server.url.replace('http', 'ws')}/v1/sandboxes/${sb.id}/shell?cols=100&rows=30`, {
        headers: { authorization: `Bearer ${key}` },
      });
      let screen = '';
      const controls: any[] = [];
      ws.on('message', (data, isBinary) => {
        if (isBinary) screen += String(data);
        else controls.push(JSON.parse(String(data)));
      });
      const closed = new Promise<number>((resolve) => ws.on('close', (code) => resolve(code)));
      try {
        await until('the shell is ready', async () => controls.find((c) => c.type === 'ready'));
        ws.send(Buffer.from('echo "sum=$((6*7))"; pwd; stty size; tty\r'));
        await until(
          () => `the shell's answer (the screen shows ${JSON.stringify(screen.slice(-300))})`,
          async () => /sum=42[\s\S]*\/workspace[\s\S]*30 100[\s\S]*\/dev\/pts\//.test(screen),
        );
        ws.send(Buffer.from('exit 3\r'));
        const exit = await until('an exit frame', async () => controls.find((c) => c.type === 'exit'));
        assert.equal(exit.exit_code, 3);
        assert.equal(await closed, 1000);
      } finally {
        ws.terminate();
      }
      assert.deepEqual(
        (await processesInside(sb.id)).filter((l) => /bash|sh -i/.test(l)),
        [],
        'the shell is gone',
      );
      await destroy(sb.id);
    });

    test('network: ready when create answers; the allowed outside server answers the first command, the denied one is not reached', async () => {
      const sb = await create('rt-networked');
      const arrivedBefore = (await world.requests()).length;
      // No retry, no wait: the network carries packets once the sandbox is ready.
      const ran = await sh(
        sb.id,
        'curl -sS -m 10 http://api.allowed.test/first; echo; curl -sS -m 10 -o /dev/null -w "%{http_code}" http://denied.test/denied; echo " rc=$?"',
      );
      const [allowed, denied] = ran.stdout.split('\n');
      assert.equal(JSON.parse(allowed!).server, 'api.allowed.test', ran.stderr);
      assert.doesNotMatch(denied!, /^200/, `denied.test answered: ${ran.stdout}`);
      const arrived = (await world.requests()).slice(arrivedBefore).map((r) => `${r.server} ${r.path}`);
      assert.deepEqual(arrived, ['api.allowed.test /first'], 'only the allowed request reached the world');
      await destroy(sb.id);
    });

    test("ingress: the listed port is published on the host's loopback and reachable; an unlisted port is not reachable from the host", async () => {
      const sb = await create('rt-networked');
      const published = sb.network.ingress[0] as { to_port: number; host: string; port: number };
      assert.equal(published.to_port, 8080);
      const marker = `ingress-${sb.id}`;
      for (const port of [8080, 8081]) {
        const bg = await req('POST', `/v1/sandboxes/${sb.id}/commands`, {
          command: `mkdir -p /tmp/www${port} && echo ${marker}-${port} > /tmp/www${port}/marker && exec python3 -m http.server ${port} --bind 0.0.0.0 --directory /tmp/www${port}`,
          background: true,
        });
        assert.equal(bg.status, 202, bg.text);
      }
      const up = await sh(
        sb.id,
        'for i in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:8080/ && curl -s -o /dev/null http://127.0.0.1:8081/ && echo up && break; sleep 0.1; done',
      );
      assert.equal(up.stdout.trim(), 'up', 'the servers inside started');
      const page = await fetch(`http://${published.host}:${published.port}/marker`);
      assert.equal(page.status, 200);
      assert.equal((await page.text()).trim(), `${marker}-8080`);
      assert.equal(await connects(sb.network.address, 8080), 'open', "the listed port at the sandbox's address (the probe can tell)");
      assert.notEqual(await connects(sb.network.address, 8081), 'open', 'the unlisted port is not reachable');
      await destroy(sb.id);
      assert.notEqual(await connects(published.host, published.port), 'open', 'the published port went with the sandbox');
    });

    test('destroy: 200 (again 200), the stream ends destroyed, GET 404, the workspace and everything on the host released', async () => {
      const [plain, networked] = await Promise.all([create('rt-plain'), create('rt-networked')]);
      for (const sb of [plain, networked]) {
        assert.equal((await sh(sb.id, 'nohup sleep 600 > /dev/null 2>&1 & setsid sleep 601 > /dev/null 2>&1 & echo started')).stdout, 'started\n');
        const live = await runtime.leftovers(sb);
        assert.ok(
          live.processes.length > 0 && live.resources.length > 0,
          `${sb.id} is on the host while it lives (the probe can tell): ${JSON.stringify(live)}`,
        );
      }
      for (const sb of [plain, networked]) {
        const events = sse(`${server.url}/v1/sandboxes/${sb.id}/events`, key);
        await destroy(sb.id);
        assert.deepEqual((await events).at(-1)?.data, { state: 'destroyed', reason: 'destroyed' });
        await destroy(sb.id);
        assert.equal((await req('GET', `/v1/sandboxes/${sb.id}`)).status, 404);
        assert.equal((await req('POST', `/v1/sandboxes/${sb.id}/commands`, { command: 'true' })).status, 404);
        // The store follows the runner's log: a moment after the answer.
        assert.equal((await until(`${sb.id} stopped in the store`, () => lastState(sb.id).then((r) => r?.State === 'stopped' && r))).State, 'stopped');
        await nothingLeft(sb, 'after DELETE');
      }
    });

    // The two kill -9 cases share the sandboxes killed with the runner (the second reads what the first left).
    let killed: SandboxOnHost[] = [];

    test('kill -9 of the runner with sandboxes live: on restart they are ended (error: the runner restarted), no process of theirs is left, new ones run', async () => {
      killed = await Promise.all([create('rt-plain'), create('rt-networked'), create('rt-limited')]);
      for (const sb of killed)
        assert.equal((await sh(sb.id, 'nohup sleep 600 > /dev/null 2>&1 & setsid sleep 601 > /dev/null 2>&1 & echo started')).stdout, 'started\n');
      await server.kill9();
      await server.restart();
      for (const sb of killed) {
        assert.equal((await req('GET', `/v1/sandboxes/${sb.id}`)).status, 404, `${sb.id} is not claimed live`);
        const end = await until(`${sb.id} ended in the store`, () => lastState(sb.id).then((r) => r?.State === 'error' && r));
        assert.match(end.Error ?? '', /runner restarted/);
      }
      assert.deepEqual((await req('GET', '/v1/sandboxes')).body, []);
      for (const sb of killed) await nothingLeft(sb, 'processes after the runner was killed and restarted', ['processes']);
      const again = await create('rt-networked');
      assert.equal(JSON.parse((await sh(again.id, 'curl -sS -m 10 http://api.allowed.test/again')).stdout).server, 'api.allowed.test');
      await destroy(again.id);
      await nothingLeft(again, 'after DELETE on the restarted service');
    });

    test('kill -9 of the runner: the restart releases everything else the killed sandboxes held (cgroups, mounts, networks, workspaces)', async () => {
      assert.ok(killed.length > 0, 'the kill -9 case ran');
      for (const sb of killed) await nothingLeft(sb, 'after the runner was killed and restarted', ['resources']);
    });
  });
}
