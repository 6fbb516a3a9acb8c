/**
 * Red team: requests past the egress gateway's policy and audit. An agent smuggled requests to a
 * denied host through an allowed one: after an `Upgrade:` request the gateway joined the two
 * connections raw whatever the upstream answered (the next bytes went out unparsed: a CONNECT
 * through an allowed host that proxies), and the body of a chunked GET went upstream unframed (the
 * upstream read it as a second request), in plain HTTP and inside inspected HTTPS alike, with no
 * record of either. TLS without a server name was passed through unseen under
 * `audit.http_calls`; `CONNECT db:5432` dialled the service's made-up address from the host;
 * `dns_overrides` names were reachable on every port.
 *
 * Pinned here, against the real service, a real sandbox and the outside world's servers (which
 * record every request they get, with the server that got it): each request that leaves is one
 * the gateway parsed, checked and recorded (re-framed: one request out per request in); an
 * upgrade is joined only to a WebSocket the upstream accepted with 101 (declined, the connection
 * goes on as HTTP, parsed), any other upgrade is a 403;
 * what the parser refuses (Content-Length with Transfer-Encoding, two lengths, folded headers) is
 * a 400, recorded; a nameless ClientHello is inspected as the name resolved to its address;
 * `CONNECT db:5432` reaches the database; an override name is reached on 80 and 443 only (here).
 * Nothing reached denied.test, and the audit says what was tried.
 */
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import { backend } from '../helpers/backend.ts';
import { noneAtDenied, now, show, startEgressLab, type EgressLab } from '../helpers/egress-lab.ts';

const runtime = backend('SVC_TEST_BWRAP', 'red team: request smuggling through the egress gateway');

/**
 * Servers of the outside world's allowed host beside its own (run in its namespace): on WS_PORT
 * a WebSocket server that accepts every handshake with 101 and then echoes; on HTTP_PORT an HTTP
 * server that prints each request's first line and Host (the test reads what arrived) and
 * answers 200; on GREETER_PORT a server that speaks first (as SMTP does), then echoes.
 */
const WORLD_SERVERS = `import base64, hashlib
def head_of(c):
    data = b''
    while b'\\r\\n\\r\\n' not in data.lstrip(b'\\r\\n'):
        d = c.recv(4096)
        if not d: return None, b''
        data += d
    return data.lstrip(b'\\r\\n').split(b'\\r\\n\\r\\n', 1)
def echo(c, rest=b''):
    if rest: c.sendall(rest)
    while True:
        d = c.recv(4096)
        if not d: break
        c.sendall(d)
    c.close()
def ws(c):
    head, rest = head_of(c)
    key = [l.split(b':', 1)[1].strip() for l in head.split(b'\\r\\n') if l.lower().startswith(b'sec-websocket-key:')][0]
    accept = base64.b64encode(hashlib.sha1(key + b'258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest())
    c.sendall(b'HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: websocket\\r\\nConnection: Upgrade\\r\\nSec-WebSocket-Accept: ' + accept + b'\\r\\n\\r\\n')
    echo(c, rest)
def web(c):
    while True:
        head, rest = head_of(c)
        if head is None: break
        lines = head.decode('latin1').split('\\r\\n')
        host = [l.split(':', 1)[1].strip() for l in lines if l.lower().startswith('host:')]
        print('REQUEST', lines[0], '|', host[0] if host else '', flush=True)
        c.sendall(b'HTTP/1.1 200 OK\\r\\nContent-Length: 3\\r\\n\\r\\nok\\n')
    c.close()
def greeter(c):
    c.sendall(b'220 greetings\\r\\n')
    echo(c)
`;

const WS_PORT = 9000;
const HTTP_PORT = 9001;
const GREETER_PORT = 9002;
const WS_HANDSHAKE = (host: string, path: string, upgrade = 'websocket') =>
  `GET ${path} HTTP/1.1\r\nHost: ${host}\r\nConnection: Upgrade\r\nUpgrade: ${upgrade}\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n`;
/** What an agent hides behind an allowed request: a CONNECT through the allowed host (the world's servers relay CONNECT), and a request inside it for denied.test. */
const SMUGGLED = 'CONNECT denied.test:80 HTTP/1.1\r\nHost: denied.test:80\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: denied.test\r\nConnection: close\r\n\r\n';

if (runtime) {
  describe('red team: every request through the egress gateway is parsed, checked and recorded on its own', () => {
    let lab: EgressLab;
    /** What the HTTP server on HTTP_PORT printed: `REQUEST <first line> | <host>` per request. */
    const printed: string[] = [];

    before(async () => {
      lab = await startEgressLab({
        tenant: 'smuggler',
        specExtra: `services:
  - {name: db, type: postgres}
  - {name: recorder, type: http_mock, record: true, routes: []}
network:
  egress:
    default: deny
    allow: [api.allowed.test, rec.wild.allowed.test]
  dns_overrides: {api.stripe.test: other.allowed.test, rec.wild.allowed.test: recorder}
audit:
  http_calls: true
`,
      });
      await lab.worldServers(
        'api.allowed.test',
        WORLD_SERVERS,
        [
          [WS_PORT, 'ws'],
          [HTTP_PORT, 'web'],
          [GREETER_PORT, 'greeter'],
        ],
        (line) => {
          if (line.startsWith('REQUEST')) printed.push(line);
        },
      );
    });

    after(async () => {
      await lab?.close();
    });

    for (const scheme of ['http', 'https'] as const) {
      const [port, mode] = scheme === 'http' ? [80, 'plain' as const] : [443, 'tls' as const];

      test(`${scheme}: a chunked GET's body goes upstream as that GET's body, not as a second request`, async () => {
        const mark = (await lab.world.requests()).length;
        const since = now();
        const body = 'GET /smuggled HTTP/1.1\r\nHost: denied.test\r\n\r\n';
        const out = await lab.raw(
          'api.allowed.test',
          port,
          mode,
          'api.allowed.test',
          `GET /carrier HTTP/1.1\r\nHost: api.allowed.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`,
        );
        assert.match(out, /^HTTP\/1\.1 200 /, out);
        const arrived = await lab.arrivedSince(mark);
        noneAtDenied(arrived);
        assert.deepEqual(
          arrived.map((r) => [r.server, r.method, r.host, r.path, r.body_bytes]),
          [['api.allowed.test', 'GET', 'api.allowed.test', '/carrier', body.length]],
        );
        const calls = await lab.records('http_call', since, (items) => items.length >= 1);
        assert.deepEqual(
          calls.map((c) => [c.method, c.scheme, c.host, c.path, c.status, c.request_bytes]),
          [['GET', scheme, 'api.allowed.test', '/carrier', 200, body.length]],
        );
      });

      test(`${scheme}: a chunked GET a recording mock sends on to the real host goes as one request too`, async () => {
        const mark = (await lab.world.requests()).length;
        const body = 'GET /smuggled HTTP/1.1\r\nHost: denied.test\r\n\r\n';
        const out = await lab.raw(
          'rec.wild.allowed.test',
          port,
          mode,
          'rec.wild.allowed.test',
          `GET /recorded-${scheme} HTTP/1.1\r\nHost: rec.wild.allowed.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n${body.length.toString(16)}\r\n${body}\r\n0\r\n\r\n`,
        );
        assert.match(out, /^HTTP\/1\.1 200 /, out);
        const arrived = await lab.arrivedSince(mark);
        noneAtDenied(arrived);
        assert.deepEqual(
          arrived.map((r) => [r.server, r.method, r.host, r.path, r.body_bytes]),
          [['other.allowed.test', 'GET', 'rec.wild.allowed.test', `/recorded-${scheme}`, body.length]],
        );
      });

      test(`${scheme}: a WebSocket handshake the upstream does not accept is answered, and what follows it is parsed and checked, not piped`, async () => {
        const mark = (await lab.world.requests()).length;
        const since = now();
        const out = await lab.raw('api.allowed.test', port, mode, 'api.allowed.test', WS_HANDSHAKE('api.allowed.test', '/ws') + SMUGGLED);
        assert.deepEqual(
          [...out.matchAll(/HTTP\/1\.1 (\d{3}) /g)].map((m) => m[1]),
          ['200', '403'],
          out,
        );
        assert.match(out, /egress to denied\.test:80 is denied/, out);
        const arrived = await lab.arrivedSince(mark);
        noneAtDenied(arrived);
        assert.deepEqual(show(arrived), ['api.allowed.test GET api.allowed.test /ws']);
        const calls = await lab.records('http_call', since, (items) => items.length >= 1);
        assert.deepEqual(
          calls.map((c) => [c.method, c.scheme, c.host, c.path, c.status, c.upgrade]),
          [['GET', scheme, 'api.allowed.test', '/ws', 200, 'websocket']],
        );
        const denials = await lab.records('network_denied', since, (items) => items.length >= 1);
        assert.deepEqual(
          denials.map((d) => [d.protocol, d.host, d.port]),
          [['connect', 'denied.test', 80]],
        );
      });

      test(`${scheme}: an upgrade to anything but a WebSocket is a 403, recorded; nothing leaves`, async () => {
        const mark = (await lab.world.requests()).length;
        const since = now();
        const out = await lab.raw('api.allowed.test', port, mode, 'api.allowed.test', WS_HANDSHAKE('api.allowed.test', '/h2c', 'h2c') + SMUGGLED);
        assert.match(out, /^HTTP\/1\.1 403 [\s\S]*only to a WebSocket/, out);
        noneAtDenied(await lab.arrivedSince(mark));
        assert.deepEqual(show(await lab.arrivedSince(mark)), []);
        const denials = await lab.records('network_denied', since, (items) => items.length >= 1);
        assert.deepEqual(
          denials.map((d) => [d.protocol, d.host, d.port, d.path, d.upgrade]),
          [[scheme, 'api.allowed.test', port, '/h2c', 'h2c']],
        );
        assert.match(denials[0].reason, /only to a WebSocket/);
      });
    }

    test('a WebSocket the upstream accepts (101) is joined: frames both ways, one http_call with status 101', async () => {
      const since = now();
      const out = await lab.raw('api.allowed.test', WS_PORT, 'plain', '', `${WS_HANDSHAKE(`api.allowed.test:${WS_PORT}`, '/chat')}frame-bytes`);
      assert.match(out, /^HTTP\/1\.1 101 [\s\S]*Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK\+xOo=\r\n\r\nframe-bytes/i, out);
      const calls = await lab.records('http_call', since, (items) => items.length >= 1);
      assert.deepEqual(
        calls.map((c) => [c.method, c.host, c.port, c.path, c.status, c.upgrade, c.request_bytes, c.response_bytes]),
        [['GET', 'api.allowed.test', WS_PORT, '/chat', 101, 'websocket', 11, 11]],
      );
    });

    test('requests framed two ways (Content-Length and Transfer-Encoding, two lengths, a folded header) are a 400, recorded; two Host headers a 403; nothing leaves', async () => {
      const attacks: Record<string, string> = {
        'cl-te': `POST /x HTTP/1.1\r\nHost: api.allowed.test\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n${SMUGGLED}`,
        'two-lengths': `POST /x HTTP/1.1\r\nHost: api.allowed.test\r\nContent-Length: 0\r\nContent-Length: ${SMUGGLED.length}\r\n\r\n${SMUGGLED}`,
        'te-not-ending-chunked': `POST /x HTTP/1.1\r\nHost: api.allowed.test\r\nTransfer-Encoding: chunked, identity\r\n\r\n${SMUGGLED}`,
        'obs-fold': `GET /x HTTP/1.1\r\nHost: api.allowed.test\r\nX-Folded: a\r\n Host: denied.test\r\n\r\n`,
      };
      for (const [name, payload] of Object.entries(attacks)) {
        const mark = (await lab.world.requests()).length;
        const since = now();
        const out = await lab.raw('api.allowed.test', 80, 'plain', '', payload);
        assert.match(out, /^HTTP\/1\.1 400 [\s\S]*not well-formed HTTP\/1\.1/, `${name}: ${out}`);
        assert.deepEqual(show(await lab.arrivedSince(mark)), [], name);
        const denials = await lab.records('network_denied', since, (items) => items.length >= 1);
        assert.deepEqual(
          denials.map((d) => [d.protocol, d.port]),
          [['http', 80]],
          name,
        );
      }
      const mark = (await lab.world.requests()).length;
      const since = now();
      const out = await lab.raw(
        'api.allowed.test',
        80,
        'plain',
        '',
        'GET /two HTTP/1.1\r\nHost: api.allowed.test\r\nHost: denied.test\r\nConnection: close\r\n\r\n',
      );
      assert.match(out, /^HTTP\/1\.1 403 [\s\S]*more than one Host header/, out);
      assert.deepEqual(show(await lab.arrivedSince(mark)), []);
      await lab.records('network_denied', since, (items) => items.some((d) => /more than one Host/.test(d.reason)));
    });

    test('pipelined requests on one connection are each checked and recorded', async () => {
      const mark = (await lab.world.requests()).length;
      const since = now();
      const host = (h: string, p: string, close = '') => `GET ${p} HTTP/1.1\r\nHost: ${h}\r\n${close}\r\n`;
      const out = await lab.raw(
        'api.allowed.test',
        80,
        'plain',
        '',
        host('api.allowed.test', '/p1') + host('denied.test', '/p2') + host('api.allowed.test', '/p3', 'Connection: close\r\n'),
      );
      assert.deepEqual(
        [...out.matchAll(/HTTP\/1\.1 (\d{3}) /g)].map((m) => m[1]),
        ['200', '403', '200'],
        out,
      );
      const arrived = await lab.arrivedSince(mark);
      noneAtDenied(arrived);
      assert.deepEqual(show(arrived).sort(), ['api.allowed.test GET api.allowed.test /p1', 'api.allowed.test GET api.allowed.test /p3']);
      const calls = await lab.records('http_call', since, (items) => items.length >= 2);
      assert.deepEqual(calls.map((c) => c.path).sort(), ['/p1', '/p3']);
      const denials = await lab.records('network_denied', since, (items) => items.length >= 1);
      assert.deepEqual(
        denials.map((d) => [d.host, d.path]),
        [['denied.test', '/p2']],
      );
    });

    test('HTTP on another port is read as HTTP however it is sent: a request line split over packets, after a silence, after empty lines; on the TLS port', async () => {
      const request = (path: string) => `GET ${path} HTTP/1.1\r\nHost: denied.test\r\nConnection: close\r\n\r\n`;
      const attempts: Array<[string, number, Array<string | Buffer>]> = [
        ['split', HTTP_PORT, ['GE', request('/split').slice(2)]],
        ['silence', HTTP_PORT, ['', request('/silence')]],
        ['empty-lines', HTTP_PORT, [`\r\n\r\n${request('/empty-lines')}`]],
        ['tls-port', 443, [request('/plain-on-443')]],
      ];
      for (const [name, port, parts] of attempts) {
        const before = printed.length;
        const since = now();
        const out = await lab.raw('api.allowed.test', port, 'plain', '', ...parts);
        assert.match(out, /^HTTP\/1\.1 403 [\s\S]*denied\.test:\d+ is denied/, `${name}: ${out}`);
        const denials = await lab.records('network_denied', since, (items) => items.length >= 1);
        assert.deepEqual(
          denials.map((d) => [d.protocol, d.host, d.port]),
          [['http', 'denied.test', port]],
          name,
        );
        assert.deepEqual(printed.slice(before), [], `${name}: nothing arrived`);
      }
      // An allowed request on that port still arrives, and is recorded.
      const since = now();
      const out = await lab.raw(
        'api.allowed.test',
        HTTP_PORT,
        'plain',
        '',
        'GE',
        `T /fine HTTP/1.1\r\nHost: api.allowed.test:${HTTP_PORT}\r\nConnection: close\r\n\r\n`,
      );
      assert.match(out, /^HTTP\/1\.1 200 /, out);
      assert.equal(printed.at(-1), `REQUEST GET /fine HTTP/1.1 | api.allowed.test:${HTTP_PORT}`);
      const calls = await lab.records('http_call', since, (items) => items.length >= 1);
      assert.deepEqual(
        calls.map((c) => [c.host, c.port, c.path, c.status]),
        [['api.allowed.test', HTTP_PORT, '/fine', 200]],
      );
    });

    test('a server that speaks first is still piped: its greeting reaches a silent sandbox, then bytes both ways', async () => {
      const out = await lab.raw('api.allowed.test', GREETER_PORT, 'plain', '', '', 'ping\n');
      assert.equal(out, '220 greetings\r\nping\n[TimeoutError]');
    });

    test('TLS without a server name is inspected as the name resolved to its address: its Host is checked, its requests recorded', async () => {
      const mark = (await lab.world.requests()).length;
      const since = now();
      const fronted = await lab.raw('api.allowed.test', 443, 'tls', '', 'GET /fronted HTTP/1.1\r\nHost: denied.test\r\nConnection: close\r\n\r\n');
      assert.match(fronted, /^HTTP\/1\.1 403 [\s\S]*the Host denied\.test is not the TLS server name api\.allowed\.test/, fronted);
      const named = await lab.raw('api.allowed.test', 443, 'tls', '', 'GET /nameless HTTP/1.1\r\nHost: api.allowed.test\r\nConnection: close\r\n\r\n');
      assert.match(named, /^HTTP\/1\.1 200 /, named);
      const arrived = await lab.arrivedSince(mark);
      noneAtDenied(arrived);
      assert.deepEqual(show(arrived), ['api.allowed.test GET api.allowed.test /nameless']);
      const denials = await lab.records('network_denied', since, (items) => items.length >= 1);
      assert.deepEqual(
        denials.map((d) => [d.protocol, d.host]),
        [['https', 'denied.test']],
      );
      const calls = await lab.records('http_call', since, (items) => items.length >= 1);
      assert.deepEqual(
        calls.map((c) => [c.scheme, c.host, c.path, c.status]),
        [['https', 'api.allowed.test', '/nameless', 200]],
      );
    });

    test("CONNECT db:5432 reaches the sandbox's database, not its address outside", async () => {
      // PostgreSQL's SSLRequest: the server answers one byte, S or N.
      const sslRequest = Buffer.from([0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]);
      const out = await lab.raw(
        'api.allowed.test',
        80,
        'plain',
        '',
        Buffer.concat([Buffer.from('CONNECT db:5432 HTTP/1.1\r\nHost: db:5432\r\n\r\n'), sslRequest]),
      );
      assert.match(out, /^HTTP\/1\.1 200 Connection Established\r\n\r\n[SN]/, JSON.stringify(out));
    });

    test('a dns_overrides name is reached on 80 and 443, not on ports its replacement is not allowed on', async () => {
      const mark = (await lab.world.requests()).length;
      const since = now();
      const web = await lab.sh('curl -sS -m 10 http://api.stripe.test/charge');
      assert.equal(JSON.parse(web.stdout).server, 'other.allowed.test', web.stderr);
      const other = await lab.raw('api.stripe.test', 8080, 'plain', '', 'GET /other-port HTTP/1.1\r\nHost: api.stripe.test:8080\r\nConnection: close\r\n\r\n');
      assert.doesNotMatch(other, /^HTTP/, other);
      assert.deepEqual(show(await lab.arrivedSince(mark)), ['other.allowed.test GET api.stripe.test /charge']);
      const denials = await lab.records('network_denied', since, (items) => items.length >= 1);
      assert.deepEqual(
        denials.map((d) => [d.host, d.port]),
        [['api.stripe.test', 8080]],
      );
      assert.match(denials[0].reason, /network\.dns_overrides sends api\.stripe\.test to other\.allowed\.test, reached on ports 80 and 443/);
    });
  });
}
