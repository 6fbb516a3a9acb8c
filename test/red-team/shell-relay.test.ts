/**
 * Red team: the sandbox shell's WebSocket (GET /v1/sandboxes/:id/shell) against a client that
 * means harm. Pins: (1) a flood of bad frames from a client that reads none of the error frames
 * they earn does not grow the api's memory (each 7-byte frame earned a ~150-byte answer, held for
 * ever: 14 MB of them grew the api by 937 MiB): past a bound of unread answers the socket is cut
 * off, and the shell with it; (2) a storm of resizes, valid and absurd (0x0, 65535x65535,
 * negative, fractions, 1e308, strings, null), leaves the session working, with the last valid
 * size the terminal's; (3) a flood of input the shell does not read is held at the client (the
 * api stops reading the socket), not in the api's memory. Another tenant's key and a sandbox
 * token are refused before any socket exists (test/e2e/sandbox-shell.test.ts).
 */
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { after, before, describe, test } from 'node:test';
import WebSocket from 'ws';
import { backend } from '../helpers/backend.ts';
import { SPEC, storeSpec } from '../helpers/sandboxes.ts';
import { createTenantKey, startServer, type TestServer } from '../helpers/server.ts';

const until = async (what: string, done: () => boolean | Promise<boolean>, timeoutMs = 20_000) => {
  const deadline = Date.now() + timeoutMs;
  while (!(await done())) {
    if (Date.now() > deadline) throw new Error(`${what}: not within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
};

interface Shell {
  ws: WebSocket;
  screen(): string;
  controls: Array<Record<string, any>>;
  closed: Promise<number>;
  type(text: string): void;
  waitFor(pattern: RegExp, timeoutMs?: number): Promise<void>;
}

const runtime = backend('SVC_TEST_BWRAP', 'the shell relay against a hostile client on the local runtime');

describe('red team: the shell relay against a hostile client', { skip: !runtime }, () => {
  let server: TestServer;
  let key: string;

  const rss = () => server.processes().reduce((sum, p) => sum + Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${p.pid}/status`, 'utf8'))![1]) * 1024, 0);
  const create = async () => {
    const res = await server.request('POST', '/v1/sandboxes', { key, body: { spec_id: 'shell-red' } });
    assert.equal(res.status, 201, res.text);
    return res.body.id as string;
  };
  const open = (id: string) =>
    new Promise<Shell>((resolve, reject) => {
      const ws = new WebSocket(`${server.url.replace('http', 'ws')}/v1/sandboxes/${id}/shell`, { headers: { authorization: `Bearer ${key}` } });
      let text = '';
      const controls: Array<Record<string, any>> = [];
      const shell: Shell = {
        ws,
        screen: () => text,
        controls,
        closed: new Promise((done) => ws.on('close', (code) => done(code))),
        type: (input) => ws.send(Buffer.from(input)),
        waitFor: (pattern, timeoutMs) =>
          until(`the terminal showing ${pattern} (it shows ${JSON.stringify(text.slice(-300))})`, () => pattern.test(text), timeoutMs),
      };
      ws.on('message', (data, isBinary) => {
        if (!isBinary) {
          const frame = JSON.parse(String(data));
          controls.push(frame);
          if (frame.type === 'ready') resolve(shell);
          return;
        }
        text = (text + String(data)).slice(-100_000);
      });
      ws.on('unexpected-response', (_req, res) => reject(new Error(`refused: ${res.statusCode}`)));
      ws.on('error', reject);
    });
  /** Sends every frame, waiting while the socket's own buffer is full (the client's side of the flood). */
  const flood = async (ws: WebSocket, frames: Iterable<string | Buffer>, stopWhen = () => false) => {
    for (const frame of frames) {
      if (ws.readyState !== ws.OPEN || stopWhen()) return;
      ws.send(frame);
      if (ws.bufferedAmount > 4 * 1024 * 1024)
        await until('the socket taking the flood', () => ws.bufferedAmount < 1024 * 1024 || ws.readyState !== ws.OPEN || stopWhen(), 60_000).catch(() => {});
    }
  };

  before(async () => {
    server = await startServer({ SVC_SANDBOX_HOST_ROOTFS: 'true', SVC_RATE_LIMIT_WRITES: '0', SVC_RATE_LIMIT_READS: '0' });
    key = (await createTenantKey(server, 'shell-red')).key;
    await storeSpec(server, key, SPEC('shell-red'));
  });
  after(async () => server?.cleanup());

  test('bad frames from a client that reads none of the answers: the api stays flat, and the socket is cut off', async () => {
    const shell = await open(await create());
    shell.ws.pause(); // read nothing of what the api answers
    let closed = false;
    void shell.closed.then(() => (closed = true));
    const socket = (shell.ws as unknown as { _socket: import('node:net').Socket })._socket;
    // Two million text frames "x", masked (with a zero key) as a client's must be, written in
    // bursts as an attacker would: 14 MB on the wire, each frame earning an error frame of ~150 bytes.
    const burst = Buffer.concat(Array.from({ length: 100_000 }, () => Buffer.from([0x81, 0x81, 0, 0, 0, 0, 0x78])));
    const before = rss();
    let peak = before;
    const sampler = setInterval(() => (peak = Math.max(peak, rss())), 100);
    try {
      for (let i = 0; i < 20 && !closed && !socket.destroyed; i++) {
        if (!socket.write(burst)) await new Promise((r) => socket.once('drain', r).once('close', r));
      }
      await until('the socket cut off', () => closed, 60_000).catch(() => {});
    } finally {
      clearInterval(sampler);
    }
    const grew = peak - before;
    assert.ok(grew < 64 * 1024 * 1024, `the api grew by ${Math.round(grew / 1024 / 1024)} MiB holding answers nobody reads`);
    assert.ok(closed, 'the api cut off the client that reads nothing');
    assert.equal(await shell.closed, 1006, 'cut off, without a close frame');
  });

  test('a storm of resizes, valid and absurd: each absurd one refused, the session goes on, the last valid size wins', async () => {
    const shell = await open(await create());
    const absurd: unknown[][] = [
      [0, 0],
      [65535, 65535],
      [-1, 24],
      [80, -24],
      [80.5, 24],
      [1e308, 24],
      [80, Number.MAX_SAFE_INTEGER + 2],
      ['80', 24],
      [null, null],
      [[80], 24],
      [{}, 24],
      [true, 24],
    ];
    const frames = function* () {
      for (let i = 0; i < 20_000; i++) yield JSON.stringify({ type: 'resize', cols: 20 + (i % 900), rows: 5 + (i % 300) });
      for (const [cols, rows] of absurd) yield JSON.stringify({ type: 'resize', cols, rows });
      yield JSON.stringify({ type: 'resize', cols: 123, rows: 45 });
    };
    const started = Date.now();
    await flood(shell.ws, frames());
    await until('an error frame for each absurd size', () => shell.controls.filter((c) => c.type === 'error').length >= absurd.length, 30_000);
    const errors = shell.controls.filter((c) => c.type === 'error');
    assert.equal(errors.length, absurd.length, JSON.stringify(errors.slice(0, 5)));
    assert.ok(
      errors.every((e) => e.error === 'bad_request'),
      JSON.stringify(errors),
    );
    await until(
      'the last size applied',
      async () => {
        shell.type('stty size\r');
        await new Promise((r) => setTimeout(r, 300));
        return /\b45 123\b/.test(shell.screen());
      },
      30_000,
    );
    assert.ok(Date.now() - started < 60_000, `the storm took ${Date.now() - started} ms`);
    shell.type('echo "alive $((6*7))"\r');
    await shell.waitFor(/alive 42/);
    shell.ws.close();
  });

  test('a flood of input the shell does not read is held at the client, not in the api', async () => {
    const shell = await open(await create());
    shell.type('sleep 600\r');
    await new Promise((r) => setTimeout(r, 500));
    const chunk = Buffer.alloc(60 * 1024, 'a');
    for (let i = 0; i < 800; i++) shell.ws.send(chunk); // 48 MB, queued in this client
    await new Promise((r) => setTimeout(r, 3000));
    // What the client still holds is the measure: at most 8 MB of the 48 left it, the kernel's
    // socket buffers included. (The api's RSS was no measure: in one full run it grew by 68 MiB
    // while the client still held over 40 MB, so not from this input.)
    const held = shell.ws.bufferedAmount;
    assert.ok(held > 40 * 1024 * 1024, `the api stopped reading: ${held} bytes wait in the client`);
    shell.ws.terminate();
  });
});
