/**
 * The http_mock backing service: route patterns, templates, bodies, HEAD, the 404 that explains
 * itself, the journal and its cap, request counts, record mode against a real local "real host"
 * (and replaying what it recorded), forward failures, drift routes. Every mock is served by a
 * real node http server and called by real clients.
 */
import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import zlib from 'node:zlib';
import { after, test } from 'node:test';
import { HttpMock, type Forward, type MockRoute } from '../../services/sandbox-runner/backing/http-mock.ts';
import { matchRoute, routePatternProblem } from '../../services/sandbox-runner/backing/http-mock-routes.ts';

const servers: http.Server[] = [];
after(() => {
  for (const server of servers) server.close();
});

async function listen(handler: http.RequestListener): Promise<number> {
  const server = http.createServer(handler);
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return (server.address() as AddressInfo).port;
}

/** A mock served the way the gateway does it, and the URL it answers at. */
async function serve(mock: HttpMock): Promise<string> {
  const port = await listen((req, res) => void mock.handle(req, res, req.headers.host ?? ''));
  return `http://127.0.0.1:${port}`;
}

interface Reply {
  status: number;
  headers: http.IncomingHttpHeaders;
  body: Buffer;
}

/** A plain http.request (fetch cannot set Host nor read a HEAD's content-length faithfully). */
function call(base: string, options: { method?: string; path: string; headers?: Record<string, string>; body?: string | Buffer }): Promise<Reply> {
  const url = new URL(base);
  return new Promise((resolve, reject) => {
    const req = http.request(
      { host: url.hostname, port: url.port, method: options.method ?? 'GET', path: options.path, headers: options.headers, agent: false },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (chunk: Buffer) => chunks.push(chunk));
        res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(chunks) }));
      },
    );
    req.on('error', reject);
    req.end(options.body);
  });
}

const json = (reply: Reply): unknown => JSON.parse(reply.body.toString());
const route = (method: MockRoute['method'], path: string, body: unknown, status = 200, headers: Record<string, string> = {}): MockRoute => ({
  method,
  path,
  response: { status, headers, body },
});

test('route patterns: literals, :params, *, **, trailing slash, query ignored', () => {
  const table: Array<[string, string, Record<string, string> | null]> = [
    ['/users', '/users', {}],
    ['/users', '/users/', {}],
    ['/users/', '/users', {}],
    ['/users', '/users?page=2', {}],
    ['/users', '/Users', null],
    ['/users', '/users/1', null],
    ['/', '/', {}],
    ['/', '/x', null],
    ['/users/:id', '/users/42', { id: '42' }],
    ['/users/:id', '/users/42/', { id: '42' }],
    ['/users/:id', '/users', null],
    ['/users/:id', '/users//', null],
    ['/users/:id/posts/:post_id', '/users/7/posts/a%20b', { id: '7', post_id: 'a b' }],
    ['/users/*/posts', '/users/7/posts', {}],
    ['/users/*/posts', '/users/7/8/posts', null],
    ['/files/**', '/files', {}],
    ['/files/**', '/files/a/b/c.txt', {}],
    ['/files/**', '/filesx', null],
    ['/:tenant/**', '/acme/x/y', { tenant: 'acme' }],
    ['/**', '/', {}],
    ['/my%20file', '/my file', {}],
    ['/v1:batch', '/v1:batch', {}],
    ['/a%zz', '/a%zz', {}],
  ];
  for (const [pattern, path, expected] of table) assert.deepEqual(matchRoute(pattern, path), expected, `${pattern} against ${path}`);
});

test('invalid patterns are named, and refused when a mock is built', () => {
  assert.equal(routePatternProblem('/a/:id/**'), null);
  assert.match(routePatternProblem('users')!, /does not start with \//);
  assert.match(routePatternProblem('/a/**/b')!, /\*\* before its last segment/);
  assert.match(routePatternProblem('/a/:/b')!, /not a parameter name/);
  assert.match(routePatternProblem('/a/:x/:x')!, /twice/);
  assert.match(routePatternProblem('/a?b=1')!, /query string/);
  assert.throws(() => new HttpMock({ name: 'pay', routes: [route('GET', '/a/**/b', {})], record: false }), /mock pay: route path "\/a\/\*\*\/b"/);
  assert.throws(() => new HttpMock({ name: 'pay', routes: [], record: true }), /no forward function/);
  assert.throws(() => new HttpMock({ name: 'pay', routes: [], record: false, maxJournal: 0 }), /maxJournal/);
});

test('templates take path parameters in string bodies, JSON string values and headers', async () => {
  const base = await serve(
    new HttpMock({
      name: 'users',
      record: false,
      routes: [
        route(
          'GET',
          '/users/:id',
          { id: '{{ path.id }}', label: 'user {{path.id}}!', nested: [{ again: '{{ path.id }}' }], count: 3, unknown: '{{ path.nope }}' },
          200,
          { 'X-User': '{{ path.id }}' },
        ),
        route('GET', '/greet/:name', 'hello {{ path.name }}'),
      ],
    }),
  );
  const user = await call(base, { path: '/users/42' });
  assert.deepEqual(json(user), { id: '42', label: 'user 42!', nested: [{ again: '42' }], count: 3, unknown: '{{ path.nope }}' });
  assert.equal(user.headers['x-user'], '42');
  assert.equal((await call(base, { path: '/greet/Ada%20L' })).body.toString(), 'hello Ada L');
  // A decoded parameter cannot smuggle a header line: it is percent-encoded in headers.
  const sneaky = await call(base, { path: '/users/a%0D%0AX-Evil:%201' });
  assert.equal(sneaky.status, 200);
  assert.equal(sneaky.headers['x-user'], 'a%0D%0AX-Evil: 1');
  assert.equal(sneaky.headers['x-evil'], undefined);
});

test('bodies: JSON as application/json, strings as text/plain, a route content-type wins, empty and 204 bodies', async () => {
  const base = await serve(
    new HttpMock({
      name: 'bodies',
      record: false,
      routes: [
        route('GET', '/json', { ok: true }),
        route('GET', '/null', null),
        route('GET', '/number', 7),
        route('GET', '/text', 'plain words'),
        route('GET', '/xml', '<a/>', 200, { 'Content-Type': 'application/xml' }),
        route('GET', '/problem', { title: 'nope' }, 422, { 'content-type': 'application/problem+json', 'content-length': '999' }),
        route('GET', '/empty', ''),
        route('DELETE', '/thing', '', 204),
      ],
    }),
  );
  const object = await fetch(`${base}/json`);
  assert.equal(object.headers.get('content-type'), 'application/json');
  assert.deepEqual(await object.json(), { ok: true });
  assert.equal(await (await fetch(`${base}/null`)).text(), 'null');
  assert.equal(await (await fetch(`${base}/number`)).text(), '7');
  const text = await fetch(`${base}/text`);
  assert.equal(text.headers.get('content-type'), 'text/plain; charset=utf-8');
  assert.equal(await text.text(), 'plain words');
  const xml = await fetch(`${base}/xml`);
  assert.equal(xml.headers.get('content-type'), 'application/xml');
  assert.equal(await xml.text(), '<a/>');
  const problem = await fetch(`${base}/problem`);
  assert.equal(problem.status, 422);
  assert.equal(problem.headers.get('content-type'), 'application/problem+json');
  assert.deepEqual(await problem.json(), { title: 'nope' }); // the route's wrong content-length is not used
  const empty = await call(base, { path: '/empty' });
  assert.equal(empty.headers['content-length'], '0');
  assert.equal(empty.headers['content-type'], undefined);
  const deleted = await fetch(`${base}/thing`, { method: 'DELETE' });
  assert.equal(deleted.status, 204);
  assert.equal(await deleted.text(), '');
});

test('HEAD: a HEAD route first, else the GET route, headers without a body', async () => {
  const base = await serve(
    new HttpMock({
      name: 'head',
      record: false,
      routes: [route('GET', '/doc', { big: 'x'.repeat(100) }), route('GET', '/both', 'get'), route('HEAD', '/both', '', 299)],
    }),
  );
  const get = await call(base, { path: '/doc' });
  const head = await call(base, { method: 'HEAD', path: '/doc' });
  assert.equal(head.status, 200);
  assert.equal(head.body.length, 0);
  assert.equal(head.headers['content-length'], String(get.body.length));
  assert.equal(head.headers['content-type'], 'application/json');
  assert.equal((await call(base, { method: 'HEAD', path: '/both' })).status, 299);
  const missing = await call(base, { method: 'HEAD', path: '/none' });
  assert.equal(missing.status, 404);
  assert.equal(missing.body.length, 0);
});

test('an unmatched request without record gets a 404 that says what the mock answers', async () => {
  const base = await serve(new HttpMock({ name: 'payments', record: false, routes: [route('GET', '/charges/:id', {}), route('POST', '/charges', {}, 201)] }));
  const reply = await call(base, { method: 'PUT', path: '/charges/1?x=1' });
  assert.equal(reply.status, 404);
  assert.equal(reply.headers['content-type'], 'application/json');
  assert.deepEqual(json(reply), { error: 'no_route', message: 'mock payments has no route for PUT /charges/1', routes: ['GET /charges/:id', 'POST /charges'] });
});

test('the journal: every request, headers redacted, body size, query, route index, status', async () => {
  const mock = new HttpMock({ name: 'j', record: false, routes: [route('GET', '/a', 'a'), route('POST', '/items', { created: true }, 201)] });
  const base = await serve(mock);
  const before = Date.now();
  await call(base, { path: '/a?x=1&y=2', headers: { Authorization: 'Bearer sk-live-123', Cookie: 'session=abc', 'X-Trace': 't1' } });
  await call(base, { method: 'POST', path: '/items', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ name: 'été' }) });
  await call(base, { method: 'DELETE', path: '/nowhere' });
  const { entries, dropped, uncounted } = mock.journal();
  assert.equal(dropped, 0);
  assert.equal(uncounted, 0);
  assert.equal(entries.length, 3);
  const [first, second, third] = entries;
  assert.deepEqual(
    { ...first, ts: undefined, headers: undefined },
    { ts: undefined, headers: undefined, method: 'GET', path: '/a', query: 'x=1&y=2', body_bytes: 0, status: 200, route: 0, recorded: false },
  );
  assert.equal(first!.headers.authorization, '[REDACTED]');
  assert.equal(first!.headers.cookie, '[REDACTED]');
  assert.equal(first!.headers['x-trace'], 't1');
  assert.ok(Date.parse(first!.ts) >= before - 1000 && Date.parse(first!.ts) <= Date.now());
  assert.equal(second!.body_bytes, Buffer.byteLength(JSON.stringify({ name: 'été' })));
  assert.equal(second!.status, 201);
  assert.equal(second!.route, 1);
  assert.equal(second!.query, '');
  assert.equal(third!.status, 404);
  assert.equal(third!.route, null);
  assert.ok(!JSON.stringify(entries).includes('sk-live-123'));
});

test('the journal keeps the newest maxJournal entries and counts the dropped; requestCount still counts them all', async () => {
  const mock = new HttpMock({ name: 'cap', record: false, routes: [route('GET', '/n/:i', 'ok')], maxJournal: 3 });
  const base = await serve(mock);
  for (let i = 0; i < 5; i++) await call(base, { path: `/n/${i}` });
  const { entries, dropped } = mock.journal();
  assert.equal(dropped, 2);
  assert.deepEqual(
    entries.map((e) => e.path),
    ['/n/2', '/n/3', '/n/4'],
  );
  assert.equal(mock.requestCount('GET', '/n/:i'), 5);
  assert.equal(mock.requestCount('GET', '/n/0'), 1);
});

test('requestCount: patterns, methods in any case, * for any method', async () => {
  const mock = new HttpMock({ name: 'count', record: false, routes: [route('POST', '/charges', {}, 201), route('GET', '/charges/:id', {})] });
  const base = await serve(mock);
  for (let i = 0; i < 3; i++) await call(base, { method: 'POST', path: `/charges?attempt=${i}`, body: '{}' });
  await call(base, { path: '/charges/ch_1' });
  await call(base, { path: '/charges/ch_2/' });
  await call(base, { method: 'PATCH', path: '/charges/ch_1' }); // unmatched, still counted
  assert.equal(mock.requestCount('POST', '/charges'), 3);
  assert.equal(mock.requestCount('post', '/charges/'), 3);
  assert.equal(mock.requestCount('GET', '/charges/:id'), 2);
  assert.equal(mock.requestCount('GET', '/charges/ch_1'), 1);
  assert.equal(mock.requestCount('*', '/charges/:id'), 3);
  assert.equal(mock.requestCount('*', '/**'), 6);
  assert.equal(mock.requestCount('DELETE', '/charges'), 0);
  assert.throws(() => mock.requestCount('GET', '/a/**/b'), /\*\* before its last segment/);
});

test('a request body over the limit gets 413 and is journaled', async () => {
  const mock = new HttpMock({ name: 'small', record: false, routes: [route('POST', '/upload', 'ok')], maxRequestBytes: 1000 });
  const base = await serve(mock);
  const reply = await call(base, { method: 'POST', path: '/upload', body: Buffer.alloc(5000, 1) });
  assert.equal(reply.status, 413);
  assert.match((json(reply) as { message: string }).message, /mock small takes request bodies up to 1000 bytes/);
  assert.equal((await call(base, { method: 'POST', path: '/upload', body: Buffer.alloc(1000, 1) })).status, 200);
  const [big, fits] = mock.journal().entries;
  assert.equal(big!.status, 413);
  assert.ok(big!.body_bytes > 1000);
  assert.equal(fits!.body_bytes, 1000);
});

/** The "real host": a local server answering a few kinds of bodies, and what it was asked. */
async function realHost(): Promise<{ port: number; seen: Array<{ method: string; url: string; headers: http.IncomingHttpHeaders; body: string }> }> {
  const seen: Array<{ method: string; url: string; headers: http.IncomingHttpHeaders; body: string }> = [];
  let version = 0;
  const port = await listen((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      seen.push({ method: req.method!, url: req.url!, headers: req.headers, body: Buffer.concat(chunks).toString() });
      const path = req.url!.split('?')[0];
      if (path === '/v1/customers/cus_1')
        res
          .writeHead(200, { 'content-type': 'application/json', 'set-cookie': 'sid=real-session', 'x-request-id': 'req_1' })
          .end(JSON.stringify({ id: 'cus_1', version: ++version }));
      else if (path === '/v1/customers' && req.method === 'POST')
        res.writeHead(201, { 'content-type': 'application/json' }).end(JSON.stringify({ created: Buffer.concat(chunks).toString() }));
      else if (path === '/readme') res.writeHead(200, { 'content-type': 'text/markdown' }).end('# Hello\nworld');
      else if (path === '/logo.png') res.writeHead(200, { 'content-type': 'image/png' }).end(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x00, 0xff, 0x10]));
      else if (path === '/zipped')
        res.writeHead(200, { 'content-type': 'application/json', 'content-encoding': 'gzip' }).end(zlib.gzipSync(JSON.stringify({ zipped: true })));
      else if (path === '/big') res.writeHead(200, { 'content-type': 'text/plain' }).end('b'.repeat(3000));
      else if (path === '/quoted') res.writeHead(200, { 'content-type': 'application/json' }).end('"just a string"');
      else res.writeHead(404, { 'content-type': 'text/plain' }).end('real 404');
    });
  });
  return { port, seen };
}

/** The caller's forward: real.test is the local real host; blocked.test is refused by "policy". */
function forwardTo(port: number, asked: string[]): Forward {
  return async ({ method, host, path, headers, body }) => {
    asked.push(host);
    if (host === 'blocked.test')
      return { status: 403, headers: { 'content-type': 'text/plain' }, body: Buffer.from('egress policy: blocked.test is not allowed'), refused: true };
    if (host !== 'real.test') throw new Error(`${host} does not resolve`);
    const reply = await call(`http://127.0.0.1:${port}`, { method, path, headers, body });
    const flat = Object.fromEntries(Object.entries(reply.headers).map(([name, value]) => [name, Array.isArray(value) ? value.join(', ') : String(value)]));
    return { status: reply.status, headers: flat, body: reply.body };
  };
}

test('record mode: unmatched requests go to the real host, are answered and recorded; a recording replays', async () => {
  const real = await realHost();
  const asked: string[] = [];
  const mock = new HttpMock({
    name: 'stripe',
    record: true,
    routes: [route('GET', '/health', 'mocked')],
    forward: forwardTo(real.port, asked),
    maxBodyBytes: 2000,
  });
  const base = await serve(mock);
  const host = { host: 'real.test' };
  assert.equal((await call(base, { path: '/health', headers: host })).body.toString(), 'mocked');
  const first = await call(base, { path: '/v1/customers/cus_1?expand=x', headers: { ...host, authorization: 'Bearer sk_test_9' } });
  assert.deepEqual(json(first), { id: 'cus_1', version: 1 });
  assert.equal(first.headers['x-request-id'], 'req_1');
  assert.equal(first.headers['set-cookie']?.[0], 'sid=real-session'); // the sandbox gets the real answer
  // The real host got the credential and the query; the journal did not keep the credential.
  assert.equal(real.seen[0]!.url, '/v1/customers/cus_1?expand=x');
  assert.equal(real.seen[0]!.headers.authorization, 'Bearer sk_test_9');
  assert.equal(real.seen[0]!.headers.host, 'real.test');
  await call(base, { path: '/v1/customers/cus_1', headers: host }); // latest answer wins: version 2
  const created = await call(base, { method: 'POST', path: '/v1/customers', headers: { ...host, 'content-type': 'text/plain' }, body: 'Ada' });
  assert.equal(created.status, 201);
  assert.equal(real.seen.at(-1)!.body, 'Ada');
  for (const path of ['/readme', '/logo.png', '/zipped', '/big', '/quoted', '/missing']) await call(base, { path, headers: host });
  assert.equal(
    asked.every((h) => h === 'real.test'),
    true,
  );
  assert.equal(mock.journal().entries.filter((e) => e.recorded).length, 9);
  assert.equal(mock.journal().entries[0]!.recorded, false);

  const recorded = mock.recording();
  const byPath = Object.fromEntries(recorded.map((r) => [`${r.method} ${r.path}`, r]));
  assert.deepEqual(Object.keys(byPath), [
    'GET /v1/customers/cus_1',
    'POST /v1/customers',
    'GET /readme',
    'GET /logo.png',
    'GET /zipped',
    'GET /big',
    'GET /quoted',
    'GET /missing',
  ]);
  const customer = byPath['GET /v1/customers/cus_1']!.response;
  assert.deepEqual(customer.body, { id: 'cus_1', version: 2 });
  assert.equal(customer.headers['set-cookie'], undefined); // a real session never lands in a spec
  assert.equal(customer.headers['content-length'], undefined);
  assert.equal(customer.headers['x-request-id'], 'req_1');
  assert.equal(byPath['GET /readme']!.response.body, '# Hello\nworld');
  assert.equal(byPath['GET /logo.png']!.response.headers['x-mock-body-encoding'], 'base64');
  assert.deepEqual(byPath['GET /zipped']!.response.body, { zipped: true });
  assert.equal(byPath['GET /zipped']!.response.headers['content-encoding'], undefined);
  assert.equal(byPath['GET /big']!.response.body, '');
  assert.equal(byPath['GET /big']!.response.headers['x-mock-body-omitted'], '3000 bytes');
  assert.equal(byPath['GET /quoted']!.response.body, '"just a string"');
  assert.equal(byPath['GET /missing']!.response.status, 404);

  // Replayed by a mock of its own, with no real host at all.
  const replay = await serve(new HttpMock({ name: 'stripe', record: false, routes: recorded }));
  for (const path of ['/v1/customers/cus_1', '/readme', '/logo.png', '/zipped', '/quoted', '/missing']) {
    const original = await call(`http://127.0.0.1:${real.port}`, { path });
    const again = await call(replay, { path });
    assert.equal(again.status, original.status, path);
    assert.equal(again.headers['content-type'], original.headers['content-type'], path);
    const originalBody = original.headers['content-encoding'] === 'gzip' ? zlib.gunzipSync(original.body) : original.body;
    if (path.startsWith('/v1/')) assert.deepEqual(json(again), { id: 'cus_1', version: 2 });
    else assert.deepEqual(again.body, originalBody, path);
    assert.equal(again.headers['x-mock-body-encoding'], undefined);
  }
  const replayedPost = await call(replay, { method: 'POST', path: '/v1/customers', body: 'Other' });
  assert.deepEqual([replayedPost.status, json(replayedPost)], [201, { created: 'Ada' }]);
});

test('record mode: a policy refusal is passed on but not recorded; a forward failure is a 502 naming the mock', async () => {
  const real = await realHost();
  const mock = new HttpMock({ name: 'ext', record: true, routes: [], forward: forwardTo(real.port, []) });
  const base = await serve(mock);
  const refused = await call(base, { path: '/x', headers: { host: 'blocked.test' } });
  assert.equal(refused.status, 403);
  assert.equal(refused.body.toString(), 'egress policy: blocked.test is not allowed');
  const failed = await call(base, { path: '/y?z=1', headers: { host: 'nowhere.test' } });
  assert.equal(failed.status, 502);
  assert.deepEqual(json(failed), { error: 'forward_failed', message: 'mock ext could not get GET /y from nowhere.test: nowhere.test does not resolve' });
  assert.deepEqual(mock.recording(), []);
  assert.deepEqual(
    mock.journal().entries.map((e) => [e.status, e.recorded, e.route]),
    [
      [403, false, null],
      [502, false, null],
    ],
  );
});

test('addRoute: a drift route replaces the same method and pattern in place, or comes last', async () => {
  const mock = new HttpMock({
    name: 'drift',
    record: false,
    routes: [route('GET', '/price/:sku', { price: 10 }), route('GET', '/price/**', { price: 'any' })],
  });
  const base = await serve(mock);
  assert.deepEqual(json(await call(base, { path: '/price/a' })), { price: 10 });
  mock.addRoute(route('GET', '/price/:sku/', { price: 12, sku: '{{ path.sku }}' }));
  mock.addRoute(route('POST', '/price/:sku', 'set', 202));
  assert.deepEqual(json(await call(base, { path: '/price/a' })), { price: 12, sku: 'a' });
  assert.deepEqual(json(await call(base, { path: '/price/a/b' })), { price: 'any' });
  assert.equal((await call(base, { method: 'POST', path: '/price/a' })).status, 202);
  assert.deepEqual(
    mock.journal().entries.map((e) => e.route),
    [0, 0, 1, 2],
  );
  assert.throws(() => mock.addRoute(route('GET', 'nope', {})), /does not start with/);
});

test('probe: the status the routes give, without a journal entry or a count', () => {
  const mock = new HttpMock({ name: 'ready', record: false, routes: [route('GET', '/health', 'ok'), route('GET', '/down', 'no', 503)] });
  assert.equal(mock.probe('GET', '/health'), 200);
  assert.equal(mock.probe('get', '/health/?full=1'), 200);
  assert.equal(mock.probe('HEAD', '/health'), 200);
  assert.equal(mock.probe('GET', '/down'), 503);
  assert.equal(mock.probe('GET', '/elsewhere'), 404);
  assert.deepEqual(mock.journal(), { entries: [], dropped: 0, uncounted: 0 });
  assert.equal(mock.requestCount('*', '/**'), 0);
});
