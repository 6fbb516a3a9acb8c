/**
 * What the egress suites (e2e, conformance, red team) share: the service started against the
 * outside world (test/helpers/outside-world.ts: its DNS upstream, its CA trusted, no rate limits),
 * the test's own servers run in the world's namespace, and a lab for the red-team files:
 * the world, the service and one sandbox, with what a test does from that sandbox (run a command,
 * send raw bytes on one connection) and reads back (its audit records, what reached the world).
 */
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { own } from './owned-processes.ts';
import { startOutsideWorld, type OutsideWorld, type WorldRequest } from './outside-world.ts';
import { SPEC, storeSpec } from './sandboxes.ts';
import { createTenantKey, startServer, type TestServer } from './server.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The time now, for EgressLab.records' `since`. */
export const now = (): string => new Date().toISOString();

/** Requests as `<server> <method> <host> <path>`. */
export const show = (requests: WorldRequest[]): string[] => requests.map((r) => `${r.server} ${r.method} ${r.host} ${r.path}`);

/** Asserts that none of `requests` reached denied.test (by server or by Host). */
export const noneAtDenied = (requests: WorldRequest[]): void =>
  assert.deepEqual(
    requests.filter((r) => r.server === 'denied.test' || /denied\.test/.test(r.host)),
    [],
    `nothing reached denied.test: ${JSON.stringify(show(requests))}`,
  );

/** Starts the service with its sandboxes on the host's root, `world`'s DNS as upstream and CA as trusted, no rate limits; `env` adds to (or overrides) that. */
export function startEgressService(world: OutsideWorld, env: Record<string, string> = {}): Promise<TestServer> {
  return startServer({
    SVC_SANDBOX_HOST_ROOTFS: 'true',
    SVC_DNS_UPSTREAM: world.dns,
    SVC_EGRESS_TRUST: world.caFile,
    SVC_RATE_LIMIT_WRITES: '0',
    SVC_RATE_LIMIT_READS: '0',
    ...env,
  });
}

/**
 * Runs servers of the test's own on `host`'s address in `world`'s namespace (beside the world's
 * servers there): `handlers` is python (socket, sys and threading imported) defining a function per
 * server that takes an accepted connection (each in a thread of its own); `ports` says which port
 * each serves. Resolves once they listen; every line they print goes to `onLine`. Rejects if they
 * exit first. Kill the process when done (it does not end with its stdin).
 */
export async function startWorldServers(
  world: OutsideWorld,
  host: string,
  handlers: string,
  ports: Array<[port: number, handler: string]>,
  onLine: (line: string) => void,
): Promise<ChildProcess> {
  const script = `import socket, sys, threading
${handlers}
def serve(port, handler):
    srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); srv.bind((sys.argv[1], port)); srv.listen()
    while True:
        c, _ = srv.accept(); threading.Thread(target=handler, args=(c,), daemon=True).start()
for port, handler in (${ports.map(([port, handler]) => `(${port}, ${handler}), `).join('')}):
    threading.Thread(target=serve, args=(port, handler), daemon=True).start()
print('listening', flush=True)
threading.Event().wait()
`;
  const child = own(spawn('ip', ['netns', 'exec', world.namespace, 'python3', '-c', script, world.ip(host)], { stdio: ['ignore', 'pipe', 'inherit'] }));
  await new Promise<void>((resolve, reject) => {
    createInterface({ input: child.stdout! }).on('line', (line) => {
      onLine(line);
      if (line === 'listening') resolve();
    });
    child.once('exit', (code) => reject(new Error(`the world's extra servers exited (${code})`)));
  });
  return child;
}

/**
 * Sends its payload (base64 parts, 0.3 s apart; an empty part is a pause) on one connection, plain
 * or TLS (no certificate check; no SNI when the name is empty), and prints all it gets back until
 * the connection ends or stays silent 3 s. With `offerH2`, TLS offers ALPN h2 before http/1.1 and
 * the output starts with the protocol chosen: `[alpn http/1.1]`.
 */
const rawScript = (offerH2: boolean) => `import base64, socket, ssl, sys, time
host, port, mode, sni, parts = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], [base64.b64decode(p) for p in sys.argv[5:]]
s = socket.create_connection((host, port), timeout=3)
out = b''
if mode == 'tls':
    ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
${offerH2 ? "    ctx.set_alpn_protocols(['h2', 'http/1.1'])\n" : ''}    s = ctx.wrap_socket(s, server_hostname=sni or None)
${offerH2 ? "    out += ('[alpn ' + str(s.selected_alpn_protocol()) + ']').encode()\n" : ''}for i, part in enumerate(parts):
    if i > 0: time.sleep(0.3)
    if part: s.sendall(part)
try:
    while True:
        d = s.recv(65536)
        if not d: break
        out += d
except Exception as e:
    out += ('[' + type(e).__name__ + ']').encode()
sys.stdout.write(out.decode('latin1'))
`;

/** The world, the service and one sandbox of a tenant's spec, with what the red-team egress tests do from it. */
export interface EgressLab {
  world: OutsideWorld;
  server: TestServer;
  /** the tenant's key */
  key: string;
  /** the sandbox's id */
  id: string;
  /** A request to the service as the tenant. */
  req(method: string, p: string, body?: unknown): ReturnType<TestServer['request']>;
  /** Runs `command` in the sandbox (timeout `seconds`); asserts the service ran it. */
  sh(command: string, seconds?: number): Promise<{ stdout: string; stderr: string; exit_code: number }>;
  /** What came back on one raw connection from the sandbox (see rawScript; strings are sent as latin1); its stderr when it printed nothing. */
  raw(host: string, port: number, mode: 'plain' | 'tls', sni: string, ...parts: Array<string | Buffer>): Promise<string>;
  /** The details of the sandbox's audit records of `type` since `since`, once `done` holds for them (up to 10 s). */
  records(type: string, since: string, done: (items: any[]) => boolean): Promise<any[]>;
  /** What the world's web servers received after the first `count` requests. */
  arrivedSince(count: number): Promise<WorldRequest[]>;
  /** Runs python servers in the world's namespace (see startWorldServers); killed by close(). */
  worldServers(host: string, handlers: string, ports: Array<[port: number, handler: string]>, onLine: (line: string) => void): Promise<ChildProcess>;
  /** Kills the world's extra servers, stops the service, closes the world. */
  close(): Promise<void>;
}

/**
 * Starts the world and the service (startEgressService), makes `tenant`'s key, stores
 * `SPEC(tenant, specExtra)` and creates a sandbox of it. `offerH2`: raw() TLS offers h2 and
 * reports the ALPN chosen (see rawScript). `env` goes to startEgressService.
 */
export async function startEgressLab(options: { tenant: string; specExtra: string; offerH2?: boolean; env?: Record<string, string> }): Promise<EgressLab> {
  const script = rawScript(options.offerH2 ?? false);
  const children: ChildProcess[] = [];
  const world = await startOutsideWorld();
  let server: TestServer | undefined;
  const close = async () => {
    for (const child of children) if (child.pid) child.kill('SIGKILL');
    await server?.cleanup();
    await world.close();
  };
  try {
    server = await startEgressService(world, options.env);
    const started = server;
    const key = (await createTenantKey(started, options.tenant)).key;
    const req: EgressLab['req'] = (method, p, body) => started.request(method, p, { key, body });
    await storeSpec(started, key, SPEC(options.tenant, options.specExtra));
    const res = await req('POST', '/v1/sandboxes', { spec_id: options.tenant });
    assert.equal(res.status, 201, res.text);
    const id = res.body.id as string;
    const sh: EgressLab['sh'] = async (command, seconds = 60) => {
      const ran = await req('POST', `/v1/sandboxes/${id}/commands`, { command, timeout: `${seconds}s` });
      assert.equal(ran.status, 200, ran.text);
      return ran.body;
    };
    return {
      world,
      server: started,
      key,
      id,
      req,
      sh,
      async raw(host, port, mode, sni, ...parts) {
        const b64 = parts.map((part) => `'${(typeof part === 'string' ? Buffer.from(part, 'latin1') : part).toString('base64')}'`).join(' ');
        const { stdout, stderr } = await sh(`python3 - ${host} ${port} ${mode} '${sni}' ${b64} <<'PY'\n${script}\nPY`);
        return stdout || stderr;
      },
      async records(type, since, done) {
        let items: any[] = [];
        // Up to 30 s: a loaded machine (CI runs two files at once) can hold a record back past 10 s.
        for (const deadline = Date.now() + 30_000; Date.now() < deadline; await sleep(150)) {
          const got = await req('GET', `/v1/sandboxes/${id}/audit?limit=1000&type=${type}&since=${encodeURIComponent(since)}`);
          assert.equal(got.status, 200, got.text);
          items = got.body.items.map((i: any) => i.details);
          if (done(items)) return items;
        }
        assert.fail(`the ${type} records since ${since} are not what was expected: ${JSON.stringify(items)}`);
      },
      arrivedSince: async (count) => (await world.requests()).slice(count),
      async worldServers(host, handlers, ports, onLine) {
        const child = await startWorldServers(world, host, handlers, ports, onLine);
        children.push(child);
        return child;
      },
      close,
    };
  } catch (err) {
    await close();
    throw err;
  }
}
