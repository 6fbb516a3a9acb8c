/**
 * The outside ends of alert notifications, as real servers on the loopback: an HTTP receiver for
 * webhooks (each path answers as its script says), a fake of the chat service (Slack's Web API
 * `chat.postMessage` and its incoming webhooks, as a real HTTP server), and an SMTP server
 * (the `smtp-server` library in-process) that keeps every message it accepts.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { SMTPServer } from 'smtp-server';

export interface ReceivedRequest {
  at: number;
  method: string;
  path: string;
  headers: http.IncomingHttpHeaders;
  text: string;
  body: any;
}

/** What one request to a path gets: a status and body, after an optional delay; `hang` never answers (until close). */
export type Answer = { status: number; body?: unknown; delayMs?: number } | 'hang';

export interface HttpReceiver {
  url: string;
  /** host:port, for SVC_SLACK_WEBHOOK_HOSTS. */
  host: string;
  requests: ReceivedRequest[];
  /** The requests to `path`. */
  to(path: string): ReceivedRequest[];
  /** The answers of `path`, one per request in order; the last repeats. Default: 200 ok. */
  script(path: string, answers: Answer[]): void;
  /** Resolves once `path` received `n` requests. */
  waitFor(path: string, n?: number, ms?: number): Promise<ReceivedRequest[]>;
  close(): Promise<void>;
}

export async function httpReceiver(route: (req: ReceivedRequest) => Answer | null = () => null, address = '127.0.0.1'): Promise<HttpReceiver> {
  const requests: ReceivedRequest[] = [];
  const scripts = new Map<string, Answer[]>();
  const hanging = new Set<http.ServerResponse>();
  const server = http.createServer((req, res) => {
    let text = '';
    req.on('data', (d) => (text += d));
    req.on('end', () => {
      let body: unknown = null;
      try {
        body = JSON.parse(text);
      } catch {
        // not JSON
      }
      const path = (req.url ?? '/').split('?')[0]!;
      const received: ReceivedRequest = { at: Date.now(), method: req.method ?? '', path, headers: req.headers, text, body };
      requests.push(received);
      const script = scripts.get(path);
      const answer = route(received) ?? (script ? (script.length > 1 ? script.shift()! : script[0]!) : { status: 200, body: 'ok' });
      if (answer === 'hang') {
        hanging.add(res);
        return;
      }
      const send = () => {
        const payload = typeof answer.body === 'string' || answer.body === undefined ? String(answer.body ?? '') : JSON.stringify(answer.body);
        if (!res.destroyed) res.writeHead(answer.status, { 'content-type': typeof answer.body === 'object' ? 'application/json' : 'text/plain' }).end(payload);
      };
      if (answer.delayMs) setTimeout(send, answer.delayMs);
      else send();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, address, resolve));
  const port = (server.address() as AddressInfo).port;
  const to = (path: string) => requests.filter((r) => r.path === path);
  return {
    url: `http://${address}:${port}`,
    host: `${address}:${port}`,
    requests,
    to,
    script: (path, answers) => void scripts.set(path, [...answers]),
    async waitFor(path, n = 1, ms = 30_000) {
      const deadline = Date.now() + ms;
      while (to(path).length < n) {
        if (Date.now() > deadline) throw new Error(`${path} received ${to(path).length} requests, not ${n}, within ${ms} ms`);
        await new Promise((r) => setTimeout(r, 25));
      }
      return to(path);
    },
    async close() {
      for (const res of hanging) res.destroy();
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

/**
 * The chat service's fake: `POST /api/chat.postMessage` answers as Slack does (HTTP 200, `ok`
 * true, or false with an `error` for a channel it does not know or a wrong token), and any
 * `/services/...` path is an incoming webhook that answers `ok`.
 */
export async function slackFake(token: string, channels: string[]): Promise<HttpReceiver & { api: string }> {
  const receiver = await httpReceiver((req) => {
    if (req.path !== '/api/chat.postMessage') return req.path.startsWith('/services/') ? { status: 200, body: 'ok' } : { status: 404, body: 'no such path' };
    if (req.headers.authorization !== `Bearer ${token}`) return { status: 200, body: { ok: false, error: 'invalid_auth' } };
    if (!channels.includes(req.body?.channel)) return { status: 200, body: { ok: false, error: 'channel_not_found' } };
    return { status: 200, body: { ok: true, channel: 'C0123', ts: '1700000000.000100', message: { text: req.body.text } } };
  });
  return { ...receiver, api: `${receiver.url}/api` };
}

export interface ReceivedMail {
  from: string;
  to: string[];
  raw: string;
  subject: string;
  /** The raw message with quoted-printable soft breaks and escapes undone (enough to search its text). */
  decoded: string;
}

export interface SmtpReceiver {
  url: string;
  messages: ReceivedMail[];
  waitFor(n?: number, ms?: number): Promise<ReceivedMail[]>;
  close(): Promise<void>;
}

/** An SMTP server on the loopback (no TLS, no auth) that accepts mail for every address but those in `refuse` (550). */
export async function smtpReceiver(refuse: string[] = []): Promise<SmtpReceiver> {
  const messages: ReceivedMail[] = [];
  const server = new SMTPServer({
    authOptional: true,
    disabledCommands: ['STARTTLS', 'AUTH'],
    logger: false,
    onRcptTo(address, _session, callback) {
      if (refuse.includes(address.address)) return callback(Object.assign(new Error(`no mailbox ${address.address}`), { responseCode: 550 }));
      callback();
    },
    onData(stream, session, callback) {
      let raw = '';
      stream.on('data', (d: Buffer) => (raw += d.toString('utf8')));
      stream.on('end', () => {
        const decoded = raw.replace(/=\r?\n/g, '').replace(/=([0-9A-F]{2})/g, (_m, h: string) => String.fromCharCode(parseInt(h, 16)));
        const subject = /^Subject: (.*(?:\r?\n[ \t].*)*)/m.exec(raw)?.[1]?.replace(/\r?\n[ \t]/g, ' ') ?? '';
        messages.push({
          from: session.envelope.mailFrom ? session.envelope.mailFrom.address : '',
          to: session.envelope.rcptTo.map((r) => r.address),
          raw,
          subject,
          decoded,
        });
        callback();
      });
    },
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.server.address() as AddressInfo).port;
  return {
    url: `smtp://127.0.0.1:${port}`,
    messages,
    async waitFor(n = 1, ms = 30_000) {
      const deadline = Date.now() + ms;
      while (messages.length < n) {
        if (Date.now() > deadline) throw new Error(`the SMTP server received ${messages.length} messages, not ${n}, within ${ms} ms`);
        await new Promise((r) => setTimeout(r, 25));
      }
      return messages;
    },
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}
