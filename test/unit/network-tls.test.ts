/**
 * The sandbox network's TLS and relay parts, against real sockets: the deployment's CA (made
 * once, shared by racing processes, or the operator's), leaves served through a real HTTPS
 * server and verified by a real client, the ClientHello reader on hellos captured from
 * `tls.connect`, a published port relaying a TCP echo, and header redaction.
 */
import 'reflect-metadata';
import * as x509 from '@peculiar/x509';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import crypto, { webcrypto } from 'node:crypto';
import { mkdtemp, readdir, readFile, rm, stat, unlink, writeFile } from 'node:fs/promises';
import http from 'node:http';
import https from 'node:https';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import tls from 'node:tls';
import { fileURLToPath } from 'node:url';
import { CA_COMMON_NAME, CertificateAuthority, normalizeHostname } from '../../services/sandbox-runner/network/certificate-authority.ts';
import { MAX_CLIENT_HELLO, readClientHello } from '../../services/sandbox-runner/network/client-hello.ts';
import { MAX_HEADER_VALUE, MAX_HEADERS, REDACTED, redactHeaders } from '../../services/sandbox-runner/network/headers.ts';
import { publishPort } from '../../services/sandbox-runner/network/ingress.ts';

x509.cryptoProvider.set(webcrypto as unknown as Crypto);

const CA_MODULE = fileURLToPath(new URL('../../services/sandbox-runner/network/certificate-authority.ts', import.meta.url));
const SERVER_AUTH = '1.3.6.1.5.5.7.3.1';

let tmp: string;
before(async () => {
  tmp = await mkdtemp(path.join(os.tmpdir(), 'network-tls-'));
});
after(async () => {
  await rm(tmp, { recursive: true, force: true });
});

const freshDir = () => mkdtemp(path.join(tmp, 'ca-'));

function listen(server: net.Server, host = '127.0.0.1'): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, host, () => resolve((server.address() as net.AddressInfo).port));
  });
}

const closeServer = (server: net.Server) => new Promise<void>((resolve) => server.close(() => resolve()));

function publicKeyOf(pem: string): string {
  return new crypto.X509Certificate(pem).publicKey.export({ type: 'spki', format: 'pem' }) as string;
}

// ---------------------------------------------------------------------------------------------
// The certificate authority

describe('CertificateAuthority', () => {
  test('is generated once in its dir and reused by the next open()', async () => {
    const dir = await freshDir();
    const first = await CertificateAuthority.open({ dir });
    const files = { cert: await readFile(path.join(dir, 'ca.pem'), 'utf8'), key: await readFile(path.join(dir, 'ca-key.pem'), 'utf8') };
    const keyStat = await stat(path.join(dir, 'ca-key.pem'));
    assert.equal(keyStat.mode & 0o777, 0o600);
    assert.equal(first.certPem.trim(), files.cert.trim());

    const again = await CertificateAuthority.open({ dir, certFile: null, keyFile: null });
    assert.equal(again.certPem, first.certPem);
    assert.equal(await readFile(path.join(dir, 'ca-key.pem'), 'utf8'), files.key);
    assert.equal((await stat(path.join(dir, 'ca-key.pem'))).ino, keyStat.ino);
    assert.deepEqual((await readdir(dir)).sort(), ['ca-key.pem', 'ca.pem']);

    const cert = new x509.X509Certificate(first.certPem);
    assert.equal(cert.subject, `CN=${CA_COMMON_NAME}`);
    assert.equal(cert.issuer, cert.subject);
    assert.ok(await cert.verify({ signatureOnly: true }));
    assert.equal((cert.publicKey.algorithm as EcKeyAlgorithm).namedCurve, 'P-256');
    const basic = cert.getExtension(x509.BasicConstraintsExtension)!;
    assert.ok(basic.ca && basic.critical);
    const usage = cert.getExtension(x509.KeyUsagesExtension)!;
    assert.ok(usage.critical);
    assert.equal(usage.usages, x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign);
    const years = (cert.notAfter.getTime() - cert.notBefore.getTime()) / (365.25 * 86_400_000);
    assert.ok(years > 9.99 && years < 10.01, `validity ${years} years`);
    assert.ok(crypto.createPrivateKey(files.key).asymmetricKeyType === 'ec');
  });

  test('open() racing in one process and in several processes ends with one matching pair', async () => {
    const dir = await freshDir();
    const inProcess = await Promise.all(Array.from({ length: 8 }, () => CertificateAuthority.open({ dir })));
    assert.equal(new Set(inProcess.map((ca) => ca.certPem)).size, 1);

    const dir2 = await freshDir();
    const script = `import { CertificateAuthority } from ${JSON.stringify(CA_MODULE)};
      const ca = await CertificateAuthority.open({ dir: ${JSON.stringify(dir2)} });
      await ca.secureContextFor('race.example.test');
      process.stdout.write(ca.certPem);`;
    const run = () =>
      new Promise<string>((resolve, reject) =>
        execFile(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], { cwd: process.cwd() }, (err, stdout, stderr) =>
          err ? reject(new Error(`${err.message}\n${stderr}`)) : resolve(stdout),
        ),
      );
    const outputs = await Promise.all([run(), run(), run(), run(), CertificateAuthority.open({ dir: dir2 }).then((ca) => ca.certPem)]);
    assert.equal(new Set(outputs).size, 1, 'every process has the same CA');
    const key = await readFile(path.join(dir2, 'ca-key.pem'), 'utf8');
    assert.ok(new crypto.X509Certificate(outputs[0]).checkPrivateKey(crypto.createPrivateKey(key)));
    assert.deepEqual((await readdir(dir2)).sort(), ['ca-key.pem', 'ca.pem'], 'no temporary file left');
  });

  test('a key left without its certificate gets one; a mismatched pair is refused', async () => {
    const dir = await freshDir();
    const first = await CertificateAuthority.open({ dir });
    await unlink(path.join(dir, 'ca.pem'));
    const remade = await CertificateAuthority.open({ dir });
    assert.notEqual(remade.certPem, first.certPem);
    assert.equal(publicKeyOf(remade.certPem), publicKeyOf(first.certPem));

    const other = await freshDir();
    await CertificateAuthority.open({ dir: other });
    await writeFile(path.join(dir, 'ca.pem'), await readFile(path.join(other, 'ca.pem')));
    await assert.rejects(CertificateAuthority.open({ dir }), /not the key of the certificate/);
  });

  test("the operator's CA (RSA, PKCS#1 key) signs the leaves; half a setting or a non-CA is refused", async () => {
    const dir = await freshDir();
    const keys = await webcrypto.subtle.generateKey(
      { name: 'RSASSA-PKCS1-v1_5', modulusLength: 2048, publicExponent: new Uint8Array([1, 0, 1]), hash: 'SHA-256' },
      true,
      ['sign', 'verify'],
    );
    const keyPem = crypto.KeyObject.from(keys.privateKey).export({ type: 'pkcs1', format: 'pem' }) as string;
    assert.match(keyPem, /BEGIN RSA PRIVATE KEY/);
    const make = (ca: boolean) =>
      x509.X509CertificateGenerator.createSelfSigned({
        name: 'CN=Operator Test Root, O=Example',
        keys,
        notBefore: new Date(Date.now() - 60_000),
        notAfter: new Date(Date.now() + 86_400_000 * 30),
        extensions: [new x509.BasicConstraintsExtension(ca, undefined, true), new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign, true)],
      });
    const certFile = path.join(dir, 'operator.pem');
    const keyFile = path.join(dir, 'operator-key.pem');
    await writeFile(certFile, (await make(true)).toString('pem'));
    await writeFile(keyFile, keyPem);

    const ca = await CertificateAuthority.open({ dir, certFile, keyFile });
    assert.equal(publicKeyOf(ca.certPem), publicKeyOf(await readFile(certFile, 'utf8')));
    assert.deepEqual((await readdir(dir)).sort(), ['operator-key.pem', 'operator.pem'], 'nothing generated');
    const server = await sniServer(ca);
    try {
      const got = await httpsGet({ port: server.port, servername: 'op.example.test', ca: ca.certPem });
      assert.equal(got.body, 'hello op.example.test');
      assert.match(got.cert.issuer.CN as string, /Operator Test Root/);
      // The leaf notAfter never passes the CA's.
      assert.ok(new Date(got.cert.valid_to).getTime() <= new Date(new crypto.X509Certificate(ca.certPem).validTo).getTime());
    } finally {
      await server.close();
    }

    await assert.rejects(CertificateAuthority.open({ dir, certFile, keyFile: null }), /both/);
    await writeFile(certFile, (await make(false)).toString('pem'));
    await assert.rejects(CertificateAuthority.open({ dir, certFile, keyFile }), /not a CA/);
  });
});

// ---------------------------------------------------------------------------------------------
// Leaves through real TLS

/** An HTTPS server choosing its certificate by SNI through secureContextFor. */
async function sniServer(ca: CertificateAuthority): Promise<{ port: number; close(): Promise<void> }> {
  const server = https.createServer(
    {
      SNICallback: (name, done) => {
        ca.secureContextFor(name).then(
          (context) => done(null, context),
          (err: Error) => done(err),
        );
      },
    },
    (req, res) => res.end(`hello ${req.headers.host}`),
  );
  const port = await listen(server);
  return { port, close: () => closeServer(server) };
}

/**
 * A front like the egress proxy's: reads the ClientHello without consuming it, then serves TLS
 * with a leaf for the SNI name, or for the address the client dialled when there is none.
 */
async function peekingServer(ca: CertificateAuthority, host: string): Promise<{ port: number; close(): Promise<void> }> {
  const app = http.createServer((req, res) => res.end(`hello ${req.headers.host}`));
  const front = net.createServer((socket) => {
    let buffered = Buffer.alloc(0);
    const onData = (chunk: Buffer) => {
      buffered = Buffer.concat([buffered, chunk]);
      const hello = readClientHello(buffered);
      if (hello.state === 'incomplete') return;
      socket.off('data', onData);
      socket.pause();
      if (hello.state === 'not-tls') return void socket.destroy();
      socket.unshift(buffered);
      ca.secureContextFor(hello.serverName ?? socket.localAddress!).then(
        (secureContext) => app.emit('connection', new tls.TLSSocket(socket, { isServer: true, secureContext })),
        () => socket.destroy(),
      );
    };
    socket.on('data', onData);
  });
  const port = await listen(front, host);
  return { port, close: () => closeServer(front) };
}

function httpsGet(options: {
  host?: string;
  port: number;
  servername?: string;
  ca?: string;
  checkName?: string;
}): Promise<{ body: string; cert: tls.DetailedPeerCertificate }> {
  return new Promise((resolve, reject) => {
    const request = https.get(
      {
        host: options.host ?? '127.0.0.1',
        port: options.port,
        servername: options.servername,
        ca: options.ca,
        agent: false,
        headers: options.servername ? { host: options.servername } : {},
        ...(options.checkName ? { checkServerIdentity: (_host: string, cert: tls.PeerCertificate) => tls.checkServerIdentity(options.checkName!, cert) } : {}),
      },
      (res) => {
        const cert = (res.socket as tls.TLSSocket).getPeerCertificate(true);
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (chunk) => (body += chunk));
        res.on('end', () => resolve({ body, cert }));
      },
    );
    request.on('error', reject);
  });
}

describe('secureContextFor', () => {
  let ca: CertificateAuthority;
  before(async () => {
    ca = await CertificateAuthority.open({ dir: await freshDir() });
  });

  test('an HTTPS server by SNI serves two hostnames that a client trusting the CA verifies', async () => {
    const server = await sniServer(ca);
    try {
      const a = await httpsGet({ port: server.port, servername: 'api.example.test', ca: ca.certPem });
      const b = await httpsGet({ port: server.port, servername: 'Other.Example.Test', ca: ca.certPem });
      assert.equal(a.body, 'hello api.example.test');
      assert.equal(b.body, 'hello Other.Example.Test');
      assert.equal(a.cert.subjectaltname, 'DNS:api.example.test');
      assert.equal(b.cert.subjectaltname, 'DNS:other.example.test');
      assert.equal(a.cert.issuer.CN, CA_COMMON_NAME);
      assert.deepEqual(a.cert.ext_key_usage, [SERVER_AUTH]);
      assert.equal(a.cert.pubkey!.toString('hex'), b.cert.pubkey!.toString('hex'), 'one leaf key pair per process');
      assert.notEqual(a.cert.serialNumber, b.cert.serialNumber);
      const from = new Date(a.cert.valid_from).getTime();
      const to = new Date(a.cert.valid_to).getTime();
      assert.ok(Math.abs(Date.now() - 3_600_000 - from) < 120_000, `valid from ${a.cert.valid_from}`);
      assert.equal(to - from, 7 * 86_400_000);
      assert.ok(!a.cert.issuerCertificate || a.cert.issuerCertificate.subject.CN === CA_COMMON_NAME);

      // The leaf is only for its name, and only for clients trusting the CA.
      await assert.rejects(httpsGet({ port: server.port, servername: 'api.example.test', ca: ca.certPem, checkName: 'evil.example.test' }), /altnames/);
      await assert.rejects(httpsGet({ port: server.port, servername: 'api.example.test' }), (err: NodeJS.ErrnoException) =>
        /UNABLE_TO_GET_ISSUER|SELF_SIGNED|UNABLE_TO_VERIFY/.test(String(err.code)),
      );
    } finally {
      await server.close();
    }
  });

  test('a client dialling an IP without SNI gets a leaf with that IP SAN', async () => {
    const server = await peekingServer(ca, '127.0.0.1');
    try {
      const got = await httpsGet({ host: '127.0.0.1', port: server.port, ca: ca.certPem });
      assert.equal(got.cert.subjectaltname, 'IP Address:127.0.0.1');
      assert.match(got.body, /^hello 127\.0\.0\.1:/);
      const named = await httpsGet({ port: server.port, servername: 'peek.example.test', ca: ca.certPem });
      assert.equal(named.cert.subjectaltname, 'DNS:peek.example.test');
    } finally {
      await server.close();
    }
  });

  test('an IPv6 literal gets an IP SAN too', async (t) => {
    let server: { port: number; close(): Promise<void> };
    try {
      server = await peekingServer(ca, '::1');
    } catch {
      return t.skip('no IPv6 loopback here');
    }
    try {
      const got = await httpsGet({ host: '::1', port: server.port, ca: ca.certPem });
      assert.equal(got.cert.subjectaltname, 'IP Address:0:0:0:0:0:0:0:1');
    } finally {
      await server.close();
    }
  });

  test('concurrent requests share one context, a normalized name hits the cache; bad names are refused', async () => {
    const [a, b] = [ca.secureContextFor('dedup.example.test'), ca.secureContextFor('DEDUP.example.test.')];
    assert.equal(a, b);
    assert.equal(await a, await ca.secureContextFor('dedup.example.test'));
    assert.ok(await ca.secureContextFor('::1'));
    assert.ok(await ca.secureContextFor('under_score.example.test'));
    assert.equal(normalizeHostname('A.b.'), 'a.b');
    const bad = [
      '',
      '*.example.com',
      'a.*.com',
      '-a.example.com',
      'a-.example.com',
      'a..b',
      '.',
      'a b',
      'exämple.com',
      'a/b',
      '1.2.3',
      'fe80::1%eth0',
      `${'a'.repeat(64)}.com`,
      `${'a.'.repeat(127)}com`,
    ];
    for (const name of bad) await assert.rejects(ca.secureContextFor(name), /invalid hostname|empty hostname/, name);
    assert.ok(await ca.secureContextFor(`${'a'.repeat(63)}.${'b'.repeat(63)}.${'c'.repeat(63)}.${'d'.repeat(57)}.com`));
  });
});

// ---------------------------------------------------------------------------------------------
// ClientHello

/** The first TLS record a real `tls.connect` sends, captured by a plain TCP server. */
async function captureHello(options: tls.ConnectionOptions): Promise<Buffer> {
  let resolveHello!: (hello: Buffer) => void;
  const captured = new Promise<Buffer>((resolve) => (resolveHello = resolve));
  const server = net.createServer((socket) => {
    let buffered = Buffer.alloc(0);
    socket.on('data', (chunk) => {
      buffered = Buffer.concat([buffered, chunk]);
      if (buffered.length >= 5 && buffered.length >= 5 + buffered.readUInt16BE(3)) {
        resolveHello(buffered.subarray(0, 5 + buffered.readUInt16BE(3)));
        socket.destroy();
      }
    });
  });
  const port = await listen(server);
  const client = tls.connect({ host: '127.0.0.1', port, ...options });
  client.on('error', () => {});
  try {
    return await captured;
  } finally {
    client.destroy();
    await closeServer(server);
  }
}

/** The same handshake bytes re-cut into records of `size` bytes. */
function refragment(hello: Buffer, size: number): Buffer {
  const handshake = hello.subarray(5);
  const records: Buffer[] = [];
  for (let at = 0; at < handshake.length; at += size) {
    const piece = handshake.subarray(at, at + size);
    const header = Buffer.from([22, 3, 1, 0, 0]);
    header.writeUInt16BE(piece.length, 3);
    records.push(header, piece);
  }
  return Buffer.concat(records);
}

describe('readClientHello', () => {
  let withSni: Buffer;
  let withAlpn: Buffer;
  let noSni: Buffer;
  before(async () => {
    withSni = await captureHello({ servername: 'api.example.test' });
    withAlpn = await captureHello({ servername: 'h2.example.test', ALPNProtocols: ['h2', 'http/1.1'], maxVersion: 'TLSv1.2' });
    noSni = await captureHello({});
  });

  test('reads SNI and ALPN from real hellos', () => {
    assert.deepEqual(readClientHello(withSni), { state: 'tls', serverName: 'api.example.test', alpn: [] });
    assert.deepEqual(readClientHello(withAlpn), { state: 'tls', serverName: 'h2.example.test', alpn: ['h2', 'http/1.1'] });
    assert.deepEqual(readClientHello(noSni), { state: 'tls', serverName: null, alpn: [] });
    // Bytes after the hello (the client's next flight, or garbage) do not matter.
    assert.deepEqual(readClientHello(Buffer.concat([withSni, Buffer.from('\x17\x03\x03 trailing')])), readClientHello(withSni));
  });

  test('every shorter prefix is incomplete', () => {
    for (const hello of [withSni, withAlpn, noSni]) {
      for (let i = 0; i < hello.length; i++) assert.deepEqual(readClientHello(hello.subarray(0, i)), { state: 'incomplete' }, `prefix ${i}`);
    }
  });

  test('a hello spanning several records reads the same, and its prefixes are incomplete', () => {
    const expected = readClientHello(withAlpn);
    for (const size of [1, 2, 3, 4, 5, 7, 64, 200]) {
      const split = refragment(withAlpn, size);
      assert.deepEqual(readClientHello(split), expected, `records of ${size}`);
      if (size === 7) for (let i = 0; i < split.length; i++) assert.equal(readClientHello(split.subarray(0, i)).state, 'incomplete', `prefix ${i}`);
    }
    // A non-handshake record before the hello is complete ends it.
    const split = refragment(withSni, 40);
    const alert = Buffer.from([21, 3, 3, 0, 2, 2, 40]);
    assert.equal(readClientHello(Buffer.concat([split.subarray(0, 45), alert, split.subarray(45)])).state, 'not-tls');
  });

  test('other protocols and malformed hellos are not-tls', () => {
    for (const text of ['GET / HTTP/1.1\r\nHost: a\r\n\r\n', 'SSH-2.0-OpenSSH_9.2\r\n', 'CONNECT a:443 HTTP/1.1\r\n', '\x00', '\x16\x02']) {
      assert.equal(readClientHello(Buffer.from(text, 'latin1')).state, 'not-tls', JSON.stringify(text));
    }
    const notTls = (bytes: number[] | Buffer, why: string) => assert.equal(readClientHello(Buffer.from(bytes)).state, 'not-tls', why);
    notTls([0x80, 0x2e, 0x01, 0x03, 0x01], 'SSLv2-compatible hello');
    notTls([22, 3, 1, 0, 0], 'empty record');
    notTls([22, 3, 1, 0x40, 0x01], 'record over 2^14');
    notTls([22, 3, 1, 0, 4, 2, 0, 0, 0], 'ServerHello first');
    const huge = Buffer.from([22, 3, 1, 0, 4, 1, 0, 0, 0]);
    huge.writeUIntBE(MAX_CLIENT_HELLO + 1, 6, 3);
    notTls(huge, 'hello over 16 KiB');
    notTls([22, 3, 1, 0, 6, 1, 0, 0, 2, 3, 3], 'hello too short for its fields');

    // Lengths that do not add up: the SNI extension's name length made one too long.
    const mutated = Buffer.from(withSni);
    const at = mutated.indexOf('api.example.test');
    mutated.writeUInt16BE(mutated.readUInt16BE(at - 2) + 1, at - 2);
    notTls(mutated, 'host name overruns its list');
    // A control character in the name.
    const control = Buffer.from(withSni);
    control[at + 3] = 0x0a;
    notTls(control, 'control char in SNI');
  });

  test('never throws on garbage or on mutated hellos', () => {
    const states = new Set(['incomplete', 'not-tls', 'tls']);
    for (let i = 0; i < 3_000; i++) {
      const random = crypto.randomBytes(crypto.randomInt(0, 600));
      if (i % 2 === 0 && random.length > 3) random.set([22, 3, 1], 0);
      assert.ok(states.has(readClientHello(random).state));
      const hello = Buffer.from(i % 3 === 0 ? withAlpn : withSni);
      for (let k = 0; k < 1 + (i % 4); k++) hello[crypto.randomInt(hello.length)] = crypto.randomInt(256);
      const cut = hello.subarray(0, crypto.randomInt(hello.length + 1));
      assert.ok(states.has(readClientHello(cut).state));
    }
  });
});

// ---------------------------------------------------------------------------------------------
// Ingress

describe('publishPort', () => {
  let echo: net.Server;
  let echoPort: number;
  before(async () => {
    echo = net.createServer({ allowHalfOpen: true }, (socket) => {
      socket.pipe(socket); // ends its side when the client ends its own: a half-open echo
      socket.on('error', () => {});
    });
    echoPort = await listen(echo);
  });
  after(() => closeServer(echo));

  function roundTrip(port: number, payload: Buffer): Promise<Buffer> {
    return new Promise((resolve, reject) => {
      const chunks: Buffer[] = [];
      const socket = net.connect({ host: '127.0.0.1', port, allowHalfOpen: true }, () => socket.end(payload));
      socket.on('data', (chunk) => chunks.push(chunk));
      socket.on('end', () => resolve(Buffer.concat(chunks)));
      socket.on('error', reject);
    });
  }

  test('relays a TCP echo, the reply arriving after the client shut down its side', async () => {
    const published = await publishPort({ host: '127.0.0.1', port: echoPort }, { host: '127.0.0.1' });
    try {
      assert.equal(published.host, '127.0.0.1');
      assert.ok(published.port > 0 && published.port !== echoPort);
      const payload = crypto.randomBytes(3 * 1024 * 1024);
      const [big, small] = await Promise.all([roundTrip(published.port, payload), roundTrip(published.port, Buffer.from('ping'))]);
      assert.ok(big.equals(payload));
      assert.equal(small.toString(), 'ping');
    } finally {
      await published.close();
    }
  });

  test('close() cuts open connections and stops listening; an unreachable target closes the client', async () => {
    const published = await publishPort({ host: '127.0.0.1', port: echoPort }, { host: '127.0.0.1', port: 0 });
    const socket = net.connect({ host: '127.0.0.1', port: published.port });
    socket.on('error', () => {});
    await new Promise((resolve) => socket.once('connect', resolve));
    socket.write('hello');
    await new Promise((resolve) => socket.once('data', resolve));
    const closed = new Promise((resolve) => socket.once('close', resolve));
    await published.close();
    await closed;
    await assert.rejects(roundTrip(published.port, Buffer.from('x')), /ECONNREFUSED/);

    const dead = net.createServer();
    const deadPort = await listen(dead);
    await closeServer(dead);
    const nowhere = await publishPort({ host: '127.0.0.1', port: deadPort }, { host: '127.0.0.1' });
    try {
      const client = net.connect({ host: '127.0.0.1', port: nowhere.port });
      client.on('error', () => {});
      await new Promise((resolve) => client.once('close', resolve));
    } finally {
      await nowhere.close();
    }
  });
});

// ---------------------------------------------------------------------------------------------
// Headers

test('redactHeaders: lowercased, credentials redacted, arrays joined, bounded', () => {
  const out = redactHeaders({
    Host: 'api.example.test',
    'Content-Type': 'application/json',
    Authorization: 'Bearer sk-live-123',
    'Proxy-Authorization': 'Basic dXNlcjpwYXNz',
    Cookie: 'sid=abc',
    'Set-Cookie': ['a=1', 'b=2'],
    'X-Api-Key': 'k',
    'api-key': 'k',
    'X-Auth-Token': 't',
    'X-Amz-Security-Token': 't',
    'X-Client-Secret': 's',
    'X-Password-Hint': 'p',
    'X-Goog-Api-Key': 'k',
    'X-Session-Id': 's',
    'X-My-Credentials': 'c',
    'X-APIKEY': 'k',
    Accept: ['text/html', 'application/json'],
    'X-Undefined': undefined,
  });
  assert.deepEqual(out, {
    host: 'api.example.test',
    'content-type': 'application/json',
    authorization: REDACTED,
    'proxy-authorization': REDACTED,
    cookie: REDACTED,
    'set-cookie': REDACTED,
    'x-api-key': REDACTED,
    'api-key': REDACTED,
    'x-auth-token': REDACTED,
    'x-amz-security-token': REDACTED,
    'x-client-secret': REDACTED,
    'x-password-hint': REDACTED,
    'x-goog-api-key': REDACTED,
    'x-session-id': REDACTED,
    'x-my-credentials': REDACTED,
    'x-apikey': REDACTED,
    accept: 'text/html, application/json',
  });
  assert.ok(!JSON.stringify(out).includes('sk-live'));

  const long = redactHeaders({ 'X-Long': 'x'.repeat(5_000), 'X-Emoji': 'a'.repeat(MAX_HEADER_VALUE - 1) + '😀' });
  assert.equal(long['x-long'].length, MAX_HEADER_VALUE);
  assert.equal(long['x-emoji'], 'a'.repeat(MAX_HEADER_VALUE - 1), 'no half surrogate pair');

  const many: Record<string, string> = {};
  for (let i = 0; i < 150; i++) many[`X-H${i}`] = String(i);
  const bounded = redactHeaders(many);
  assert.equal(Object.keys(bounded).length, MAX_HEADERS);
  assert.equal(bounded['x-h0'], '0');
  assert.equal(bounded['x-h150'], undefined);

  // Names differing only in case are one header; a header named __proto__ stays a header.
  const odd = redactHeaders(JSON.parse('{"X-A":"1","x-a":"2","__proto__":"p"}'));
  assert.equal(odd['x-a'], '1, 2');
  assert.ok(Object.hasOwn(odd, '__proto__'));
});
