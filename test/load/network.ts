/**
 * The sandbox network's figures (issue 15), side by side in one run: sandbox create with a network
 * policy vs without, an HTTP and an HTTPS (inspected) request's round trip from inside a sandbox
 * through the egress gateway vs the same request from the host, and requests/s through one
 * sandbox's gateway. The "outside" is test/helpers/outside-world.ts.
 */
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { startOutsideWorld } from '../helpers/outside-world.ts';
import { startServer, type TestServer } from '../helpers/server.ts';
import { pct } from './queries.ts';
import { interleavedCreates, timedSandboxes } from './sandbox-timing.ts';

const run = promisify(execFile);

/** Requests to `url` (each on a new connection, or `keepalive`), timed in the client: JSON {p50, p95, rps}. */
const CLIENT = `
import http.client, json, ssl, sys, time, threading
host, port, scheme, name, n, threads, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
ctx = ssl.create_default_context(cafile=ca) if scheme == 'https' else None
class Named(http.client.HTTPSConnection):
    # to the address, with the name as the TLS server name (as a resolved client would)
    def connect(self):
        import socket
        self.sock = ctx.wrap_socket(socket.create_connection((self.host, self.port)), server_hostname=name)
def new():
    return Named(host, port) if scheme == 'https' else http.client.HTTPConnection(host, port)
def once(conn):
    conn.request('GET', '/bench', headers={'Host': name})
    r = conn.getresponse(); r.read()
    if r.status != 200: raise SystemExit('status %d' % r.status)
times = []
for i in range(n):
    t = time.perf_counter()
    c = new()
    once(c); c.close()
    times.append((time.perf_counter() - t) * 1000)
times.sort()
done = [0]
stop = time.perf_counter() + 3
def worker():
    c = new()
    while time.perf_counter() < stop:
        once(c); done[0] += 1
ts = [threading.Thread(target=worker) for _ in range(threads)]
[t.start() for t in ts]; [t.join() for t in ts]
print(json.dumps({'p50': times[len(times)//2], 'p95': times[int(len(times)*0.95)], 'rps': done[0] / 3}))
`;

export async function benchNetwork(): Promise<string[]> {
  const world = await startOutsideWorld();
  const dir = await mkdtemp(path.join(os.tmpdir(), 'svc-bench-net-'));
  let server: TestServer | null = null;
  try {
    // No warm pool: a networked sandbox is never taken from it, so both kinds are made at the
    // create (a warm plain one, and the pool refilling beside the next create, measure the pool).
    server = await startServer({
      SVC_SANDBOX_HOST_ROOTFS: 'true',
      SVC_RATE_LIMIT_READS: '0',
      SVC_RATE_LIMIT_WRITES: '0',
      SVC_DNS_UPSTREAM: world.dns,
      SVC_EGRESS_TRUST: world.caFile,
      SVC_SANDBOX_POOL_SIZE: '0',
    });
    const s = server;
    const base = 'version: 1\nbase: debian:bookworm\ntask: {prompt: bench}\ninvariants: {ok: {check: {type: command_exit, command: "true"}}}\n';
    const { create, destroy } = await timedSandboxes(s, [
      `id: plain\n${base}`,
      `id: network\n${base}network: {egress: {default: deny, allow: [api.allowed.test]}}\n`,
      `id: inspected\n${base}network: {egress: {default: deny, allow: [api.allowed.test]}}\naudit: {http_calls: true}\n`,
    ]);
    const creates = await interleavedCreates({ create, destroy }, ['plain', 'network'] as const, 5, 30);
    const script = path.join(dir, 'client.py');
    await writeFile(script, CLIENT);
    const ip = world.ip('api.allowed.test');
    const worldCa = await readFile(world.caFile, 'utf8');
    /** Not inspected, the sandbox sees the world's own certificate: it is given the world's CA. */
    const inside = async (spec: string, scheme: 'http' | 'https') => {
      const { id } = await create(spec);
      try {
        for (const [file, content] of [
          ['client.py', CLIENT],
          ['world-ca.pem', worldCa],
        ])
          await s.request('POST', `/v1/sandboxes/${id}/files`, { body: { path: file, content } });
        const ca = spec === 'inspected' ? '/run/svc/ca-certificates.crt' : 'world-ca.pem';
        const res = await s.request('POST', `/v1/sandboxes/${id}/commands`, {
          body: { command: `python3 client.py ${ip} ${scheme === 'https' ? 443 : 80} ${scheme} api.allowed.test 300 4 ${ca}` },
        });
        if (res.body.exit_code !== 0) throw new Error(`inside: ${res.text}`);
        return JSON.parse(res.body.stdout) as { p50: number; p95: number; rps: number };
      } finally {
        await destroy(id);
      }
    };
    const host = async (scheme: 'http' | 'https') => {
      const { stdout } = await run('/usr/bin/python3', [script, ip, scheme === 'https' ? '443' : '80', scheme, 'api.allowed.test', '300', '4', world.caFile]);
      return JSON.parse(stdout) as { p50: number; p95: number; rps: number };
    };
    const http = { inside: await inside('network', 'http'), host: await host('http') };
    const inspectedHttp = await inside('inspected', 'http');
    const https = { inside: await inside('inspected', 'https'), host: await host('https') };
    const passthrough = await inside('network', 'https');
    const f = (n: number) => n.toFixed(1);
    const f2 = (n: number) => n.toFixed(2);
    const added = (a: number, b: number) => `${a - b >= 0 ? '+' : ''}${f2(a - b)} ms`;
    return [
      `| sandbox create to ready, no warm pool: with a network policy vs without (interleaved, 30 each) | p50 ${f(pct(creates.network, 0.5))} ms, p95 ${f(pct(creates.network, 0.95))} ms | p50 ${f(pct(creates.plain, 0.5))} ms, p95 ${f(pct(creates.plain, 0.95))} ms | added p50 ${added(pct(creates.network, 0.5), pct(creates.plain, 0.5))} (target <= 10 ms) |`,
      `| HTTP GET, new connection each: inside through the gateway (policy) vs from the host | p50 ${f2(http.inside.p50)} ms, p95 ${f2(http.inside.p95)} ms | p50 ${f2(http.host.p50)} ms, p95 ${f2(http.host.p95)} ms | added p50 ${added(http.inside.p50, http.host.p50)} (target <= 1 ms) |`,
      `| the same with audit.http_calls (policy + audit record) | p50 ${f2(inspectedHttp.p50)} ms, p95 ${f2(inspectedHttp.p95)} ms | p50 ${f2(http.host.p50)} ms | added p50 ${added(inspectedHttp.p50, http.host.p50)} |`,
      `| HTTPS GET, new connection each: inside, inspected (TLS ended and made again) vs from the host | p50 ${f2(https.inside.p50)} ms, p95 ${f2(https.inside.p95)} ms | p50 ${f2(https.host.p50)} ms, p95 ${f2(https.host.p95)} ms | added p50 ${added(https.inside.p50, https.host.p50)} (target <= 5 ms) |`,
      `| HTTPS GET, not inspected (passed through by its server name) vs from the host | p50 ${f2(passthrough.p50)} ms, p95 ${f2(passthrough.p95)} ms | p50 ${f2(https.host.p50)} ms | added p50 ${added(passthrough.p50, https.host.p50)} |`,
      `| requests/s through one sandbox's gateway (4 keep-alive clients, 3 s): HTTP, HTTP audited, HTTPS inspected | ${f(http.inside.rps)}, ${f(inspectedHttp.rps)}, ${f(https.inside.rps)} req/s | host direct: HTTP ${f(http.host.rps)}, HTTPS ${f(https.host.rps)} req/s | |`,
    ];
  } finally {
    await server?.cleanup();
    await world.close();
    await rm(dir, { recursive: true, force: true });
  }
}
