/**
 * The outside world of the network tests (test/helpers/outside-world.ts): every server answers
 * from the host (HTTP, HTTPS with the test CA, CONNECT relay, DoH, DoT, TCP and UDP echo, the
 * authoritative DNS, made-up and rebinding names), what they received is reported (arrivals at an
 * address too, where no server listens), and close() leaves no namespace or link
 * behind; a world whose test process was killed is swept by the next one. Needs root.
 */
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import dgram from 'node:dgram';
import { Resolver } from 'node:dns/promises';
import { readFileSync } from 'node:fs';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import path from 'node:path';
import { after, before, test } from 'node:test';
import tls from 'node:tls';
import { fileURLToPath } from 'node:url';
import dnsPacket from 'dns-packet';
import { countNetworkResources, startOutsideWorld, type OutsideWorld } from '../helpers/outside-world.ts';

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
const skip = process.getuid?.() !== 0 ? 'needs root (network namespaces)' : false;

let world: OutsideWorld;
let ca: string;
let resourcesBefore: Awaited<ReturnType<typeof countNetworkResources>>;

before(async () => {
  if (skip) return;
  resourcesBefore = await countNetworkResources();
  world = await startOutsideWorld();
  ca = readFileSync(world.caFile, 'utf8');
});
after(async () => {
  await world?.close();
});

interface Reply {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
}

function get(
  scheme: 'http' | 'https',
  name: string,
  p: string,
  options: { method?: string; body?: string | Buffer; headers?: Record<string, string> } = {},
): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const common = { host: world.ip(name), path: p, method: options.method ?? 'GET', headers: { host: name, ...options.headers }, agent: false as const };
    const req = scheme === 'https' ? https.request({ ...common, servername: name, ca }, collect) : http.request(common, collect);
    function collect(res: http.IncomingMessage) {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }));
      res.on('error', reject);
    }
    req.on('error', reject);
    req.end(options.body);
  });
}

function frame(message: Buffer): Buffer {
  const head = Buffer.alloc(2);
  head.writeUInt16BE(message.length);
  return Buffer.concat([head, message]);
}

function readFrame(socket: net.Socket | tls.TLSSocket): Promise<dnsPacket.DecodedPacket & { rcode?: string }> {
  let buffered = Buffer.alloc(0);
  return new Promise((resolve, reject) => {
    socket.on('error', reject);
    socket.on('data', (c: Buffer) => {
      buffered = Buffer.concat([buffered, c]);
      if (buffered.length >= 2 && buffered.length >= 2 + buffered.readUInt16BE(0))
        resolve(dnsPacket.decode(buffered.subarray(2, 2 + buffered.readUInt16BE(0))));
    });
  });
}

const aQuery = (name: string, id = 7) => dnsPacket.encode({ type: 'query', id, flags: dnsPacket.RECURSION_DESIRED, questions: [{ type: 'A', name }] });

test('HTTP and HTTPS on every web host echo the request, trusted through the test CA', { skip }, async () => {
  for (const name of ['api.allowed.test', 'other.allowed.test', 'denied.test', 'doh.test']) {
    for (const scheme of ['http', 'https'] as const) {
      const reply = await get(scheme, name, `/hello?x=1`, { method: 'POST', body: 'abcdef', headers: { authorization: 'Bearer t0k' } });
      assert.equal(reply.status, 200, `${scheme} ${name}`);
      const echo = JSON.parse(reply.body.toString());
      assert.deepEqual(
        { server: echo.server, method: echo.method, host: echo.host, path: echo.path, body_bytes: echo.body_bytes, scheme: echo.scheme },
        { server: name, method: 'POST', host: name, path: '/hello?x=1', body_bytes: 6, scheme },
      );
      assert.equal(echo.headers.authorization, 'Bearer t0k');
    }
  }
  // the certificate covers *.wild.allowed.test, served by other.allowed.test
  const wild = await get('https', 'deep.wild.allowed.test', '/');
  assert.equal(JSON.parse(wild.body.toString()).server, 'other.allowed.test');
  assert.equal(world.ip('deep.wild.allowed.test'), world.ip('other.allowed.test'));

  const big = await get('https', 'api.allowed.test', '/big?bytes=300001');
  assert.equal(big.body.length, 300001);
  assert.equal((await get('http', 'api.allowed.test', '/?status=418')).status, 418);

  const seen = await world.requests();
  const posts = seen.filter((r) => r.method === 'POST' && r.path === '/hello?x=1');
  assert.equal(posts.length, 8);
  assert.ok(posts.some((r) => r.host === 'denied.test' && r.scheme === 'https' && r.headers.authorization === 'Bearer t0k'));
  assert.ok(seen.some((r) => r.path === '/big?bytes=300001'));
});

test('a CONNECT through a web host is relayed and recorded', { skip }, async () => {
  const socket = net.connect(80, world.ip('api.allowed.test'));
  await new Promise((r) => socket.once('connect', r));
  socket.write('CONNECT denied.test:80 HTTP/1.1\r\nhost: denied.test:80\r\n\r\n');
  let text = '';
  socket.setEncoding('utf8');
  await new Promise<void>((resolve) => {
    socket.on('data', (d: string) => {
      text += d;
      if (text.includes('\r\n\r\n') && !text.includes('GET')) {
        if (text.startsWith('HTTP/1.1 200')) socket.write('GET /through HTTP/1.1\r\nhost: denied.test\r\nconnection: close\r\n\r\n');
        text += 'GET';
      }
    });
    socket.on('end', () => resolve());
  });
  assert.match(text, /^HTTP\/1.1 200 Connection Established/);
  assert.match(text, /"server":"denied.test"/);
  const seen = await world.requests();
  assert.ok(seen.some((r) => r.method === 'CONNECT' && r.server === 'api.allowed.test' && r.path === 'denied.test:80'));
  assert.ok(seen.some((r) => r.server === 'denied.test' && r.path === '/through'));
});

test('DNS over HTTPS (POST and GET) and over TLS answer every A with the denied host', { skip }, async () => {
  const post = await get('https', 'doh.test', '/dns-query', {
    method: 'POST',
    body: aQuery('api.allowed.test', 0xc3a9),
    headers: { 'content-type': 'application/dns-message', accept: 'application/dns-message' },
  });
  assert.equal(post.status, 200);
  assert.equal(post.headers['content-type'], 'application/dns-message');
  assert.deepEqual(
    dnsPacket.decode(post.body).answers?.map((a) => (a as dnsPacket.StringAnswer).data),
    [world.ip('denied.test')],
  );

  const viaGet = await get('https', 'doh.test', `/dns-query?dns=${aQuery('anything.example', 0).toString('base64url')}`);
  assert.equal(viaGet.status, 200);
  assert.deepEqual(
    dnsPacket.decode(viaGet.body).answers?.map((a) => (a as dnsPacket.StringAnswer).data),
    [world.ip('denied.test')],
  );
  assert.ok((await world.requests()).some((r) => r.server === 'doh.test' && r.path === '/dns-query' && r.method === 'POST'));

  const dot = tls.connect({ host: world.ip('doh.test'), port: 853, servername: 'doh.test', ca });
  await new Promise((r) => dot.once('secureConnect', r));
  const replied = readFrame(dot);
  dot.write(frame(aQuery('whatever.test', 99)));
  const reply = await replied;
  dot.destroy();
  assert.equal(reply.id, 99);
  assert.deepEqual(
    reply.answers?.map((a) => (a as dnsPacket.StringAnswer).data),
    [world.ip('denied.test')],
  );
  assert.equal(await world.dotQueries(), 1);
});

test('TCP and UDP echo on echo.allowed.test, counted', { skip }, async () => {
  const socket = net.connect(7000, world.ip('echo.allowed.test'));
  const echoed = await new Promise<string>((resolve, reject) => {
    socket.on('error', reject);
    socket.once('data', (d) => resolve(d.toString()));
    socket.write('ping over tcp');
  });
  socket.destroy();
  assert.equal(echoed, 'ping over tcp');
  assert.equal(await world.tcpConnections(), 1);

  const udp = dgram.createSocket('udp4');
  const back = await new Promise<string>((resolve) => {
    udp.once('message', (m) => resolve(m.toString()));
    udp.send('ping over udp', 7001, world.ip('echo.allowed.test'));
  });
  udp.close();
  assert.equal(back, 'ping over udp');
  assert.equal(await world.udpPackets(), 1);
});

test('the DNS server is authoritative for the world and NXDOMAIN otherwise, over UDP and TCP', { skip }, async () => {
  const r = new Resolver({ timeout: 1000, tries: 2 });
  r.setServers([world.dns]);
  for (const name of ['api.allowed.test', 'other.allowed.test', 'denied.test', 'doh.test', 'echo.allowed.test']) {
    assert.deepEqual(await r.resolve4(name), [world.ip(name)], name);
  }
  assert.deepEqual(await r.resolve4('a.b.wild.allowed.test'), [world.ip('other.allowed.test')]);
  await assert.rejects(r.resolve4('wild.allowed.test'), { code: 'ENOTFOUND' });
  await assert.rejects(r.resolve4('example.com'), { code: 'ENOTFOUND' });
  await assert.rejects(r.resolve6('api.allowed.test'), { code: 'ENODATA' });

  const [host, port] = world.dns.split(':');
  const socket = net.connect(Number(port), host);
  await new Promise((resolve) => socket.once('connect', resolve));
  const replied = readFrame(socket);
  socket.write(frame(aQuery('echo.allowed.test', 5)));
  const reply = await replied;
  socket.destroy();
  assert.deepEqual(
    reply.answers?.map((a) => (a as dnsPacket.StringAnswer).data),
    [world.ip('echo.allowed.test')],
  );

  const queries = await world.dnsQueries();
  assert.ok(queries.some((q) => q.name === 'example.com' && q.type === 'A' && q.source === world.dns.replace(/\.\d+:53$/, '.1')));
  assert.throws(() => world.ip('example.com'));
});

test('made-up names answer the address they name; a rebinding one the allowed host first, then its own', { skip }, async () => {
  const r = new Resolver({ timeout: 1000, tries: 2 });
  r.setServers([world.dns]);
  assert.deepEqual(await r.resolve4('169-254-169-254.ip.wild.allowed.test'), ['169.254.169.254']);
  assert.deepEqual(await r.resolve4('127-0-0-1.rebind.wild.allowed.test'), [world.ip('other.allowed.test')]);
  assert.deepEqual(await r.resolve4('127-0-0-1.rebind.wild.allowed.test'), ['127.0.0.1']);
  assert.deepEqual(await r.resolve4('127-0-0-1.rebind.wild.allowed.test'), ['127.0.0.1']);
  assert.deepEqual(await r.resolve4('1-2-3-999.ip.wild.allowed.test'), [world.ip('other.allowed.test')], 'not an address: an ordinary glob name');
});

test('arrivals() counts TCP connection attempts and UDP datagrams at an address, on ports where nothing listens too', { skip }, async () => {
  const before = await world.arrivals('denied.test');
  const elsewhere = await world.arrivals('doh.test');
  const refused = await new Promise<string>((resolve) =>
    net.connect(7654, world.ip('denied.test')).once('error', (e: NodeJS.ErrnoException) => resolve(e.code ?? '')),
  );
  assert.equal(refused, 'ECONNREFUSED');
  await get('http', 'denied.test', '/counted');
  const udp = dgram.createSocket('udp4');
  await new Promise<void>((resolve) => udp.send('quic?', 443, world.ip('denied.test'), () => resolve()));
  udp.close();
  const after = await eventually(
    () => world.arrivals('denied.test'),
    (a) => a.udp > before.udp,
  );
  assert.deepEqual(after, { tcp: before.tcp + 2, udp: before.udp + 1 });
  assert.deepEqual(await world.arrivals('doh.test'), elsewhere, 'counted per address');
});

test('reset() forgets what was recorded', { skip }, async () => {
  await get('http', 'api.allowed.test', '/before-reset');
  await world.reset();
  assert.deepEqual(await world.requests(), []);
  assert.equal(await world.tcpConnections(), 0);
  assert.deepEqual(await world.arrivals('api.allowed.test'), { tcp: 0, udp: 0 });
});

async function eventually<T>(read: () => Promise<T>, done: (value: T) => boolean): Promise<T> {
  let value = await read();
  for (const deadline = Date.now() + 2000; !done(value) && Date.now() < deadline; value = await read()) await new Promise((r) => setTimeout(r, 50));
  return value;
}

test('close() removes the namespace and the link; a world whose test process was killed is swept by the next one', { skip }, async () => {
  const ours = [`link ${world.hostLink}`, `netns ${world.namespace}`];
  const during = await countNetworkResources();
  for (const name of ours) assert.ok(during.names.includes(name), name);
  await world.close();
  await world.close();
  const after = await countNetworkResources();
  for (const name of ours) assert.ok(!after.names.includes(name), name);
  // other test files may create and remove such resources meanwhile: what is new since the
  // start must not be a world of this process (a world's host link names its owner)
  const added = after.names.filter((n) => !resourcesBefore.names.includes(n));
  const owners = JSON.parse(execFileSync('ip', ['-j', 'link', 'show'], { encoding: 'utf8' })) as Array<{ ifname: string; ifalias?: string }>;
  const mine = owners.filter((l) => added.includes(`link ${l.ifname}`) && (l.ifalias ?? '').startsWith(`svco-owner=${process.pid}:`));
  assert.deepEqual(mine, []);
  if (added.length === 0 && after.names.length === resourcesBefore.names.length) assert.deepEqual(after, resourcesBefore);
  await assert.rejects(world.requests(), /closed/);

  // a test process that dies without close(): its servers exit with it, its namespace stays
  // until the next startOutsideWorld() sweeps it
  const script = `import { startOutsideWorld } from ${JSON.stringify(path.join(REPO, 'test/helpers/outside-world.ts'))};
const w = await startOutsideWorld(); console.log(JSON.stringify({ ns: w.namespace, link: w.hostLink }));`;
  const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], { cwd: REPO, stdio: ['ignore', 'pipe', 'inherit'] });
  const started = await new Promise<{ ns: string; link: string }>((resolve, reject) => {
    let out = '';
    child.stdout!.on('data', (d) => {
      out += d;
      if (out.includes('\n')) resolve(JSON.parse(out));
    });
    child.on('exit', (code) => reject(new Error(`child exited ${code}`)));
  });
  child.kill('SIGKILL');
  await new Promise((r) => child.once('exit', r));
  let pids = 'x';
  for (let i = 0; i < 50 && pids; i++) {
    pids = execFileSync('ip', ['netns', 'pids', started.ns], { encoding: 'utf8' }).trim();
    if (pids) await new Promise((r) => setTimeout(r, 100));
  }
  assert.equal(pids, '', "the killed world's servers exit with their test process");
  const stale = await countNetworkResources();
  assert.ok(stale.names.includes(`netns ${started.ns}`));
  const next = await startOutsideWorld();
  try {
    const swept = await countNetworkResources();
    assert.ok(!swept.names.includes(`netns ${started.ns}`));
    assert.ok(!swept.names.includes(`link ${started.link}`));
  } finally {
    await next.close();
  }
});
