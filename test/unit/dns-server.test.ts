/**
 * The gateway's DNS server (UDP and TCP, answers from a callback, bounded against garbage and
 * floods) and the upstream resolver with its cache, against real sockets on the loopback.
 */
import assert from 'node:assert/strict';
import dgram from 'node:dgram';
import { Resolver } from 'node:dns/promises';
import net from 'node:net';
import { after, test } from 'node:test';
import dnsPacket from 'dns-packet';
import { GatewayDnsServer, MAX_IN_FLIGHT_PER_SOURCE, UpstreamResolver, type DnsAnswer } from '../../services/sandbox-runner/network/dns-server.ts';

const calls: Array<{ sourceIp: string; name: string; type: string }> = [];
const errors: Error[] = [];

async function policy(sourceIp: string, name: string, type: string): Promise<DnsAnswer> {
  calls.push({ sourceIp, name, type });
  if (name === 'fails.test') throw new Error('policy blew up');
  if (name === 'many.test') return { kind: 'addresses', addresses: Array.from({ length: 60 }, (_, i) => `10.1.${i}.1`), ttl: 30 };
  if (name === 'api.example.test' || name === 'mixed.test') {
    if (type === 'A') return { kind: 'addresses', addresses: ['10.0.0.7', '10.0.0.8', 'fd00::7'], ttl: 42 };
    if (type === 'AAAA' && name === 'mixed.test') return { kind: 'addresses', addresses: ['10.0.0.7', 'fd00::7'], ttl: 42 };
    return { kind: 'empty' };
  }
  return { kind: 'nxdomain', reason: 'not in the policy' };
}

const server = await GatewayDnsServer.start({ host: '127.0.0.1', port: 0, answer: policy, onError: (e) => errors.push(e) });
after(() => server.close());

function resolverFor(port: number): Resolver {
  const r = new Resolver({ timeout: 1000, tries: 1 });
  r.setServers([`127.0.0.1:${port}`]);
  return r;
}

function query(name: string, type: dnsPacket.RecordType = 'A', id = 1): Buffer {
  return dnsPacket.encode({ type: 'query', id, flags: dnsPacket.RECURSION_DESIRED, questions: [{ type, name, class: 'IN' }] });
}

/** Sends length-prefixed messages over one TCP connection and collects `count` replies. */
async function overTcp(port: number, frames: Buffer[], count: number): Promise<dnsPacket.DecodedPacket[]> {
  const socket = net.connect(port, '127.0.0.1');
  const replies: dnsPacket.DecodedPacket[] = [];
  let buffered = Buffer.alloc(0);
  return new Promise((resolve, reject) => {
    socket.on('error', reject);
    socket.on('data', (chunk) => {
      buffered = Buffer.concat([buffered, chunk]);
      while (buffered.length >= 2 && buffered.length >= 2 + buffered.readUInt16BE(0)) {
        replies.push(dnsPacket.decode(buffered.subarray(2, 2 + buffered.readUInt16BE(0))));
        buffered = buffered.subarray(2 + buffered.readUInt16BE(0));
      }
      if (replies.length >= count) {
        socket.destroy();
        resolve(replies);
      }
    });
    socket.on('close', () => resolve(replies));
    socket.on('connect', () => {
      for (const f of frames) {
        const head = Buffer.alloc(2);
        head.writeUInt16BE(f.length);
        socket.write(Buffer.concat([head, f]));
      }
    });
  });
}

/** Resolves with true when the server closes the connection after `data` within `ms`. */
async function closedAfter(port: number, data: Buffer, ms = 2000): Promise<boolean> {
  const socket = net.connect(port, '127.0.0.1');
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      socket.destroy();
      resolve(false);
    }, ms);
    socket.on('error', () => undefined);
    socket.on('close', () => {
      clearTimeout(timer);
      resolve(true);
    });
    socket.on('connect', () => socket.write(data));
  });
}

async function udpExchange(port: number, messages: Buffer[], waitMs: number): Promise<Buffer[]> {
  const socket = dgram.createSocket('udp4');
  const replies: Buffer[] = [];
  socket.on('message', (m) => replies.push(m));
  await new Promise<void>((resolve) => socket.bind(0, '127.0.0.1', () => resolve()));
  for (const m of messages) socket.send(m, port, '127.0.0.1');
  await new Promise((r) => setTimeout(r, waitMs));
  socket.close();
  return replies;
}

test('A over UDP: v4 addresses with their TTL, the source address and the lower-cased name reach the callback', async () => {
  const r = resolverFor(server.port);
  const got = await r.resolve4('API.Example.test', { ttl: true });
  assert.deepEqual(got, [
    { address: '10.0.0.7', ttl: 42 },
    { address: '10.0.0.8', ttl: 42 },
  ]);
  const call = calls.find((c) => c.name === 'api.example.test' && c.type === 'A');
  assert.ok(call);
  assert.equal(call.sourceIp, '127.0.0.1');
});

test('AAAA: v6 addresses only; empty is NOERROR without answers (ENODATA), not NXDOMAIN', async () => {
  const r = resolverFor(server.port);
  assert.deepEqual(await r.resolve6('mixed.test'), ['fd00::7']);
  await assert.rejects(r.resolve6('api.example.test'), { code: 'ENODATA' });
  const [raw] = await udpExchange(server.port, [query('api.example.test', 'AAAA', 9)], 200);
  const reply = dnsPacket.decode(raw) as dnsPacket.DecodedPacket & { rcode: string };
  assert.equal(reply.id, 9);
  assert.equal(reply.rcode, 'NOERROR');
  assert.equal(reply.answers?.length, 0);
});

test('NXDOMAIN for a name the policy refuses; SERVFAIL when the callback rejects', async () => {
  const r = resolverFor(server.port);
  await assert.rejects(r.resolve4('elsewhere.test'), { code: 'ENOTFOUND' });
  await assert.rejects(r.resolve4('fails.test'), { code: 'ESERVFAIL' });
  assert.ok(errors.some((e) => e.message === 'policy blew up'));
});

test('TCP: length-prefixed queries, pipelined on one connection', async () => {
  const replies = await overTcp(server.port, [query('api.example.test', 'A', 1), query('nope.test', 'A', 2), query('mixed.test', 'AAAA', 3)], 3);
  assert.equal(replies.length, 3);
  const byId = new Map(replies.map((p) => [p.id, p as dnsPacket.DecodedPacket & { rcode: string }]));
  assert.deepEqual(
    byId.get(1)?.answers?.map((a) => [a.type, (a as dnsPacket.StringAnswer).data]),
    [
      ['A', '10.0.0.7'],
      ['A', '10.0.0.8'],
    ],
  );
  assert.equal(byId.get(2)?.rcode, 'NXDOMAIN');
  assert.deepEqual(
    byId.get(3)?.answers?.map((a) => (a as dnsPacket.StringAnswer).data),
    ['fd00::7'],
  );
});

test('a reply too big for UDP is truncated and the resolver gets it whole over TCP', async () => {
  const [raw] = await udpExchange(server.port, [query('many.test')], 200);
  const reply = dnsPacket.decode(raw);
  assert.equal(reply.flag_tc, true);
  assert.equal(reply.answers?.length, 0);
  const r = resolverFor(server.port);
  assert.equal((await r.resolve4('many.test')).length, 60);
});

test('garbage does not crash it: malformed UDP is ignored, a TCP connection sending garbage or too much is closed', async () => {
  const garbage: Buffer[] = [Buffer.from('hello'), Buffer.alloc(0), Buffer.alloc(600, 0xff), Buffer.from([0, 1, 0, 0, 0, 50, 0, 0, 0, 0, 0, 0, 3, 0x41])];
  // a response (QR set) is not answered either, so the server cannot be bounced off
  garbage.push(dnsPacket.encode({ type: 'response', id: 5, questions: [{ type: 'A', name: 'api.example.test' }] }));
  assert.deepEqual(await udpExchange(server.port, garbage, 200), []);

  const badFrame = Buffer.concat([Buffer.from([0, 5]), Buffer.from('abcde')]);
  assert.equal(await closedAfter(server.port, badFrame), true);
  // a length prefix announcing 65535 bytes followed by more than 64 KiB
  assert.equal(await closedAfter(server.port, Buffer.concat([Buffer.from([0xff, 0xff]), Buffer.alloc(70 * 1024, 1)])), true);
  // and it still answers
  assert.deepEqual(await resolverFor(server.port).resolve4('api.example.test'), ['10.0.0.7', '10.0.0.8']);
});

test(`at most ${MAX_IN_FLIGHT_PER_SOURCE} queries per source address are in flight; the rest are dropped`, async () => {
  const release: Array<() => void> = [];
  let asked = 0;
  const slow = await GatewayDnsServer.start({
    host: '127.0.0.1',
    port: 0,
    answer: async () => {
      asked++;
      await new Promise<void>((r) => release.push(r));
      return { kind: 'addresses', addresses: ['10.2.2.2'], ttl: 5 };
    },
  });
  try {
    const socket = dgram.createSocket('udp4');
    const replies: Buffer[] = [];
    socket.on('message', (m) => replies.push(m));
    await new Promise<void>((r) => socket.bind(0, '127.0.0.1', () => r()));
    for (let i = 0; i < 100; i++) socket.send(query(`n${i}.test`, 'A', i), slow.port, '127.0.0.1');
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(asked, MAX_IN_FLIGHT_PER_SOURCE);
    for (const r of release.splice(0)) r();
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(replies.length, MAX_IN_FLIGHT_PER_SOURCE);
    // once answered, the slots are free again
    socket.send(query('again.test', 'A', 1000), slow.port, '127.0.0.1');
    await new Promise((r) => setTimeout(r, 100));
    assert.equal(asked, MAX_IN_FLIGHT_PER_SOURCE + 1);
    for (const r of release.splice(0)) r();
    socket.close();
  } finally {
    for (const r of release.splice(0)) r();
    await slow.close();
  }
});

test('the port is the same for UDP and TCP, and close() frees it', async () => {
  const s = await GatewayDnsServer.start({ host: '127.0.0.1', port: 0, answer: policy });
  const port = s.port;
  await s.close();
  await s.close();
  const again = await GatewayDnsServer.start({ host: '127.0.0.1', port, answer: policy });
  assert.equal(again.port, port);
  await again.close();
});

test('UpstreamResolver: addresses and TTL from the upstream, cached for the TTL, NXDOMAIN and NODATA as []', async () => {
  const asked: string[] = [];
  const ttls: Record<string, number> = { 'short.test': 1, 'long.test': 100000 };
  const upstream = await GatewayDnsServer.start({
    host: '127.0.0.1',
    port: 0,
    answer: async (_source, name, type) => {
      asked.push(`${type} ${name}`);
      if (name === 'broken.test') throw new Error('upstream failure');
      if (name === 'v6only.test') return { kind: 'empty' };
      if (name in ttls) return { kind: 'addresses', addresses: ['10.3.3.3', '10.3.3.4'], ttl: ttls[name] };
      return { kind: 'nxdomain', reason: 'unknown' };
    },
  });
  try {
    const resolver = new UpstreamResolver([`127.0.0.1:${upstream.port}`]);
    assert.deepEqual(await resolver.lookup4('long.test'), { addresses: ['10.3.3.3', '10.3.3.4'], ttl: 300 });
    assert.deepEqual((await resolver.lookup4('LONG.test.')).addresses, ['10.3.3.3', '10.3.3.4']);
    assert.deepEqual(asked, ['A long.test']);

    // concurrent lookups of one name share one query
    const both = await Promise.all([resolver.lookup4('short.test'), resolver.lookup4('short.test')]);
    assert.deepEqual(both[0], both[1]);
    assert.equal(both[0].ttl, 1);
    assert.equal(asked.filter((a) => a === 'A short.test').length, 1);
    await resolver.lookup4('short.test');
    assert.equal(asked.filter((a) => a === 'A short.test').length, 1);
    await new Promise((r) => setTimeout(r, 1100));
    await resolver.lookup4('short.test');
    assert.equal(asked.filter((a) => a === 'A short.test').length, 2);

    assert.deepEqual((await resolver.lookup4('missing.test')).addresses, []);
    assert.deepEqual((await resolver.lookup4('v6only.test')).addresses, []);
    // negative answers are cached too
    await resolver.lookup4('missing.test');
    assert.equal(asked.filter((a) => a === 'A missing.test').length, 1);

    await assert.rejects(resolver.lookup4('broken.test'), { code: 'ESERVFAIL' });
  } finally {
    await upstream.close();
  }
});

test('UpstreamResolver: an upstream that does not answer rejects (not an empty answer)', async () => {
  const gone = await GatewayDnsServer.start({ host: '127.0.0.1', port: 0, answer: policy });
  const port = gone.port;
  await gone.close();
  const resolver = new UpstreamResolver([`127.0.0.1:${port}`]);
  await assert.rejects(resolver.lookup4('api.example.test'), (err: NodeJS.ErrnoException) => {
    assert.ok(['ECONNREFUSED', 'ETIMEOUT'].includes(err.code ?? ''), err.code);
    return true;
  });
});
