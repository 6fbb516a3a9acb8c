/**
 * A client of the OCI distribution API (Docker Hub, GHCR, a `docker-registry`, ...), over
 * Node's fetch: it resolves a reference to an image manifest for this host's platform and
 * downloads blobs into the blob cache, each checked against its digest as it streams.
 *
 * References read as Docker reads them: `python:3.12` is `docker.io/library/python:3.12`,
 * pulled from registry-1.docker.io (or SVC_REGISTRY_MIRROR); a first component with a `.` or a
 * `:`, or `localhost`, is a registry (`127.0.0.1:5000/tools:1`, `ghcr.io/acme/tools:1`); a
 * `@sha256:...` digest pins the manifest (and wins over a tag).
 *
 * Auth: a 401's WWW-Authenticate challenge is answered: `Bearer` with a token from its realm
 * (asked with the host's SVC_REGISTRY_AUTH credentials, when it has some, else anonymously),
 * `Basic` with those credentials. Registries are reached over HTTPS, over plain HTTP only when
 * SVC_REGISTRY_INSECURE lists them; redirects (blobs live on CDNs) are followed by hand so that
 * credentials never go to another host and HTTPS never turns into plain HTTP.
 */
import { Readable } from 'node:stream';
import { type BlobCache, choosePlatform, type Descriptor, DIGEST, MAX_MANIFEST_BYTES, MEDIA_TYPES, parseImageDocument, sha256Digest } from './oci.ts';

export interface RegistryCredentials {
  username: string;
  password: string;
}

/** The settings a pull reads (a `Config` has them all). */
export interface RegistrySettings {
  /** Credentials by registry host (`docker.io` for Docker Hub). */
  registryAuth: Record<string, RegistryCredentials> | null;
  /** Hosts (`host[:port]`) reached over plain HTTP. */
  registryInsecure: string[] | null;
  /** The host Docker Hub names are pulled from instead of registry-1.docker.io. */
  registryMirror: string | null;
}

export interface ImageReference {
  /** `docker.io` for Docker Hub, else the host[:port] as written. */
  registry: string;
  repository: string;
  tag: string | null;
  digest: string | null;
}

export interface ResolvedImage {
  /** What the reference resolved to: the index's digest for a multi-platform image. */
  digest: string;
  /** The digest of the image manifest for this platform. */
  manifestDigest: string;
  config: Descriptor;
  layers: Descriptor[];
}

const DOCKER_HUB = 'docker.io';
const DOCKER_HUB_ALIASES = new Set(['docker.io', 'index.docker.io', 'registry-1.docker.io', 'registry.hub.docker.com']);
const REPOSITORY_PART = /^[a-z0-9]+((\.|_|__|-+)[a-z0-9]+)*$/;
const TAG = /^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/;
const HOST = /^([A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*|\[[0-9a-fA-F:]+\])(:[0-9]{1,5})?$/;
/** A registry gets this long to answer, and a body this long between two chunks. */
const IDLE_TIMEOUT_MS = 60_000;

/** The registry host a credential or an insecure entry names: Docker Hub's aliases are `docker.io`; a URL's scheme and path go. */
export function registryHostKey(value: string): string {
  const host = value
    .trim()
    .replace(/^[a-z]+:\/\//i, '')
    .replace(/\/.*$/, '')
    .toLowerCase();
  return DOCKER_HUB_ALIASES.has(host) ? DOCKER_HUB : host;
}

/** Splits a reference into registry, repository, tag and digest; throws on a malformed one. */
export function parseImageReference(reference: string): ImageReference {
  const bad = (why: string): Error => new Error(`invalid image reference ${JSON.stringify(reference)}: ${why}`);
  let rest = reference.trim();
  let digest: string | null = null;
  const at = rest.indexOf('@');
  if (at !== -1) {
    digest = rest.slice(at + 1);
    rest = rest.slice(0, at);
    if (!DIGEST.test(digest)) throw bad('the digest must be sha256: and 64 hex digits');
  }
  const slash = rest.indexOf('/');
  const first = slash === -1 ? '' : rest.slice(0, slash);
  const hasRegistry = first.includes('.') || first.includes(':') || first === 'localhost';
  const registry = hasRegistry ? registryHostKey(first) : DOCKER_HUB;
  if (hasRegistry && !HOST.test(first)) throw bad(`"${first}" is not a registry host`);
  let repository = hasRegistry ? rest.slice(slash + 1) : rest;
  let tag: string | null = null;
  const colon = repository.lastIndexOf(':');
  if (colon !== -1) {
    tag = repository.slice(colon + 1);
    repository = repository.slice(0, colon);
    if (!TAG.test(tag)) throw bad(`"${tag}" is not a tag`);
  }
  if (!repository?.split('/').every((p) => REPOSITORY_PART.test(p))) throw bad('the repository name must be lowercase letters, digits and separators');
  if (registry === DOCKER_HUB && !repository.includes('/')) repository = `library/${repository}`;
  if (!tag && !digest) tag = 'latest';
  return { registry, repository, tag, digest };
}

/** Keeps a request alive while it makes progress: aborted after IDLE_TIMEOUT_MS without any. */
class IdleDeadline {
  private readonly controller = new AbortController();
  private timer: NodeJS.Timeout;
  readonly signal = this.controller.signal;

  constructor() {
    this.timer = setTimeout(() => this.controller.abort(new Error(`no answer for ${IDLE_TIMEOUT_MS / 1000} s`)), IDLE_TIMEOUT_MS);
  }

  touch(): void {
    this.timer.refresh();
  }

  clear(): void {
    clearTimeout(this.timer);
  }
}

export class RegistryClient {
  private readonly insecure: Set<string>;
  private readonly credentialsByHost: Map<string, RegistryCredentials>;
  /** The Authorization a registry accepted, by host and repository (a Bearer token is scoped to a repository). */
  private readonly authorizations = new Map<string, string>();

  constructor(private readonly settings: RegistrySettings) {
    this.insecure = new Set((settings.registryInsecure ?? []).map(registryHostKey));
    this.credentialsByHost = new Map(Object.entries(settings.registryAuth ?? {}).map(([host, credentials]) => [registryHostKey(host), credentials]));
  }

  /** The host a reference is pulled from. */
  host(ref: ImageReference): string {
    return ref.registry === DOCKER_HUB ? (this.settings.registryMirror ?? 'registry-1.docker.io') : ref.registry;
  }

  /** `host/repository[:tag][@digest]`, as pulled. */
  describe(ref: ImageReference): string {
    return `${this.host(ref)}/${ref.repository}${ref.tag && !ref.digest ? `:${ref.tag}` : ''}${ref.digest ? `@${ref.digest}` : ''}`;
  }

  /** The image manifest of `ref` for this host's platform, every manifest checked against its digest. */
  async resolve(ref: ImageReference): Promise<ResolvedImage> {
    const what = this.describe(ref);
    const top = await this.manifest(ref, ref.digest ?? ref.tag!, what);
    if (top.doc.kind === 'manifest') return { digest: top.digest, manifestDigest: top.digest, config: top.doc.config, layers: top.doc.layers };
    const chosen = choosePlatform(top.doc.manifests, what);
    const platform = await this.manifest(ref, chosen.digest, `${what} (${chosen.digest})`);
    if (platform.doc.kind !== 'manifest') throw new Error(`${what}: the index's entry ${chosen.digest} is another index`);
    return { digest: top.digest, manifestDigest: platform.digest, config: platform.doc.config, layers: platform.doc.layers };
  }

  private async manifest(ref: ImageReference, reference: string, what: string): Promise<{ digest: string; doc: ReturnType<typeof parseImageDocument> }> {
    const deadline = new IdleDeadline();
    try {
      const res = await this.get(ref, `manifests/${reference}`, deadline, Object.values(MEDIA_TYPES).join(', '));
      if (res.status === 404) throw new Error(`${what}: no such image in ${this.host(ref)} (${await registryErrors(res)})`);
      if (res.status !== 200) throw new Error(`${what}: the registry answered ${res.status} (${await registryErrors(res)})`);
      const bytes = await readLimited(res, MAX_MANIFEST_BYTES, deadline, `${what}: the manifest`);
      const digest = sha256Digest(bytes);
      const claimed = res.headers.get('docker-content-digest');
      if (DIGEST.test(reference) && digest !== reference) throw new Error(`${what}: wrong digest: asked for ${reference}, the manifest served is ${digest}`);
      if (claimed && DIGEST.test(claimed) && claimed !== digest)
        throw new Error(`${what}: wrong digest: the registry says ${claimed}, the manifest served is ${digest}`);
      return { digest, doc: parseImageDocument(bytes, res.headers.get('content-type') ?? undefined, what) };
    } finally {
      deadline.clear();
    }
  }

  /** Downloads a blob into `cache` unless it is there; true when it was downloaded. */
  async fetchBlob(ref: ImageReference, blob: Descriptor, cache: BlobCache, what: string): Promise<boolean> {
    if (cache.has(blob.digest)) return false;
    const deadline = new IdleDeadline();
    try {
      const res = await this.get(ref, `blobs/${blob.digest}`, deadline);
      if (res.status !== 200) throw new Error(`${what}: blob ${blob.digest}: the registry answered ${res.status} (${await registryErrors(res)})`);
      const chunks = res.body as unknown as AsyncIterable<Uint8Array>;
      const body = Readable.from(
        (async function* () {
          for await (const chunk of chunks) {
            deadline.touch();
            yield Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
          }
        })(),
      );
      await cache.write(body, blob, what);
      return true;
    } catch (err) {
      throw deadline.signal.aborted ? new Error(`${what}: blob ${blob.digest}: ${(deadline.signal.reason as Error).message}`) : err;
    } finally {
      deadline.clear();
    }
  }

  /** GET `/v2/<repository>/<path>`, answering one auth challenge. */
  private async get(ref: ImageReference, urlPath: string, deadline: IdleDeadline, accept?: string): Promise<Response> {
    const host = this.host(ref);
    const url = `${this.scheme(host)}://${host}/v2/${ref.repository}/${urlPath}`;
    const key = `${host}/${ref.repository}`;
    let res = await this.send(url, deadline, accept, this.authorizations.get(key));
    if (res.status !== 401) return res;
    const challenge = res.headers.get('www-authenticate') ?? '';
    await res.body?.cancel();
    const authorization = await this.authorize(host, ref.repository, challenge, deadline);
    res = await this.send(url, deadline, accept, authorization);
    if (res.status === 401 || res.status === 403) {
      await res.body?.cancel();
      throw this.refused(host, ref.repository);
    }
    this.authorizations.set(key, authorization);
    return res;
  }

  private scheme(host: string): 'http' | 'https' {
    return this.insecure.has(registryHostKey(host)) ? 'http' : 'https';
  }

  private credentials(host: string): RegistryCredentials | undefined {
    return this.credentialsByHost.get(registryHostKey(host));
  }

  private refused(host: string, repository: string): Error {
    return this.credentials(host)
      ? new Error(`${host} refused the credentials SVC_REGISTRY_AUTH gives for it (repository ${repository})`)
      : new Error(
          `${host} refused access to ${repository} without credentials (SVC_REGISTRY_AUTH has none for ${registryHostKey(host)}; the repository may also not exist)`,
        );
  }

  /** The Authorization header answering a WWW-Authenticate challenge. */
  private async authorize(host: string, repository: string, challenge: string, deadline: IdleDeadline): Promise<string> {
    const scheme = challenge.split(/\s/, 1)[0]!.toLowerCase();
    const params = Object.fromEntries([...challenge.matchAll(/([A-Za-z_]+)="([^"]*)"/g)].map((m) => [m[1]!.toLowerCase(), m[2]!]));
    const credentials = this.credentials(host);
    const basic = credentials ? `Basic ${Buffer.from(`${credentials.username}:${credentials.password}`).toString('base64')}` : undefined;
    if (scheme === 'basic') {
      if (!basic) throw this.refused(host, repository);
      return basic;
    }
    if (scheme !== 'bearer' || !params.realm)
      throw new Error(`${host} asks for an authentication it did not describe, or that is not supported: ${JSON.stringify(challenge)}`);
    const realm = new URL(params.realm);
    if (realm.protocol !== 'https:' && !(realm.protocol === 'http:' && this.insecure.has(registryHostKey(realm.host)))) {
      throw new Error(`${host}'s token service ${realm.origin} is not HTTPS (list ${realm.host} in SVC_REGISTRY_INSECURE to allow it)`);
    }
    if (params.service) realm.searchParams.set('service', params.service);
    realm.searchParams.set('scope', params.scope ?? `repository:${repository}:pull`);
    const res = await this.send(realm.toString(), deadline, 'application/json', basic);
    if (res.status === 401 || res.status === 403) {
      await res.body?.cancel();
      throw this.refused(host, repository);
    }
    if (res.status !== 200) throw new Error(`${host}'s token service ${realm.origin} answered ${res.status}`);
    const body = JSON.parse((await readLimited(res, 1024 * 1024, deadline, `${host}'s token`)).toString('utf8')) as { token?: unknown; access_token?: unknown };
    const token = typeof body.token === 'string' ? body.token : body.access_token;
    if (typeof token !== 'string' || !token) throw new Error(`${host}'s token service ${realm.origin} gave no token`);
    return `Bearer ${token}`;
  }

  /** One request, following redirects by hand: the Authorization goes to the first host only, and never over a downgrade to plain HTTP. */
  private async send(url: string, deadline: IdleDeadline, accept?: string, authorization?: string): Promise<Response> {
    let current = new URL(url);
    const origin = current.origin;
    for (let hop = 0; hop < 6; hop++) {
      const headers: Record<string, string> = { 'user-agent': 'svc-image-pull' };
      if (accept) headers.accept = accept;
      if (authorization && current.origin === origin) headers.authorization = authorization;
      let res: Response;
      try {
        res = await fetch(current, { headers, redirect: 'manual', signal: deadline.signal });
      } catch (err) {
        throw unreachable(current, err as Error, deadline);
      }
      deadline.touch();
      if (![301, 302, 303, 307, 308].includes(res.status)) return res;
      await res.body?.cancel();
      const location = res.headers.get('location');
      if (!location) throw new Error(`${current.host} answered ${res.status} without a Location`);
      const next = new URL(location, current);
      if (next.protocol !== 'https:' && !(next.protocol === 'http:' && (current.protocol === 'http:' || this.insecure.has(registryHostKey(next.host))))) {
        throw new Error(`${current.host} redirected to ${next.origin}, which is not HTTPS`);
      }
      current = next;
    }
    throw new Error(`${new URL(url).host}: too many redirects`);
  }
}

function unreachable(url: URL, err: Error, deadline: IdleDeadline): Error {
  if (deadline.signal.aborted) return new Error(`registry ${url.host}: ${(deadline.signal.reason as Error).message}`);
  const cause = (err.cause as Error | undefined)?.message ?? err.message;
  const hint =
    url.protocol === 'https:' && /wrong version number|packet length too long|EPROTO/i.test(cause)
      ? ' (a plain-HTTP registry must be listed in SVC_REGISTRY_INSECURE)'
      : '';
  return new Error(`cannot reach registry ${url.host}: ${cause}${hint}`);
}

/** A response body of at most `max` bytes. */
async function readLimited(res: Response, max: number, deadline: IdleDeadline, what: string): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let total = 0;
  for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
    total += chunk.length;
    if (total > max) throw new Error(`${what} is larger than ${max} bytes`);
    chunks.push(Buffer.from(chunk));
    deadline.touch();
  }
  return Buffer.concat(chunks);
}

/** The codes and messages of a registry's error body (`{"errors": [{"code", "message"}]}`). */
async function registryErrors(res: Response): Promise<string> {
  const text = await res.text().catch(() => '');
  try {
    const errors = (JSON.parse(text) as { errors?: Array<{ code?: string; message?: string }> }).errors ?? [];
    if (errors.length) return errors.map((e) => [e.code, e.message].filter(Boolean).join(': ')).join('; ');
  } catch {
    /* not JSON */
  }
  return text.slice(0, 200).trim() || 'no detail';
}
