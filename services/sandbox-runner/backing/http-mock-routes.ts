/**
 * An http_mock's routes (http-mock.ts): their path patterns, and the answer a route renders.
 *
 * Routes
 * - Path patterns: literal segments, `:name` (one non-empty segment, captured), `*` (one
 *   non-empty segment), `**` (any number of segments, zero included; last segment only).
 *   Segments are compared percent-decoded, case-sensitively; the query string is ignored and a
 *   trailing slash is insignificant. `routePatternProblem` says why a pattern is invalid.
 * - The first matching route wins, in spec order; `addRoute` (a drift fixture) replaces a route
 *   of the same method and pattern in place, or appends. HEAD takes a HEAD route, else the GET
 *   route, and gets its headers without a body.
 * - Templates: `{{ path.<name> }}` in a string body, in string values inside a JSON body and in
 *   header values becomes the captured path parameter (an unknown name stays as written). Plain
 *   substitution, no expressions. In a header, characters a header cannot carry are
 *   percent-encoded.
 * - Body: a string is sent as is (text/plain; charset=utf-8 unless the route sets content-type);
 *   anything else as JSON (application/json unless set). Content-length is always computed, a
 *   route's own content-length and transfer-encoding are ignored. A route header
 *   `x-mock-body-encoding: base64` says the string body is base64 bytes (how recordings keep
 *   binary answers); it is decoded and not sent.
 */
import type http from 'node:http';
import type { MockRoute } from '../../domain/spec.ts';

export const BODY_ENCODING_HEADER = 'x-mock-body-encoding';
/** Headers about one hop or the framing of one message: never copied from one message to another. */
export const HOP_HEADERS = new Set(['connection', 'keep-alive', 'proxy-connection', 'transfer-encoding', 'te', 'trailer', 'upgrade', 'content-length']);

// ---------------------------------------------------------------------------------------------
// Path patterns

export type Segment = { kind: 'literal'; text: string } | { kind: 'param'; name: string } | { kind: 'one' } | { kind: 'rest' };

const PARAM = /^:([A-Za-z_][A-Za-z0-9_]*)$/;

/** Why `pattern` is not a route pattern, or null when it is one. */
export function routePatternProblem(pattern: string): string | null {
  try {
    compilePattern(pattern);
    return null;
  } catch (error) {
    return (error as Error).message;
  }
}

/** The path parameters when `path` (query string ignored) matches `pattern`, else null. Throws on an invalid pattern. */
export function matchRoute(pattern: string, path: string): Record<string, string> | null {
  return matchSegments(compilePattern(pattern), path);
}

export function compilePattern(pattern: string): Segment[] {
  if (!pattern.startsWith('/')) throw new Error(`route path ${JSON.stringify(pattern)} does not start with /`);
  if (pattern.includes('?')) throw new Error(`route path ${JSON.stringify(pattern)} has a query string (queries are not matched)`);
  const parts = segmentsOf(pattern);
  const names = new Set<string>();
  return parts.map((part, i): Segment => {
    if (part === '**') {
      if (i !== parts.length - 1) throw new Error(`route path ${JSON.stringify(pattern)} has ** before its last segment`);
      return { kind: 'rest' };
    }
    if (part === '*') return { kind: 'one' };
    if (!part.startsWith(':')) return { kind: 'literal', text: decodeSegment(part) };
    const name = PARAM.exec(part)?.[1];
    if (!name) throw new Error(`route path ${JSON.stringify(pattern)}: ${JSON.stringify(part)} is not a parameter name (letters, digits, _)`);
    if (names.has(name)) throw new Error(`route path ${JSON.stringify(pattern)} names the parameter ${name} twice`);
    names.add(name);
    return { kind: 'param', name };
  });
}

export function matchSegments(pattern: Segment[], path: string): Record<string, string> | null {
  const parts = segmentsOf(path);
  const params: Array<[string, string]> = [];
  for (const [i, segment] of pattern.entries()) {
    if (segment.kind === 'rest') return Object.fromEntries(params);
    if (i >= parts.length) return null;
    const value = decodeSegment(parts[i]!);
    if (segment.kind === 'literal' ? value !== segment.text : value === '') return null;
    if (segment.kind === 'param') params.push([segment.name, value]);
  }
  // fromEntries defines own properties: a parameter named __proto__ stays a parameter.
  return pattern.length === parts.length ? Object.fromEntries(params) : null;
}

/** The segments of a path: query string dropped, one trailing slash insignificant, '/' has none. */
export function segmentsOf(path: string): string[] {
  const query = path.indexOf('?');
  let bare = query === -1 ? path : path.slice(0, query);
  if (bare.endsWith('/')) bare = bare.slice(0, -1);
  return bare === '' ? [] : bare.slice(1).split('/');
}

function decodeSegment(segment: string): string {
  try {
    return decodeURIComponent(segment);
  } catch {
    return segment; // a malformed escape is compared as written
  }
}

/** The same pattern for replacing: trailing slash insignificant. */
export function samePattern(a: string, b: string): boolean {
  return segmentsOf(a).join('/') === segmentsOf(b).join('/');
}

// ---------------------------------------------------------------------------------------------
// Rendering a route's answer

const TEMPLATE = /\{\{\s*path\.([A-Za-z_][A-Za-z0-9_]*)\s*\}\}/g;

function renderText(text: string, params: Record<string, string>, escaped: (value: string) => string = (v) => v): string {
  return text.replace(TEMPLATE, (whole, name: string) => (Object.hasOwn(params, name) ? escaped(params[name]!) : whole));
}

function renderJson(value: unknown, params: Record<string, string>): unknown {
  if (typeof value === 'string') return renderText(value, params);
  if (Array.isArray(value)) return value.map((item) => renderJson(item, params));
  if (value !== null && typeof value === 'object') return Object.fromEntries(Object.entries(value).map(([key, item]) => [key, renderJson(item, params)]));
  return value;
}

/** Header values carry visible ASCII and tabs only: a decoded parameter may hold anything. */
function headerSafe(value: string): string {
  return value.replace(/[^\t\x20-\x7e]/gu, (c) => encodeURIComponent(c));
}

export interface Answer {
  status: number;
  headers: Record<string, string>;
  body: Buffer;
}

export function renderRoute(route: MockRoute, params: Record<string, string>): Answer {
  const headers: Record<string, string> = {};
  for (const [name, value] of Object.entries(route.response.headers)) headers[name.toLowerCase()] = renderText(String(value), params, headerSafe);
  const encoding = headers[BODY_ENCODING_HEADER];
  delete headers[BODY_ENCODING_HEADER];
  const { body } = route.response;
  let bytes: Buffer;
  if (typeof body === 'string' && encoding === 'base64') bytes = Buffer.from(body, 'base64');
  else if (typeof body === 'string') bytes = Buffer.from(renderText(body, params));
  else if (body === undefined) bytes = Buffer.alloc(0);
  else {
    bytes = Buffer.from(JSON.stringify(renderJson(body, params)));
    headers['content-type'] ??= 'application/json';
  }
  if (bytes.length > 0) headers['content-type'] ??= 'text/plain; charset=utf-8';
  return { status: route.response.status, headers, body: bytes };
}

/** Writes an answer; HEAD, 1xx, 204 and 304 get no body; content-length is always ours. */
export function send(res: http.ServerResponse, method: string, answer: Answer, extra: Record<string, string> = {}): void {
  const { status } = answer;
  const headers: Record<string, string> = {};
  for (const [name, value] of Object.entries(answer.headers)) if (!HOP_HEADERS.has(name.toLowerCase())) headers[name.toLowerCase()] = value;
  const bodyless = status < 200 || status === 204 || status === 304;
  if (!bodyless) headers['content-length'] = String(answer.body.length);
  res.writeHead(status, { ...headers, ...extra });
  res.end(bodyless || method === 'HEAD' ? undefined : answer.body);
}

export function jsonAnswer(status: number, value: unknown): Answer {
  return { status, headers: { 'content-type': 'application/json' }, body: Buffer.from(JSON.stringify(value)) };
}
