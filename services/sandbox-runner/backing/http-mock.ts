/**
 * An `http_mock` backing service (DECISIONS.md "Mocks"): answers the parsed HTTP requests the
 * egress gateway hands it (HTTPS already terminated) from the spec's routes, keeps a journal of
 * what it received for `http_mock_assertions` and the API, and with `record: true` sends
 * unmatched requests to the real host and keeps the answers as routes a later spec can replay.
 * It never listens itself: the caller serves `handle`.
 *
 * How routes match and what they answer is told in http-mock-routes.ts, what record mode keeps
 * in http-mock-recording.ts.
 *
 * Requests no route answers
 * - Without record: 404 `{error: "no_route", message, routes: ["GET /a", ...]}` so the agent and
 *   its developer see what the mock does answer.
 * - With record: `forward` (the caller's, which applies the egress policy) gets it, and its
 *   answer goes to the sandbox. An answer marked `refused` (the policy said no) is passed on but
 *   not recorded; a thrown error is a 502 JSON naming the mock, the host and the reason.
 * - A request body over `maxRequestBytes` (default 10 MiB) gets 413 and the connection closes.
 *
 * Journal: every request, answered or not, with its headers redacted (network/headers.ts; and
 * the sandbox's secret values in its path, query and headers: `redact`) and
 * its body size, never its body; the newest `maxJournal` (default 10,000) are kept and `dropped`
 * counts the rest. `requestCount` counts every request since the start, dropped ones included,
 * per method and path; past 100,000 distinct method+path pairs new pairs are not counted and
 * `uncounted` says how many requests that left out (a count is then possibly low). Entries are
 * added when answered (a slow forward's entry comes after quicker later ones; `ts` is arrival).
 * `probe` (wait_for) asks the routes without a journal entry.
 */
import type http from 'node:http';
import type { MockRoute } from '../../domain/spec.ts';
import { redactHeaders } from '../network/headers.ts';
import { mapValues, Recorder } from './http-mock-recording.ts';
import { compilePattern, HOP_HEADERS, jsonAnswer, matchSegments, renderRoute, samePattern, send, type Segment } from './http-mock-routes.ts';

export type { MockRoute };

export interface JournalEntry {
  /** when the request arrived, ISO 8601 */
  ts: string;
  method: string;
  /** as received (percent-encoded), without the query string */
  path: string;
  /** without the leading `?`; '' when none */
  query: string;
  /** redacted */
  headers: Record<string, string>;
  /** bytes received; for a 413, as many as were read before giving up */
  body_bytes: number;
  status: number;
  /** index of the route that answered; null: unmatched */
  route: number | null;
  /** answered by the real host in record mode */
  recorded: boolean;
}

/** The real host's answer in record mode; throw when it cannot be reached. */
export type Forward = (request: { method: string; host: string; path: string /* with query */; headers: Record<string, string>; body: Buffer }) => Promise<{
  status: number;
  headers: Record<string, string>;
  body: Buffer;
  /** the egress policy refused (or the caller answered itself): passed on to the sandbox, never recorded */
  refused?: boolean;
}>;

export interface HttpMockOptions {
  name: string;
  routes: MockRoute[];
  record: boolean;
  /** required when `record` */
  forward?: Forward;
  /** journal entries kept (default 10,000); older ones go and `dropped` counts them */
  maxJournal?: number;
  /** largest answer body a recording keeps (default 1 MiB) */
  maxBodyBytes?: number;
  /** largest request body accepted (default 10 MiB); a bigger one gets 413 */
  maxRequestBytes?: number;
  /**
   * The sandbox's secret values replaced in `text` (default: none): applied to what the mock
   * keeps, the journal's path, query and headers and the recording's paths, headers and text
   * bodies. An agent's secret sent in a query string, or echoed back by the real host, is no
   * secret of the journal's readers nor of a spec made from the recording.
   */
  redact?: (text: string) => string;
}

export const DEFAULT_MAX_JOURNAL = 10_000;
export const DEFAULT_MAX_BODY_BYTES = 1024 * 1024;
export const DEFAULT_MAX_REQUEST_BYTES = 10 * 1024 * 1024;
/** Distinct method+path pairs counted for requestCount. */
const MAX_COUNTED_PAIRS = 100_000;

// ---------------------------------------------------------------------------------------------
// The journal

class RequestJournal {
  private readonly kept: JournalEntry[] = [];
  /** index in `kept` of the oldest entry once it is full (a ring) */
  private oldest = 0;
  private dropped = 0;
  /** `${METHOD} ${path}` -> requests, every one since the start */
  private readonly counts = new Map<string, number>();
  private uncounted = 0;

  constructor(private readonly max: number) {}

  add(entry: JournalEntry): void {
    if (this.kept.length < this.max) this.kept.push(entry);
    else {
      this.kept[this.oldest] = entry;
      this.oldest = (this.oldest + 1) % this.max;
      this.dropped++;
    }
    const key = `${entry.method.toUpperCase()} ${entry.path}`;
    const count = this.counts.get(key);
    if (count !== undefined) this.counts.set(key, count + 1);
    else if (this.counts.size < MAX_COUNTED_PAIRS) this.counts.set(key, 1);
    else this.uncounted++;
  }

  snapshot(): { entries: JournalEntry[]; dropped: number; uncounted: number } {
    return { entries: [...this.kept.slice(this.oldest), ...this.kept.slice(0, this.oldest)], dropped: this.dropped, uncounted: this.uncounted };
  }

  count(method: string, pattern: string): number {
    const segments = compilePattern(pattern);
    const wanted = method.toUpperCase();
    let total = 0;
    for (const [key, count] of this.counts) {
      const space = key.indexOf(' ');
      if ((wanted === '*' || key.slice(0, space) === wanted) && matchSegments(segments, key.slice(space + 1))) total += count;
    }
    return total;
  }
}

// ---------------------------------------------------------------------------------------------
// Requests

/** `body` null: it did not arrive whole (`broken`) or was too large. */
type BodyRead = { body: Buffer | null; bytes: number; failure: 'too_large' | 'broken' | null };

/** The request body, read up to `limit` bytes; past it reading stops (the rest is discarded). */
function readBody(req: http.IncomingMessage, limit: number): Promise<BodyRead> {
  // A body someone else already read never ends here: say so rather than hang.
  if (req.readableEnded || req.destroyed) return Promise.resolve({ body: null, bytes: 0, failure: 'broken' });
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let bytes = 0;
    let settled = false;
    const settle = (read: BodyRead) => {
      if (settled) return;
      settled = true;
      req.off('data', onData);
      resolve(read);
    };
    const onData = (chunk: Buffer) => {
      bytes += chunk.length;
      if (bytes > limit) settle({ body: null, bytes, failure: 'too_large' });
      else chunks.push(chunk);
    };
    req.on('data', onData);
    req.once('end', () => settle({ body: Buffer.concat(chunks), bytes, failure: null }));
    req.once('error', () => settle({ body: null, bytes, failure: 'broken' }));
    req.once('close', () => settle(req.complete ? { body: Buffer.concat(chunks), bytes, failure: null } : { body: null, bytes, failure: 'broken' }));
  });
}

/** Path and query of a request target, origin form or a proxy's absolute form. */
function splitTarget(target: string): { path: string; query: string } {
  if (/^https?:\/\//i.test(target)) {
    try {
      const url = new URL(target);
      return { path: url.pathname, query: url.search.slice(1) };
    } catch {
      // not a URL after all: split as written
    }
  }
  const mark = target.indexOf('?');
  return mark === -1 ? { path: target, query: '' } : { path: target.slice(0, mark), query: target.slice(mark + 1) };
}

/** Request headers for the real host: joined, without hop-by-hop and framing ones (the body is whole). */
function forwardableHeaders(headers: http.IncomingHttpHeaders): Record<string, string> {
  const kept: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) {
    if (value !== undefined && !HOP_HEADERS.has(name)) kept[name] = Array.isArray(value) ? value.join(', ') : value;
  }
  return kept;
}

function reason(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

// ---------------------------------------------------------------------------------------------
// The mock

interface Outcome {
  route: number | null;
  recorded: boolean;
}

export class HttpMock {
  readonly name: string;
  private readonly routes: Array<{ route: MockRoute; pattern: Segment[] }> = [];
  private readonly record: boolean;
  private readonly forward: Forward | undefined;
  private readonly maxRequestBytes: number;
  private readonly log: RequestJournal;
  private readonly recorder: Recorder;
  private readonly redact: (text: string) => string;

  constructor(options: HttpMockOptions) {
    const maxJournal = positive(options.maxJournal, DEFAULT_MAX_JOURNAL, 'maxJournal');
    if (options.record && !options.forward) throw new Error(`mock ${options.name} records but has no forward function`);
    this.name = options.name;
    this.record = options.record;
    this.forward = options.forward;
    this.maxRequestBytes = positive(options.maxRequestBytes, DEFAULT_MAX_REQUEST_BYTES, 'maxRequestBytes');
    this.log = new RequestJournal(maxJournal);
    this.redact = options.redact ?? ((text) => text);
    this.recorder = new Recorder(maxJournal, positive(options.maxBodyBytes, DEFAULT_MAX_BODY_BYTES, 'maxBodyBytes'), this.redact);
    for (const route of options.routes) this.routes.push(this.compile(route));
  }

  /** Answers one request; `host` is the Host the sandbox asked for. Never rejects; resolves once answered and journaled. */
  async handle(req: http.IncomingMessage, res: http.ServerResponse, host: string): Promise<void> {
    const ts = new Date().toISOString();
    const method = (req.method ?? 'GET').toUpperCase();
    const { path, query } = splitTarget(req.url ?? '/');
    const read = await readBody(req, this.maxRequestBytes);
    let outcome: Outcome = { route: null, recorded: false };
    try {
      if (read.failure === 'too_large')
        send(res, method, jsonAnswer(413, { error: 'body_too_large', message: `mock ${this.name} takes request bodies up to ${this.maxRequestBytes} bytes` }), {
          connection: 'close',
        });
      else if (read.body === null)
        send(res, method, jsonAnswer(400, { error: 'broken_request', message: `mock ${this.name}: the request body did not arrive whole` }));
      else outcome = await this.answer(req, res, { method, path, query, host, body: read.body });
    } catch (error) {
      if (!res.headersSent)
        send(res, method, jsonAnswer(500, { error: 'mock_failed', message: `mock ${this.name} failed to answer ${method} ${path}: ${reason(error)}` }));
      else res.destroy();
    }
    this.log.add({
      ts,
      method,
      path: this.redact(path),
      query: this.redact(query),
      headers: mapValues(redactHeaders(req.headers), this.redact),
      body_bytes: read.bytes,
      status: res.statusCode,
      ...outcome,
    });
  }

  /**
   * The status `method path` gets from the routes (404 when none matches; record mode's real
   * host is not asked), without journaling it: a readiness probe is not a request of the agent.
   */
  probe(method: string, path: string): number {
    const found = this.find(method.toUpperCase(), path);
    return found ? this.routes[found.index]!.route.response.status : 404;
  }

  /** The journal, oldest first; `dropped` entries went past maxJournal; `uncounted` requests are missing from requestCount. */
  journal(): { entries: JournalEntry[]; dropped: number; uncounted: number } {
    return this.log.snapshot();
  }

  /** Requests since the start whose method is `method` (any case; '*' any) and whose path matches the pattern `path`. */
  requestCount(method: string, path: string): number {
    return this.log.count(method, path);
  }

  /** What record mode saw, as routes (see the module header). */
  recording(): MockRoute[] {
    return this.recorder.routesSeen();
  }

  /** A drift fixture's route: replaces the route of the same method and pattern in place, else comes last. */
  addRoute(route: MockRoute): void {
    const compiled = this.compile(route);
    const same = this.routes.findIndex(({ route: r }) => r.method === route.method && samePattern(r.path, route.path));
    if (same === -1) this.routes.push(compiled);
    else this.routes[same] = compiled;
  }

  private compile(route: MockRoute): { route: MockRoute; pattern: Segment[] } {
    try {
      return { route, pattern: compilePattern(route.path) };
    } catch (error) {
      throw new Error(`mock ${this.name}: ${reason(error)}`);
    }
  }

  private async answer(
    req: http.IncomingMessage,
    res: http.ServerResponse,
    request: { method: string; path: string; query: string; host: string; body: Buffer },
  ): Promise<Outcome> {
    const { method, path } = request;
    const found = this.find(method, path);
    if (found) {
      send(res, method, renderRoute(this.routes[found.index]!.route, found.params));
      return { route: found.index, recorded: false };
    }
    if (!this.record) {
      const routes = this.routes.map(({ route }) => `${route.method} ${route.path}`);
      send(res, method, jsonAnswer(404, { error: 'no_route', message: `mock ${this.name} has no route for ${method} ${path}`, routes }));
      return { route: null, recorded: false };
    }
    return this.answerFromRealHost(req, res, request);
  }

  /** The first route for the method (HEAD: a HEAD route, else a GET one) whose pattern matches. */
  private find(method: string, path: string): { index: number; params: Record<string, string> } | null {
    for (const wanted of method === 'HEAD' ? ['HEAD', 'GET'] : [method]) {
      for (const [index, { route, pattern }] of this.routes.entries()) {
        if (route.method !== wanted) continue;
        const params = matchSegments(pattern, path);
        if (params) return { index, params };
      }
    }
    return null;
  }

  private async answerFromRealHost(
    req: http.IncomingMessage,
    res: http.ServerResponse,
    request: { method: string; path: string; query: string; host: string; body: Buffer },
  ): Promise<Outcome> {
    const { method, path, host } = request;
    let answer: Awaited<ReturnType<Forward>>;
    try {
      const target = request.query ? `${path}?${request.query}` : path;
      answer = await this.forward!({ method, host, path: target, headers: forwardableHeaders(req.headers), body: request.body });
    } catch (error) {
      send(
        res,
        method,
        jsonAnswer(502, { error: 'forward_failed', message: `mock ${this.name} could not get ${method} ${path} from ${host}: ${reason(error)}` }),
      );
      return { route: null, recorded: false };
    }
    send(res, method, answer);
    if (answer.refused) return { route: null, recorded: false };
    this.recorder.save(method, path, answer);
    return { route: null, recorded: true };
  }
}

function positive(value: number | undefined, fallback: number, what: string): number {
  if (value === undefined) return fallback;
  if (!Number.isSafeInteger(value) || value < 1) throw new Error(`${what} must be a positive whole number, not ${value}`);
  return value;
}
