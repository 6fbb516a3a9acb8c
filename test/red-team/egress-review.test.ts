/**
 * Red team, second pass over the egress gateway's smuggling fixes (egress-smuggling.test.ts has
 * the first): attacks on what the rewrite built, run from a real sandbox against the outside
 * world's servers.
 *
 * Found and pinned here: a proxy-style request whose Host header was not host[:port]
 * (`Host: denied.test:`, which node's parser takes and nginx reads as denied.test) was never
 * compared with its URL, and went upstream with that Host (fronting past the URL's allowed host,
 * in plain HTTP and inside inspected TLS); and on other ports a request line with a byte past
 * ASCII (`GET /\x80 HTTP/1.1`) or a blank other than a space after its method (`GET\v/`, which
 * Python splits on) was taken for "not HTTP" and piped to the server unparsed and unrecorded; a
 * ClientHello over 16 KiB (which the gateway does not read, and OpenSSL servers take) was piped
 * too, so HTTPS under `audit.http_calls` went uninspected (with any Host); an upstream's 101 to
 * a request that asked no upgrade left the request hanging; and a connection that never finished
 * its headers (silent, or a byte every 9 s) held its slot for ever; requests pipelined on one
 * connection each opened a connection upstream, past the sandbox's cap of 1024 (as many as it
 * sent); and a declined WebSocket answer over 1 MiB closed the connection without its 502.
 *
 * Held, and pinned: HTTP/2 (prior knowledge on port 80; inside inspected TLS the gateway offers
 * only http/1.1); a URL with userinfo (`http://api.allowed.test@denied.test/`) is checked by its
 * host; a CONNECT to a URL is a 400.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { backend } from '../helpers/backend.ts';
import { noneAtDenied, now, show, startEgressLab, type EgressLab } from '../helpers/egress-lab.ts';

const runtime = backend('SVC_TEST_BWRAP', 'red team: a review of the egress gateway');

/**
 * The allowed host's own servers (in the world's namespace): on HTTP_PORT one that takes anything
 * for a request (as the most lenient server would), prints its first line and Host, answers 200;
 * on WS_PORT one that answers 101 to every request, asked to upgrade or not, then echoes.
 */
const WORLD_SERVERS = `def head_of(c):
    data = b''
    while b'\\r\\n\\r\\n' not in data:
        d = c.recv(4096)
        if not d: return None, b''
        data += d
    return data.split(b'\\r\\n\\r\\n', 1)
def web(c):
    while True:
        head, rest = head_of(c)
        if head is None: break
        lines = head.decode('latin1').split('\\r\\n')
        host = [l.split(':', 1)[1].strip() for l in lines if l.lower().startswith('host:')]
        print('REQUEST', repr(lines[0]), '|', host[0] if host else '', flush=True)
        c.sendall(b'HTTP/1.1 200 OK\\r\\nContent-Length: 3\\r\\n\\r\\nok\\n')
    c.close()
def always101(c):
    head, rest = head_of(c)
    if head is None: return c.close()
    print('REQUEST', repr(head.decode('latin1').split('\\r\\n')[0]), '| 101', flush=True)
    c.sendall(b'HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: websocket\\r\\nConnection: Upgrade\\r\\n\\r\\n' + rest)
    while True:
        d = c.recv(4096)
        if not d: break
        print('RAW', repr(d), flush=True)
        c.sendall(d)
    c.close()
def silent(c):
    print('ACCEPT', flush=True)
    while c.recv(65536): pass
    c.close()
`;

const HTTP_PORT = 9001;
const WS_PORT = 9000;
const SILENT_PORT = 9003;
/** A CONNECT through the allowed host (the world's web servers relay it) to a denied one, and a request inside. */
const SMUGGLED = 'CONNECT denied.test:80 HTTP/1.1\r\nHost: denied.test:80\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: denied.test\r\nConnection: close\r\n\r\n';
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

if (runtime) {
  describe('red team: a review of the egress gateway (each request parsed, checked and recorded)', () => {
    let lab: EgressLab;
    /** What the allowed host's extra servers printed, a line per request (and raw bytes after a 101). */
    const printed: string[] = [];
    /** Connections the silent server on SILENT_PORT accepted so far. */
    let accepted = 0;

    before(async () => {
      // raw() over TLS offers h2 first and prints the ALPN chosen
      // The pipelining case ends up to 1024 requests upstream at once, each an http_call: under
      // the default of 1000 records a second, a later case's record could be dropped with them.
      lab = await startEgressLab({
        tenant: 'reviewer',
        offerH2: true,
        env: { SVC_AUDIT_RECORDS_PER_SECOND: '100000' },
        specExtra: `network:
  egress:
    default: deny
    allow: [api.allowed.test]
audit:
  http_calls: true
`,
      });
      await lab.worldServers(
        'api.allowed.test',
        WORLD_SERVERS,
        [
          [HTTP_PORT, 'web'],
          [WS_PORT, 'always101'],
          [SILENT_PORT, 'silent'],
        ],
        (line) => {
          if (line.startsWith('REQUEST') || line.startsWith('RAW')) printed.push(line);
          if (line === 'ACCEPT') accepted++;
        },
      );
    });

    after(async () => {
      await lab?.close();
    });

    for (const [scheme, port, mode] of [
      ['http', 80, 'plain'],
      ['https', 443, 'tls'],
    ] as const) {
      test(`${scheme}: a proxy-style request whose Host is not host[:port] is refused, not sent on with that Host`, async () => {
        const mark = (await lab.world.requests()).length;
        const since = now();
        const out = await lab.raw(
          'api.allowed.test',
          port,
          mode,
          'api.allowed.test',
          `GET ${scheme}://api.allowed.test/fronted HTTP/1.1\r\nHost: denied.test:\r\nConnection: close\r\n\r\n`,
        );
        assert.match(out, /HTTP\/1\.1 403 [\s\S]*Host header "denied\.test:" is not host\[:port\]/, out);
        const arrived = await lab.arrivedSince(mark);
        noneAtDenied(arrived);
        assert.deepEqual(show(arrived), []);
        const denials = await lab.records('network_denied', since, (items) => items.length >= 1);
        assert.deepEqual(
          denials.map((d) => [d.protocol, d.host, d.port]),
          [[scheme, 'denied.test:', port]],
        );
      });
    }

    test('on another port, a request line a lenient server takes (a byte past ASCII, a blank other than a space) goes to the parser, not piped unseen', async () => {
      const attempts: Record<string, string> = {
        'obs-text': 'GET /\x80 HTTP/1.1\r\nHost: denied.test\r\nConnection: close\r\n\r\n',
        'vertical-tab': 'GET\x0b/vt HTTP/1.1\r\nHost: denied.test\r\nConnection: close\r\n\r\n',
        'no-break-space': 'GET\xa0/nbsp HTTP/1.1\r\nHost: denied.test\r\nConnection: close\r\n\r\n',
        'then-a-connect': `GET /\xff HTTP/1.1\r\nHost: api.allowed.test\r\n\r\n${SMUGGLED}`,
      };
      for (const [name, payload] of Object.entries(attempts)) {
        const before = printed.length;
        const since = now();
        const out = await lab.raw('api.allowed.test', HTTP_PORT, 'plain', '', payload);
        assert.match(out, /^HTTP\/1\.1 400 [\s\S]*not well-formed HTTP\/1\.1/, `${name}: ${JSON.stringify(out)}`);
        await sleep(200);
        assert.deepEqual(printed.slice(before), [], `${name}: nothing arrived`);
        const denials = await lab.records('network_denied', since, (items) => items.length >= 1);
        assert.deepEqual(
          denials.map((d) => [d.protocol, d.port]),
          [['http', HTTP_PORT]],
          name,
        );
      }
    });

    test('a ClientHello too big for the gateway to read (over 16 KiB) is refused under inspection, not piped to the server unseen', async () => {
      const mark = (await lab.world.requests()).length;
      const since = now();
      // 70 ALPN names of 250 bytes: a 17.6 KB hello, spread over two records; OpenSSL servers take hellos up to 128 KiB.
      const out = (
        await lab.sh(`python3 - <<'PY'
import socket, ssl
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
ctx.set_alpn_protocols(['p%03d' % i + 'x' * 246 for i in range(70)] + ['http/1.1'])
try:
    s = ctx.wrap_socket(socket.create_connection(('api.allowed.test', 443), timeout=5), server_hostname='denied.test')
    s.sendall(b'GET /big-hello HTTP/1.1\\r\\nHost: denied.test\\r\\nConnection: close\\r\\n\\r\\n')
    print(s.recv(65536).decode('latin1'))
except Exception as e:
    print('[' + type(e).__name__ + ']')
PY`)
      ).stdout;
      assert.match(out, /^\[(SSLError|ConnectionResetError|SSLEOFError)\]/, out);
      const arrived = await lab.arrivedSince(mark);
      noneAtDenied(arrived);
      assert.deepEqual(show(arrived), []);
      await lab.records('network_denied', since, (items) => items.some((d) => d.port === 443));
    });

    test('a connection that sends nothing, or a header byte every 9 s, holds no slot past the headers timeout', async () => {
      const out = (
        await lab.sh(
          `python3 - <<'PY'
import socket, threading, time
def hold(name, drip):
    s = socket.create_connection(('api.allowed.test', 80), timeout=90); start = time.time()
    if drip:
        s.sendall(b'GET /slow HTTP/1.1\\r\\nHost: api.allowed.test\\r\\n')
        s.settimeout(9)
        while time.time() - start < 85:
            try:
                if not s.recv(4096): break
            except socket.timeout:
                s.sendall(b'X')
            except Exception:
                break
    else:
        try: s.recv(4096)
        except Exception: pass
    print(name, int(time.time() - start), flush=True)
threads = [threading.Thread(target=hold, args=(n, d)) for n, d in (('silent', False), ('drip', True))]
[t.start() for t in threads]; [t.join() for t in threads]
PY`,
          120,
        )
      ).stdout;
      const held = Object.fromEntries(
        out
          .trim()
          .split('\n')
          .map((line) => line.split(' '))
          .map(([name, seconds]) => [name, Number(seconds)]),
      );
      assert.ok(held.silent! >= 55 && held.silent! <= 75, out);
      assert.ok(held.drip! >= 55 && held.drip! <= 75, out);
    });

    test('requests pipelined on one connection open no more connections upstream than the sandbox may hold', async () => {
      const before = accepted;
      const since = now();
      const out = (
        await lab.sh(`python3 - <<'PY'
import socket, time
s = socket.create_connection(('api.allowed.test', ${SILENT_PORT}), timeout=10)
s.sendall(b'GET /pipelined HTTP/1.1\\r\\nHost: api.allowed.test:${SILENT_PORT}\\r\\n\\r\\n' * 1500)
time.sleep(6)
print('sent')
PY`)
      ).stdout;
      assert.match(out, /sent/, out);
      const opened = accepted - before;
      assert.ok(opened <= 1024, `${opened} connections were opened upstream for one sandbox`);
      const denials = await lab.records('network_denied', since, (items) => items.length >= 1);
      assert.match(denials[0].reason, /1024/);
      // Its slots come back: the answers queued behind the first (which its upstream never gives) go once it times out, with the connection and its requests upstream.
      const after = await lab.sh(
        'for i in $(seq 45); do c=$(curl -s -m 3 -o /dev/null -w %{http_code} http://api.allowed.test/after); [ "$c" = 200 ] && echo back && exit; sleep 1; done; echo "still $c"',
      );
      assert.equal(after.stdout.trim(), 'back', after.stderr);
    });

    test('the answer to a WebSocket handshake the upstream declines is read whole up to 1 MiB only: past it, a 502, recorded', async () => {
      const since = now();
      const out = await lab.raw(
        'api.allowed.test',
        80,
        'plain',
        '',
        `GET /big?bytes=${2 * 1024 * 1024} HTTP/1.1\r\nHost: api.allowed.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n`,
      );
      assert.match(out, /^HTTP\/1\.1 502 [\s\S]*over 1048576 bytes/, out.slice(0, 300));
      assert.ok(out.length < 4096, `${out.length} bytes came back`);
      const calls = await lab.records('http_call', since, (items) => items.length >= 1);
      assert.deepEqual(
        calls.map((c) => [c.path, c.status, c.upgrade]),
        [[`/big?bytes=${2 * 1024 * 1024}`, 200, 'websocket']],
      );
      assert.match(calls[0].error, /over 1048576 bytes/);
    });

    test('HTTP/2: prior knowledge on port 80 is a 400; inside inspected TLS only http/1.1 is offered', async () => {
      const mark = (await lab.world.requests()).length;
      const since = now();
      const h2c = await lab.raw('api.allowed.test', 80, 'plain', '', 'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n');
      assert.match(h2c, /^HTTP\/1\.1 400 /, h2c);
      await lab.records('network_denied', since, (items) => items.length >= 1);
      const tls = await lab.raw('api.allowed.test', 443, 'tls', 'api.allowed.test', 'PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n');
      assert.match(tls, /^\[alpn http\/1\.1\]HTTP\/1\.1 400 /, tls);
      assert.deepEqual(show(await lab.arrivedSince(mark)), []);
    });

    test('a URL with userinfo is checked by its host; a CONNECT to a URL is a 400', async () => {
      const mark = (await lab.world.requests()).length;
      const since = now();
      const out = await lab.raw('api.allowed.test', 80, 'plain', '', 'GET http://api.allowed.test@denied.test/userinfo HTTP/1.1\r\nConnection: close\r\n\r\n');
      assert.match(out, /^HTTP\/1\.1 403 [\s\S]*denied\.test:80 is denied/, out);
      const connect = await lab.raw('api.allowed.test', 80, 'plain', '', 'CONNECT http://denied.test/ HTTP/1.1\r\nHost: denied.test\r\n\r\n');
      assert.match(connect, /^HTTP\/1\.1 400 /, connect);
      const arrived = await lab.arrivedSince(mark);
      noneAtDenied(arrived);
      assert.deepEqual(show(arrived), []);
      const denials = await lab.records('network_denied', since, (items) => items.length >= 2);
      assert.deepEqual(denials.map((d) => d.host).sort(), ['denied.test', 'http://denied.test/']);
    });

    test('a 101 to a request that did not ask to upgrade joins nothing: what follows is parsed and checked', async () => {
      const before = printed.length;
      const since = now();
      const out = await lab.raw(
        'api.allowed.test',
        WS_PORT,
        'plain',
        '',
        `GET /not-an-upgrade HTTP/1.1\r\nHost: api.allowed.test:${WS_PORT}\r\nUpgrade: websocket\r\n\r\n`,
        'GET /smuggled HTTP/1.1\r\nHost: denied.test\r\nConnection: close\r\n\r\n',
      );
      assert.doesNotMatch(out, /HTTP\/1\.1 101/, out);
      assert.deepEqual(
        [...out.matchAll(/HTTP\/1\.1 (\d{3}) /g)].map((m) => m[1]),
        ['502', '403'],
        out,
      );
      await sleep(200);
      assert.deepEqual(printed.slice(before), [`REQUEST 'GET /not-an-upgrade HTTP/1.1' | 101`]);
      const denials = await lab.records('network_denied', since, (items) => items.length >= 1);
      assert.deepEqual(
        denials.map((d) => [d.protocol, d.host, d.path]),
        [['http', 'denied.test', '/smuggled']],
      );
    });
  });
}
