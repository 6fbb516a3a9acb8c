/**
 * What an http_mock in record mode keeps of the real host's answers (http-mock.ts), as routes a
 * later spec can replay.
 *
 * Recording (`recording()`): one route per method + path (trailing slash and query string
 * ignored, so different queries share one route), the latest answer winning. Headers lose
 * hop-by-hop and framing ones and every credential-carrying one (a real session cookie must not
 * end up in a spec); the sandbox's secret values are replaced in paths, header values and text
 * bodies (`redact`). A gzip/deflate/br body is decoded (content-encoding dropped) when it can be
 * within `maxBodyBytes`. The body becomes JSON when content-type says JSON and it parses to an
 * object, array, number, boolean or null; else text when it is UTF-8 without control
 * characters; else base64 with `x-mock-body-encoding: base64`. A body over `maxBodyBytes`
 * (default 1 MiB), or past 64 MiB for all recorded bodies together, is left out and the route
 * says so in an `x-mock-body-omitted: <n> bytes` header. Methods outside the spec's HttpMethod
 * are answered but not recorded; at most `maxJournal` distinct routes are recorded. Replayed
 * text is a template too: a recorded `{{ path.x }}` would be substituted.
 */
import zlib from 'node:zlib';
import type { HttpMethod, MockRoute } from '../../domain/spec.ts';
import { isCredentialHeader } from '../network/headers.ts';
import { BODY_ENCODING_HEADER, HOP_HEADERS, segmentsOf, type Answer } from './http-mock-routes.ts';

export const BODY_OMITTED_HEADER = 'x-mock-body-omitted';
/** All recorded answer bodies together: a recording session never holds more. */
const RECORDING_BUDGET_BYTES = 64 * 1024 * 1024;

const HTTP_METHODS: ReadonlySet<string> = new Set<HttpMethod>(['GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'HEAD', 'OPTIONS']);

interface Recorded {
  method: HttpMethod;
  path: string;
  status: number;
  headers: Record<string, string>;
  /** null: left out, `omitted` says how big it was */
  body: Buffer | null;
  omitted: number;
}

export class Recorder {
  private readonly routes = new Map<string, Recorded>();
  private bytes = 0;

  constructor(
    private readonly maxRoutes: number,
    private readonly maxBodyBytes: number,
    private readonly redact: (text: string) => string,
  ) {}

  save(method: string, path: string, answer: Answer): void {
    if (!HTTP_METHODS.has(method)) return;
    const normalised = this.redact(`/${segmentsOf(path).join('/')}`);
    const key = `${method} ${normalised}`;
    const previous = this.routes.get(key);
    if (!previous && this.routes.size >= this.maxRoutes) return;
    const decoded = decodeContent(answer.headers, answer.body, this.maxBodyBytes);
    const headers = mapValues(decoded.headers, this.redact);
    const body = redactBody(decoded.body, this.redact);
    const before = this.bytes - (previous?.body?.length ?? 0);
    const fits = body.length <= this.maxBodyBytes && before + body.length <= RECORDING_BUDGET_BYTES;
    this.bytes = before + (fits ? body.length : 0);
    this.routes.set(key, {
      method: method as HttpMethod,
      path: normalised,
      status: answer.status,
      headers: recordableHeaders(headers),
      body: fits ? body : null,
      omitted: body.length,
    });
  }

  routesSeen(): MockRoute[] {
    return [...this.routes.values()].map((recorded) => ({
      method: recorded.method,
      path: recorded.path,
      response: { status: recorded.status, ...replayableBody(recorded) },
    }));
  }
}

/** The body without its content-encoding when it decodes within `limit`; else as it came. */
function decodeContent(headers: Record<string, string>, body: Buffer, limit: number): { headers: Record<string, string>; body: Buffer } {
  const lower = Object.fromEntries(Object.entries(headers).map(([name, value]) => [name.toLowerCase(), value]));
  const encoding = lower['content-encoding']?.trim().toLowerCase();
  const decoders: Record<string, (input: Buffer, options: zlib.ZlibOptions & zlib.BrotliOptions) => Buffer> = {
    gzip: zlib.gunzipSync,
    'x-gzip': zlib.gunzipSync,
    deflate: zlib.inflateSync,
    br: zlib.brotliDecompressSync,
  };
  const decoder = encoding ? decoders[encoding] : undefined;
  if (!decoder) return { headers: lower, body };
  try {
    const decoded = decoder(body, { maxOutputLength: limit });
    delete lower['content-encoding'];
    return { headers: lower, body: decoded };
  } catch {
    return { headers: lower, body }; // corrupt or too big decoded: kept encoded, still replays right
  }
}

function recordableHeaders(headers: Record<string, string>): Record<string, string> {
  return Object.fromEntries(Object.entries(headers).filter(([name]) => !HOP_HEADERS.has(name) && !isCredentialHeader(name)));
}

const STRICT_UTF8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

export function mapValues(record: Record<string, string>, map: (value: string) => string): Record<string, string> {
  return Object.fromEntries(Object.entries(record).map(([name, value]) => [name, map(value)]));
}

/** A UTF-8 body with the secrets replaced; a binary one as it is. */
function redactBody(body: Buffer, redact: (text: string) => string): Buffer {
  let text: string;
  try {
    text = STRICT_UTF8.decode(body);
  } catch {
    return body;
  }
  const redacted = redact(text);
  return redacted === text ? body : Buffer.from(redacted);
}

function replayableBody(recorded: Recorded): { headers: Record<string, string>; body: unknown } {
  const headers = { ...recorded.headers };
  if (!recorded.body) return { headers: { ...headers, [BODY_OMITTED_HEADER]: `${recorded.omitted} bytes` }, body: '' };
  let text: string | null;
  try {
    text = STRICT_UTF8.decode(recorded.body);
  } catch {
    text = null;
  }
  if (text !== null && /[/+]json\b/i.test(headers['content-type'] ?? '')) {
    try {
      const parsed: unknown = JSON.parse(text);
      // A JSON string stays text: replayed as a string body it would lose its quotes.
      if (typeof parsed !== 'string') return { headers, body: parsed };
    } catch {
      // not JSON after all: text below
    }
  }
  if (text !== null && !/[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]/.test(text)) return { headers, body: text };
  return { headers: { ...headers, [BODY_ENCODING_HEADER]: 'base64' }, body: recorded.body.toString('base64') };
}
