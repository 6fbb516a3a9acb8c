/**
 * Red team: another tenant's ingress. Tenant A publishes port 8080 of its sandbox
 * (`ingress.allow`), which the service relays from a port on the host's loopback. Tenant B's agent,
 * in a sandbox whose egress allows everything, tries every road to it: A's sandbox address (TCP and
 * an HTTP Host header), the published port on the host's loopback under every spelling of
 * loopback a Host header or a proxy request can carry (127.0.0.1, 127.1, 2130706433, 0x7f000001,
 * localhost, 0.0.0.0, [::1], [::ffff:127.0.0.1]), CONNECT through the gateway, and every address
 * of the host. Pins: none of them reaches A's server (its log stays empty), while the host itself
 * does reach the published port (so the probe can tell). test/e2e/sandbox-network.test.ts covers
 * the same-tenant, egress-deny case.
 */
import assert from 'node:assert/strict';
import os from 'node:os';
import { after, before, describe, test } from 'node:test';
import { backend } from '../helpers/backend.ts';
import { SPEC, storeSpec } from '../helpers/sandboxes.ts';
import { createTenantKey, startServer, type TestServer } from '../helpers/server.ts';

const MARKER = `tenant-a-ingress-${Date.now()}`;
const runtime = backend('SVC_TEST_BWRAP', "another tenant's ingress on the local runtime");

describe("red team: reaching another tenant's published port", { skip: !runtime }, () => {
  let server: TestServer;
  let keyA: string;
  let keyB: string;
  let a: { id: string; address: string; published: { host: string; port: number } };
  let b: { id: string; address: string };

  const run = async (key: string, id: string, command: string, background = false) => {
    const res = await server.request('POST', `/v1/sandboxes/${id}/commands`, { key, body: { command, background, timeout: '60s' } });
    assert.equal(res.status, background ? 202 : 200, res.text);
    return res.body as { stdout: string; stderr: string; exit_code: number };
  };
  const create = async (key: string, spec: string) => {
    const res = await server.request('POST', '/v1/sandboxes', { key, body: { spec_id: spec } });
    assert.equal(res.status, 201, res.text);
    return res.body;
  };
  /** What A's server has logged: every request that reached it. */
  const reachedA = async () => (await run(keyA, a.id, 'cat /tmp/ingress.log')).stdout;

  before(async () => {
    server = await startServer({ SVC_SANDBOX_HOST_ROOTFS: 'true', SVC_RATE_LIMIT_WRITES: '0', SVC_RATE_LIMIT_READS: '0' });
    keyA = (await createTenantKey(server, 'ingress-a')).key;
    keyB = (await createTenantKey(server, 'ingress-b')).key;
    await storeSpec(server, keyA, SPEC('published', 'network:\n  egress: {default: deny}\n  ingress:\n    allow: [{from: host, to_port: 8080}]\n'));
    await storeSpec(server, keyB, SPEC('open', 'network:\n  egress:\n    default: allow\n    allow: ["*"]\n'));
    const [sa, sb] = await Promise.all([create(keyA, 'published'), create(keyB, 'open')]);
    a = { id: sa.id, address: sa.network.address, published: sa.network.ingress[0] };
    b = { id: sb.id, address: sb.network.address };
    assert.equal(a.published.host, '127.0.0.1', JSON.stringify(sa.network));
    await run(keyA, a.id, `cd "$SVC_WORKSPACE" && echo ${MARKER} > marker && exec python3 -m http.server 8080 --bind 0.0.0.0 > /tmp/ingress.log 2>&1`, true);
    const up = await run(keyA, a.id, 'for i in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:8080/ && echo up && break; sleep 0.1; done');
    assert.equal(up.stdout.trim(), 'up', "A's server did not start");
  });
  after(async () => server?.cleanup());

  test('the host reaches the published port (the probe below can tell a hit)', async () => {
    const page = await fetch(`http://${a.published.host}:${a.published.port}/marker`);
    assert.equal(page.status, 200);
    assert.equal((await page.text()).trim(), MARKER);
    assert.match(await reachedA(), /GET \/marker/);
    await run(keyA, a.id, ': > /tmp/ingress.log');
  });

  test("tenant B's agent, egress open, reaches A's server by no road", async () => {
    const port = a.published.port;
    const loopbacks = ['127.0.0.1', '127.1', '2130706433', '0x7f000001', 'localhost', '0.0.0.0', '[::1]', '[::ffff:127.0.0.1]', '[::ffff:7f00:1]'];
    const hostAddresses = Object.values(os.networkInterfaces())
      .flatMap((l) => l ?? [])
      .filter((i) => i.family === 'IPv4' && !i.internal)
      .map((i) => i.address);
    const c = (args: string) => `curl -sS -m 5 ${args} 2>&1; echo " [exit $?]"`;
    const roads: Array<[string, string]> = [
      ["A's address, TCP", c(`http://${a.address}:8080/marker`)],
      ["A's address, Host header on port 80", c(`-H 'Host: ${a.address}:8080' http://192.0.2.1/marker`)],
      ["A's address, absolute-form proxy request", c(`-x http://192.0.2.1:80 http://${a.address}:8080/marker`)],
      ["A's address, CONNECT", c(`-p -x http://192.0.2.1:80 http://${a.address}:8080/marker`)],
      ...loopbacks.flatMap(
        (host): Array<[string, string]> => [
          [`${host}, Host header`, c(`-H 'Host: ${host}:${port}' http://192.0.2.1/marker`)],
          [`${host}, absolute-form proxy request`, c(`-x http://192.0.2.1:80 'http://${host}:${port}/marker'`)],
          [`${host}, CONNECT`, c(`-p -x http://192.0.2.1:80 'http://${host}:${port}/marker'`)],
        ],
      ),
      ...[...hostAddresses, b.address.replace(/\.\d+$/, (last) => `.${Number(last.slice(1)) - 1}`)].map((ip): [string, string] => [
        `the host at ${ip}, TCP`,
        c(`http://${ip}:${port}/marker`),
      ]),
    ];
    const tried = await run(keyB, b.id, roads.map(([what, command]) => `echo "== ${what}"; ${command}`).join('\n'));
    assert.ok(!tried.stdout.includes(MARKER), `a road reached A's server:\n${tried.stdout}`);
    for (const [what] of roads) assert.ok(tried.stdout.includes(`== ${what}\n`), `${what} was tried:\n${tried.stdout}`);
    assert.equal(await reachedA(), '', "A's server heard from B");
  });
});
