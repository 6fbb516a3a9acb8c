/**
 * Typed client for the service's resource endpoints (service-spec.md, "Endpoints"). Configured
 * from SVC_BASE_URL, SVC_API_KEY and SVC_SANDBOX_ID, which a sandbox injects into its agent.
 */
import type { TraceEventBody } from './tracing.ts';

export interface ClientOptions {
  baseUrl?: string;
  apiKey?: string;
  sandboxId?: string;
}

/** A non-2xx answer: the service's `{error, message}` body with the HTTP status. */
export class SvcError extends Error {
  readonly status: number;
  readonly error: string;

  constructor(status: number, error: string, message: string) {
    super(message);
    this.name = 'SvcError';
    this.status = status;
    this.error = error;
  }
}

export interface Page<T> {
  items: T[];
  next_cursor?: string;
  count: number;
}

export interface PageQuery {
  limit?: number;
  cursor?: string;
}

export interface Sandbox {
  id: string;
  spec_id: string;
  state: 'creating' | 'ready' | 'running' | 'stopped' | 'error';
  path: string;
  url: string;
  created_at: string;
  metadata: Record<string, string>;
  services: Record<string, { host: string; port: number; ready: boolean }>;
  [field: string]: unknown;
}

export interface CreateSandbox {
  spec_id: string;
  timeout?: string;
  metadata?: Record<string, string>;
  secrets?: Record<string, string>;
}

export interface CommandResult {
  command: string;
  stdout: string;
  stderr: string;
  exit_code: number;
  duration_ms: number;
}

export interface AgentMetadata {
  name: string;
  entrypoint: string | string[];
  runtime?: string;
  tag?: string;
  auth?: unknown;
}

export interface AgentSnapshot {
  id: string;
  name: string;
  version: number;
  digest: string;
  [field: string]: unknown;
}

export interface Experiment {
  id: string;
  name: string;
  spec_id: string;
  status: string;
  created_at: string;
  [field: string]: unknown;
}

export interface Comparison {
  baseline_id: string;
  candidate_id: string;
  regressed: boolean;
  regressions: string[];
  metrics: { name: string; baseline: number; candidate: number; delta: number; direction: string }[];
}

/** A stored trace event, as GET /v1/traces returns it. */
export type StoredTraceEvent = TraceEventBody & { tenant: string; sandbox_id: string | null; [field: string]: unknown };

export interface TraceFilters extends PageQuery {
  experiment_id?: string;
  sandbox_id?: string;
  agent?: string;
  event_type?: string;
  tool?: string;
  since?: string;
}

/** Spec records' shape is not fixed by the spec; the known fields are typed. */
export interface SpecRecord {
  spec_id?: string;
  id?: string;
  version: number;
  [field: string]: unknown;
}

type Bytes = Buffer | Uint8Array | AsyncIterable<Uint8Array | string>;

interface RequestOptions {
  json?: unknown;
  body?: BodyInit;
  headers?: Record<string, string>;
  query?: object;
}

export type SvcClient = ReturnType<typeof createClient>;

export function createClient(options: ClientOptions = {}) {
  const baseUrl = (options.baseUrl ?? process.env.SVC_BASE_URL ?? '').replace(/\/+$/, '');
  if (!baseUrl) throw new Error('createClient: no base URL (set SVC_BASE_URL or pass baseUrl)');
  const apiKey = options.apiKey ?? process.env.SVC_API_KEY;
  const sandboxId = options.sandboxId ?? process.env.SVC_SANDBOX_ID;
  const seg = encodeURIComponent;

  async function send(method: string, path: string, opts: RequestOptions = {}): Promise<Response> {
    const headers: Record<string, string> = { ...opts.headers };
    if (apiKey) headers.authorization = `Bearer ${apiKey}`;
    let body = opts.body;
    if (opts.json !== undefined) {
      body = JSON.stringify(opts.json);
      headers['content-type'] = 'application/json';
    }
    const params = new URLSearchParams();
    for (const [k, v] of Object.entries(opts.query ?? {})) if (v !== undefined && v !== null) params.set(k, String(v));
    const qs = params.size > 0 ? `?${params}` : '';
    const res = await fetch(`${baseUrl}${path}${qs}`, { method, headers, body });
    if (!res.ok) {
      const text = await res.text();
      let parsed: { error?: unknown; message?: unknown } = {};
      try {
        parsed = JSON.parse(text);
      } catch {
        // not JSON: the raw text is the message
      }
      throw new SvcError(res.status, typeof parsed.error === 'string' ? parsed.error : 'http_error', typeof parsed.message === 'string' ? parsed.message : text || res.statusText);
    }
    return res;
  }

  const json = async <T>(method: string, path: string, opts?: RequestOptions): Promise<T> => (await send(method, path, opts)).json() as Promise<T>;
  const text = async (method: string, path: string, opts?: RequestOptions): Promise<string> => (await send(method, path, opts)).text();

  const sandboxPath = (id: string) => `/v1/sandboxes/${seg(id)}`;
  const filePath = (id: string, file: string) => `${sandboxPath(id)}/files/${file.replace(/^\/+/, '').split('/').map(seg).join('/')}`;

  return {
    baseUrl,
    sandboxId,
    sandboxes: {
      create: (body: CreateSandbox) => json<Sandbox>('POST', '/v1/sandboxes', { json: body }),
      get: (id: string) => json<Sandbox>('GET', sandboxPath(id)),
      /** The sandbox this process runs in (SVC_SANDBOX_ID). */
      self: async () => {
        if (!sandboxId) throw new Error('sandboxes.self: SVC_SANDBOX_ID is not set');
        return json<Sandbox>('GET', sandboxPath(sandboxId));
      },
      list: () => json<Sandbox[]>('GET', '/v1/sandboxes'),
      destroy: (id: string) => json<{ id: string; state: string }>('DELETE', sandboxPath(id)),
      command: (id: string, command: string, opts: { timeout?: string; background?: boolean } = {}) =>
        json<CommandResult>('POST', `${sandboxPath(id)}/commands`, { json: { command, ...opts } }),
      readFile: (id: string, file: string) => text('GET', filePath(id, file)),
      writeFile: (id: string, file: string, content: string) => json<unknown>('POST', `${sandboxPath(id)}/files`, { json: { path: file, content } }),
      deleteFile: (id: string, file: string) => json<unknown>('DELETE', filePath(id, file)),
      state: (id: string) => json<unknown>('GET', `${sandboxPath(id)}/state`),
      diff: (id: string) => json<unknown>('GET', `${sandboxPath(id)}/diff`),
      /** Either reset the timer (`timeout`) or add to it (`extend`), as duration strings. */
      timeout: (id: string, change: { timeout: string } | { extend: string }) => json<unknown>('POST', `${sandboxPath(id)}/timeout`, { json: change }),
      trace: (id: string) => json<{ events: StoredTraceEvent[]; metrics: Record<string, unknown> }>('GET', `${sandboxPath(id)}/trace`),
    },
    specs: {
      put: (yaml: string) => json<SpecRecord>('POST', '/v1/specs', { body: yaml, headers: { 'content-type': 'application/x-yaml' } }),
      get: (id: string, version?: number) => json<SpecRecord>('GET', `/v1/specs/${seg(id)}`, { query: { version } }),
      list: () => json<{ items: SpecRecord[]; count: number }>('GET', '/v1/specs'),
      delete: (id: string) => json<{ id: string; deleted: boolean }>('DELETE', `/v1/specs/${seg(id)}`),
    },
    agents: {
      /** Uploads a .tar.gz bundle (bytes or a stream of them) as a new version of `metadata.name`. */
      upload: async (bundle: Bytes, metadata: AgentMetadata) => {
        const form = new FormData();
        form.append('metadata', JSON.stringify(metadata));
        form.append('bundle', new Blob([await toBytes(bundle)], { type: 'application/gzip' }), 'bundle.tar.gz');
        return json<AgentSnapshot>('POST', '/v1/agents', { body: form });
      },
      list: (query: PageQuery = {}) => json<Page<AgentSnapshot>>('GET', '/v1/agents', { query }),
      latest: (name: string) => json<AgentSnapshot>('GET', `/v1/agents/${seg(name)}/latest`),
      byTag: (name: string, tag: string) => json<AgentSnapshot>('GET', `/v1/agents/${seg(name)}/tags/${seg(tag)}`),
      version: (name: string, version: number) => json<AgentSnapshot>('GET', `/v1/agents/${seg(name)}/versions/${version}`),
      versions: (name: string, query: PageQuery = {}) => json<Page<AgentSnapshot>>('GET', `/v1/agents/${seg(name)}/versions`, { query }),
      snapshot: (id: string) => json<AgentSnapshot>('GET', `/v1/snapshots/${seg(id)}`),
      deleteSnapshot: (id: string) => json<{ id: string; deleted: boolean }>('DELETE', `/v1/snapshots/${seg(id)}`),
    },
    experiments: {
      create: (body: { name: string; spec_id: string; secrets?: Record<string, string> }) => json<Experiment>('POST', '/v1/experiments', { json: body }),
      run: (id: string) => json<unknown>('POST', `/v1/experiments/${seg(id)}/run`),
      get: (id: string) => json<Experiment>('GET', `/v1/experiments/${seg(id)}`),
      list: (query: PageQuery = {}) => json<Page<Experiment>>('GET', '/v1/experiments', { query }),
      cancel: (id: string) => json<unknown>('POST', `/v1/experiments/${seg(id)}/cancel`),
      compare: (baselineId: string, candidateId: string) => json<Comparison>('POST', '/v1/experiments/compare', { json: { baseline_id: baselineId, candidate_id: candidateId } }),
      metrics: (id: string) => json<Record<string, unknown>>('GET', `/v1/metrics/experiments/${seg(id)}`),
      scenarios: (experimentId: string, query: PageQuery & { status?: string; scenario_id?: string } = {}) =>
        json<Page<Record<string, unknown>>>('GET', '/v1/scenarios', { query: { experiment_id: experimentId, ...query } }),
      /** The full bundle: parsed JSON, or the NDJSON text. */
      export: (id: string, format: 'json' | 'ndjson' = 'json') =>
        format === 'json' ? json<unknown>('GET', `/v1/experiments/${seg(id)}/export`, { query: { format } }) : text('GET', `/v1/experiments/${seg(id)}/export`, { query: { format } }),
    },
    traces: {
      /** Posts events as they are (no batching; see Tracer for that). */
      ingest: (events: Partial<TraceEventBody>[]) => json<{ ingested: number }>('POST', '/v1/traces', { json: { events } }),
      list: (filters: TraceFilters = {}) => json<Page<StoredTraceEvent>>('GET', '/v1/traces', { query: filters }),
    },
  };
}

// A copy backed by a plain ArrayBuffer, which is what Blob accepts.
async function toBytes(input: Bytes): Promise<Uint8Array<ArrayBuffer>> {
  if (input instanceof Uint8Array) return new Uint8Array(input);
  const chunks: Buffer[] = [];
  for await (const chunk of input) chunks.push(typeof chunk === 'string' ? Buffer.from(chunk) : Buffer.from(chunk));
  return new Uint8Array(Buffer.concat(chunks));
}
