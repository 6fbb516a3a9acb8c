/**
 * Red team: the `svc` CLI against a hostile server (a real node:http server here, speaking as the
 * service would). Pins: (1) what the server sends (names, ids, error messages, trace content,
 * command output) reaches the terminal inert: no cursor move, screen clear, OSC 52 clipboard
 * write, OSC 8 link, title, BEL or C1 CSI survives, each is shown as its `\u001b` escape, on a
 * real terminal (a pty from script(1)) and through pipes; (2) an answer that never ends (fast,
 * or a byte at a time), an event line that never ends, or an answer that declares gigabytes fails
 * the command with a clear line at the client's bounds (packages/sdk: MAX_ANSWER_BYTES, a
 * minimum rate after 10 s, MAX_MESSAGE_CHARS) instead of filling memory or hanging; (3) a
 * redirect is not followed, so neither the key nor a request's body (a secret's value) goes to
 * another host; (4) the shell's socket (`sandboxes shell`): a control frame that is not JSON, a
 * refusal whose body never ends and a frame past 1 MiB each end the command with one line, never
 * a crash, a stack trace or memory without bound; the terminal's own bytes still pass raw.
 */
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { WebSocketServer } from 'ws';
import { REPO } from '../helpers/server.ts';

const SVC = path.join(REPO, 'bin', 'svc.cjs');
/** packages/sdk's MAX_ANSWER_BYTES, the most of one answer the client reads. */
const MAX_ANSWER_BYTES = 256 * 1024 * 1024;
const KEY = 'svc_live_hostile-test-key-0123456789';

/** Every kind of sequence a terminal obeys, in one name. */
const PAYLOAD =
  'evil\x1b]52;c;cm0gLXJmIH4=\x07\x1b]8;;http://evil.test/\x1b\\link\x1b]8;;\x1b\\\x1b[2J\x1b[H\x1b]0;pwned-title\x07\x9b31m\x1b[8mhidden\x07\x7fend';
/** What may remain: colour (SGR) and CRLF; anything else is a control character that got through. */
const OBEYED = /[\x00-\x08\x0b-\x1f\x7f-\x9f]/;
const withoutAllowed = (text: string) =>
  text
    .replace(/\x1b\[[0-9;]*m/g, '')
    .replace(/\r\n/g, '\n')
    .replace(/\t/g, ' ');

interface Ran {
  code: number | null;
  out: string;
  ms: number;
}

function listen(handler: http.RequestListener, host = '127.0.0.1'): Promise<{ server: http.Server; url: string }> {
  const server = http.createServer(handler);
  return new Promise((resolve) => server.listen(0, host, () => resolve({ server, url: `http://${host}:${(server.address() as AddressInfo).port}` })));
}

/** `svc ARGS` against `url`, on a pty (script(1)) or through pipes; stdout and stderr together. */
function svc(url: string, args: string[], options: { tty?: boolean; input?: string; timeoutMs?: number } = {}): Promise<Ran> {
  const env = {
    ...Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('SVC_') && k !== 'NO_COLOR')),
    SVC_BASE_URL: url,
    SVC_API_KEY: KEY,
    XDG_CONFIG_HOME: '/nonexistent',
  };
  const command = [process.execPath, SVC, ...args];
  const [file, argv] = options.tty
    ? ['script', ['-qefc', command.map((a) => `'${a.replace(/'/g, `'\\''`)}'`).join(' '), '/dev/null']]
    : [command[0]!, command.slice(1)];
  const started = Date.now();
  return new Promise((resolve) => {
    const child = execFile(
      file,
      argv as string[],
      { env, timeout: options.timeoutMs ?? 60_000, maxBuffer: 64 * 1024 * 1024, encoding: 'latin1' },
      (err, stdout, stderr) => {
        // latin1 keeps each byte, so a UTF-8 C1 (C2 9B) shows as the byte 0x9b it carries
        const out = Buffer.from(stdout + stderr, 'latin1').toString('utf8');
        resolve({ code: err ? ((err as { code?: number }).code ?? null) : 0, out, ms: Date.now() - started });
      },
    );
    child.stdin!.end(options.input ?? '');
  });
}

describe('red team: the CLI against a hostile server', () => {
  let hostile: { server: http.Server; url: string };
  let elsewhere: { server: http.Server; url: string };
  const seenElsewhere: Array<{ authorization?: string; body: string }> = [];
  let streamed = 0;

  before(async () => {
    elsewhere = await listen((req, res) => {
      let body = '';
      req.on('data', (c) => (body += c));
      req.on('end', () => {
        seenElsewhere.push({ authorization: req.headers.authorization, body });
        res.setHeader('content-type', 'application/json');
        res.end(JSON.stringify({ name: 'x', updated_at: 'now', items: [], count: 0 }));
      });
    }, '127.0.0.2');
    hostile = await listen((req, res) => {
      const url = new URL(req.url!, 'http://x');
      const json = (status: number, value: unknown) => {
        res.writeHead(status, { 'content-type': 'application/json' });
        res.end(JSON.stringify(value));
      };
      if (url.pathname === '/v1/specs') return json(200, { items: [{ id: PAYLOAD, version: 1, created_at: PAYLOAD }], count: 1 });
      if (url.pathname === '/v1/specs/hostile-error') return json(404, { error: `not_found${PAYLOAD}`, message: `no spec ${PAYLOAD}` });
      if (url.pathname === '/v1/sandboxes/sb-1/commands')
        return json(200, { exit_code: 0, stdout: `out ${PAYLOAD}\n`, stderr: `err ${PAYLOAD}\n`, duration_ms: 1 });
      if (url.pathname.startsWith('/v1/traces/')) {
        return json(200, {
          items: [{ span_id: PAYLOAD, parent_span_id: null, tool: PAYLOAD, event_type: 'tool_call', status: PAYLOAD, duration_ms: 1 }],
          count: 1,
        });
      }
      if (url.pathname === '/v1/experiments/endless') {
        // An answer with no end: a JSON string that goes on and on, as fast as the client reads.
        res.writeHead(200, { 'content-type': 'application/json' });
        res.write('{"id":"');
        const chunk = Buffer.alloc(1024 * 1024, 'a');
        const pump = () => {
          while (streamed < 2 * MAX_ANSWER_BYTES && !res.destroyed) {
            streamed += chunk.length;
            if (!res.write(chunk)) return void res.once('drain', pump);
          }
          res.end('"}');
        };
        return pump();
      }
      if (url.pathname === '/v1/experiments/trickle') {
        // An answer that never ends, slowly: a byte every 50 ms, so no pause is ever long.
        res.writeHead(200, { 'content-type': 'application/json' });
        res.write('{"id":"');
        const timer = setInterval(() => res.write('a'), 50);
        return res.on('close', () => clearInterval(timer));
      }
      if (url.pathname === '/v1/sandboxes/sb-endless/events') {
        // An event stream whose one line never ends.
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write('data: ');
        const chunk = Buffer.alloc(1024 * 1024, 'a');
        let sent = 0;
        const pump = () => {
          while (sent < 64 && !res.destroyed) {
            sent++;
            if (!res.write(chunk)) return void res.once('drain', pump);
          }
          res.end();
        };
        return pump();
      }
      if (url.pathname === '/v1/experiments/declared') {
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': String(10 * 1024 ** 3) });
        return res.write('{"id":"');
      }
      if (url.pathname === '/v1/experiments/huge-error') {
        res.writeHead(500, { 'content-type': 'text/plain' });
        return res.end(Buffer.alloc(32 * 1024 * 1024, 'e'));
      }
      // Everything else goes elsewhere, method and body kept (307).
      res.writeHead(307, { location: `${elsewhere.url}${req.url}` });
      res.end();
    });
  });
  /** The shell's WebSocket, as a hostile service speaks it: `/v1/sandboxes/<what>/shell`. */
  const shells = new WebSocketServer({ noServer: true });
  before(() => {
    hostile.server.on('upgrade', (req, socket, head) => {
      const what = /^\/v1\/sandboxes\/([^/]+)\/shell/.exec(req.url ?? '')?.[1];
      if (what === 'sb-refused') {
        // A refusal whose body never ends.
        socket.write('HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\n\r\n{"error":"forbidden","message":"');
        const chunk = Buffer.alloc(1024 * 1024, 'r');
        let sent = 0;
        const pump = () => {
          while (sent++ < 300 && !socket.destroyed) if (!socket.write(chunk)) return void socket.once('drain', pump);
          socket.end();
        };
        socket.on('error', () => {});
        return pump();
      }
      shells.handleUpgrade(req, socket, head, (ws) => {
        if (what === 'sb-garbage') return ws.send('not json');
        ws.send(JSON.stringify({ type: 'ready', sandbox_id: what, session_id: 'term-1', shell: '/bin/sh' }));
        if (what === 'sb-bigframe') return ws.send(Buffer.alloc(5 * 1024 * 1024, 'b'));
        ws.send('garbage{');
        ws.send('null');
        ws.send(Buffer.from('hello from the shell\r\n'));
        ws.send(JSON.stringify({ type: 'error', error: `forbidden${PAYLOAD}`, message: PAYLOAD }));
        ws.send(JSON.stringify({ type: 'exit', exit_code: 3 }));
        ws.close(1000);
      });
    });
  });

  after(() => {
    for (const ws of shells.clients) ws.terminate();
    hostile?.server.closeAllConnections();
    hostile?.server.close();
    elsewhere?.server.close();
  });

  const CASES: Array<[string, string[]]> = [
    ['a name in a table', ['specs', 'list']],
    ['an error message', ['specs', 'show', 'hostile-error']],
    ["a command's output", ['sandboxes', 'exec', 'sb-1', 'true']],
    ['trace content', ['traces', 'show', 'tr-1']],
    ['JSON output', ['specs', 'list', '--json']],
  ];
  for (const tty of [true, false]) {
    for (const [what, args] of CASES) {
      test(`${what} ${tty ? 'on a terminal' : 'through pipes'}: shown, not obeyed`, async () => {
        const ran = await svc(hostile.url, args, { tty });
        assert.match(ran.out, /evil/, `the hostile text is shown: ${JSON.stringify(ran.out)}`);
        assert.doesNotMatch(withoutAllowed(ran.out), OBEYED, `no control character reached the terminal: ${JSON.stringify(ran.out)}`);
        assert.ok(
          ran.out.includes('\\u001b]52;c;cm0gLXJmIH4=\\u0007') && ran.out.includes('\\u009b31m'),
          `the sequences show as escapes: ${JSON.stringify(ran.out)}`,
        );
        if (args.includes('--json')) {
          const json = JSON.parse(ran.out.replace(/\r\n/g, '\n'));
          assert.equal(json[0].id, PAYLOAD, 'the JSON still carries the exact value');
        }
      });
    }
  }

  test('an answer that never ends fails the command at the bound, quickly, with one clear line', async () => {
    const ran = await svc(hostile.url, ['experiments', 'show', 'endless']);
    assert.equal(ran.code, 2, ran.out.slice(0, 2000));
    assert.match(ran.out, new RegExp(`^svc: 200 answer_too_large: the answer to GET /v1/experiments/endless is over ${MAX_ANSWER_BYTES} bytes`, 'm'));
    assert.ok(streamed < MAX_ANSWER_BYTES + 64 * 1024 * 1024, `the client stopped reading soon after the bound (${streamed} bytes sent)`);
    assert.ok(ran.ms < 30_000, `it took ${ran.ms} ms`);
  });

  test('an answer that trickles without end fails the command once it is plainly too slow; so does an endless event', async () => {
    const trickle = await svc(hostile.url, ['experiments', 'show', 'trickle']);
    assert.equal(trickle.code, 2, trickle.out);
    assert.match(trickle.out, /^svc: 200 answer_too_slow: the answer to GET \/v1\/experiments\/trickle came at \d+ bytes a second after 1\d s/m);
    assert.ok(trickle.ms < 20_000, `it took ${trickle.ms} ms`);
    const events = await svc(hostile.url, ['sandboxes', 'events', 'sb-endless']);
    assert.equal(events.code, 2, events.out);
    assert.match(events.out, /^svc: 200 answer_too_large: a message of the event stream is over 16777216 characters/m);
  });

  test('an answer that declares 10 GiB is refused before it is read; an error answer of 32 MiB is not printed', async () => {
    const declared = await svc(hostile.url, ['experiments', 'show', 'declared'], { timeoutMs: 20_000 });
    assert.equal(declared.code, 2, declared.out);
    assert.match(declared.out, /^svc: 200 answer_too_large: /m);
    const huge = await svc(hostile.url, ['experiments', 'show', 'huge-error']);
    assert.equal(huge.code, 2);
    assert.match(huge.out, /^svc: 500 answer_too_large: /m);
    assert.ok(huge.out.length < 4096, `the error line is short (${huge.out.length} characters)`);
  });

  test("the shell's socket: bad control frames, a refusal without end, a frame too large: one line each, no crash", async () => {
    const garbage = await svc(hostile.url, ['sandboxes', 'shell', 'sb-garbage']);
    assert.equal(garbage.code, 2, garbage.out);
    assert.equal(garbage.out, 'svc: the shell did not start: not json\n');
    const after = await svc(hostile.url, ['sandboxes', 'shell', 'sb-after']);
    assert.equal(after.code, 3, after.out);
    assert.match(after.out, /hello from the shell/);
    assert.match(after.out, /^svc: forbiddenevil\\u001b\]52;c;/m);
    assert.doesNotMatch(withoutAllowed(after.out), OBEYED, JSON.stringify(after.out));
    const refused = await svc(hostile.url, ['sandboxes', 'shell', 'sb-refused']);
    assert.equal(refused.code, 2, refused.out.slice(0, 300));
    assert.match(refused.out, /^svc: 403 http_error: \{"error":"forbidden","message":"r+\n$/);
    assert.ok(refused.out.length < 70 * 1024, `the refusal read is bounded (${refused.out.length} characters)`);
    const big = await svc(hostile.url, ['sandboxes', 'shell', 'sb-bigframe']);
    assert.equal(big.code, 1, big.out.slice(0, 300));
    assert.equal(big.out, "svc: the shell's connection closed (1006)\n", 'the frame was refused unread, and the socket cut');
    for (const ran of [garbage, after, refused, big]) assert.doesNotMatch(ran.out, /^\s+at .+:\d+:\d+\)?$/m, 'no stack trace');
  });

  test("a redirect to another host is not followed: neither the key nor a secret's value goes there", async () => {
    const ran = await svc(hostile.url, ['secrets', 'set', 'TOKEN'], { input: 'the-secret-value\n' });
    assert.equal(ran.code, 2, ran.out);
    assert.match(ran.out, /^svc: .*redirect/m);
    const listed = await svc(hostile.url, ['secrets', 'list']);
    assert.equal(listed.code, 2, listed.out);
    assert.deepEqual(seenElsewhere, [], 'the other host heard nothing');
  });
});
