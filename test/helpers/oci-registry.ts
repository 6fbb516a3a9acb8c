/**
 * A real OCI registry for tests (Debian's `docker-registry`, distribution 2.8, on the loopback),
 * a pusher that uploads blobs and manifests to it over the distribution API, and a small ustar
 * writer of its own (independent of the node-tar the code under test reads with) that can write
 * what `tar` refuses to: `..` paths, absolute paths, files through symbolic links.
 */
import { type ChildProcess, execFileSync, spawn } from 'node:child_process';
import { createHash, createPrivateKey, randomUUID, sign as cryptoSign, X509Certificate } from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { gzipSync } from 'node:zlib';
import { own } from './owned-processes.ts';
import { freePort } from './ports.ts';

export const REGISTRY_BINARY = '/usr/bin/docker-registry';

export interface TestRegistry {
  /** `127.0.0.1:<port>` */
  host: string;
  /** The registry's filesystem storage (blobs under docker/registry/v2/blobs/sha256/). */
  storage: string;
  /** Its access log so far. */
  log(): string;
  stop(): Promise<void>;
}

/** A bcrypt hash for htpasswd (the registry reads only bcrypt), made by python3's crypt (libxcrypt). */
function bcrypt(password: string): string {
  return execFileSync('python3', ['-W', 'ignore', '-c', 'import crypt,sys; print(crypt.crypt(sys.argv[1], crypt.mksalt(crypt.METHOD_BLOWFISH)))', password], {
    encoding: 'utf8',
  }).trim();
}

/**
 * Starts a registry on a free loopback port. `basic`: it asks for that login (htpasswd);
 * `token`: it asks for Bearer tokens of that token service (see `startTokenService`).
 */
export async function startRegistry(auth: { basic?: { name: string; password: string }; token?: TokenService } = {}): Promise<TestRegistry> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'svc-registry-'));
  const port = await freePort();
  const storage = path.join(dir, 'storage');
  let authConfig = '';
  if (auth.basic) {
    fs.writeFileSync(path.join(dir, 'htpasswd'), `${auth.basic.name}:${bcrypt(auth.basic.password)}\n`);
    authConfig = `auth:\n  htpasswd:\n    realm: test\n    path: ${path.join(dir, 'htpasswd')}\n`;
  } else if (auth.token) {
    authConfig = `auth:\n  token:\n    realm: ${auth.token.realm}\n    service: ${TOKEN_AUDIENCE}\n    issuer: ${TOKEN_ISSUER}\n    rootcertbundle: ${auth.token.certificate}\n`;
  }
  fs.writeFileSync(
    path.join(dir, 'config.yml'),
    `version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: ${storage}\nhttp:\n  addr: 127.0.0.1:${port}\n  secret: test-secret\n${authConfig}`,
  );
  let output = '';
  const child: ChildProcess = own(spawn(REGISTRY_BINARY, ['serve', path.join(dir, 'config.yml')], { stdio: ['ignore', 'pipe', 'pipe'] }));
  child.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString('utf8')));
  child.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString('utf8')));
  const host = `127.0.0.1:${port}`;
  for (let waited = 0; ; waited += 100) {
    const up = await fetch(`http://${host}/v2/`).then(
      (r) => r.status === 200 || r.status === 401,
      () => false,
    );
    if (up) break;
    if (waited > 15_000 || child.exitCode !== null) throw new Error(`docker-registry did not start: ${output}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    host,
    storage,
    log: () => output,
    stop: async () => {
      if (child.exitCode === null) {
        child.kill('SIGTERM');
        await new Promise((r) => child.once('exit', r));
      }
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

const TOKEN_ISSUER = 'svc-test-issuer';
const TOKEN_AUDIENCE = 'svc-test-registry';

export interface TokenService {
  /** The token endpoint, `http://127.0.0.1:<port>/token`, the registries' realm. */
  realm: string;
  /** The PEM certificate the registry trusts tokens signed by. */
  certificate: string;
  /** A token for `scope` (`repository:NAME:pull,push`), as `user` gets it. */
  token(scope: string): string;
  stop(): Promise<void>;
}

/**
 * A Docker-style token service: `GET /token?service=&scope=` answers `{token}`, a JWT signed
 * (RS256) with a self-signed certificate carried in its `x5c` header. With `user`'s Basic login
 * the token grants the scope asked for; anonymous or with no login it grants nothing; a wrong
 * login is a 401.
 */
export async function startTokenService(user: { name: string; password: string }): Promise<TokenService> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'svc-token-'));
  const keyFile = path.join(dir, 'key.pem');
  const certificate = path.join(dir, 'cert.pem');
  execFileSync(
    'openssl',
    ['req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-keyout', keyFile, '-out', certificate, '-days', '1', '-subj', '/CN=svc-test-token'],
    { stdio: 'ignore' },
  );
  const key = createPrivateKey(fs.readFileSync(keyFile));
  const der = new X509Certificate(fs.readFileSync(certificate)).raw.toString('base64');
  const b64url = (value: object | Buffer): string => (Buffer.isBuffer(value) ? value : Buffer.from(JSON.stringify(value))).toString('base64url');
  const sign = (subject: string, scope: string | null): string => {
    const now = Math.floor(Date.now() / 1000);
    const [type, name, actions] = scope ? scope.split(':') : [];
    const access = subject && type && name && actions ? [{ type, name, actions: actions.split(',') }] : [];
    const unsigned = `${b64url({ typ: 'JWT', alg: 'RS256', x5c: [der] })}.${b64url({ iss: TOKEN_ISSUER, sub: subject, aud: TOKEN_AUDIENCE, exp: now + 600, nbf: now - 60, iat: now, jti: randomUUID(), access })}`;
    return `${unsigned}.${b64url(cryptoSign('sha256', Buffer.from(unsigned), key))}`;
  };
  const server = http.createServer((req, res) => {
    const url = new URL(req.url ?? '/', 'http://token');
    const login = /^Basic (.+)$/.exec(req.headers.authorization ?? '')?.[1];
    const [name, password] = login ? Buffer.from(login, 'base64').toString('utf8').split(':') : [];
    if (login && (name !== user.name || password !== user.password)) {
      res.writeHead(401).end('{"details": "wrong login"}');
      return;
    }
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ token: sign(login ? user.name : '', url.searchParams.get('scope')) }));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  return {
    realm: `http://127.0.0.1:${port}/token`,
    certificate,
    token: (scope) => sign(user.name, scope),
    stop: async () => {
      await new Promise((r) => server.close(r));
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

export interface TarEntry {
  path: string;
  type?: 'file' | 'dir' | 'symlink' | 'link' | 'fifo';
  body?: string | Buffer;
  linkpath?: string;
  mode?: number;
  uid?: number;
  gid?: number;
  /** Seconds since the epoch. */
  mtime?: number;
}

const TYPE_FLAGS = { file: '0', link: '1', symlink: '2', dir: '5', fifo: '6' } as const;

function octal(value: number, width: number): string {
  return `${value.toString(8).padStart(width - 1, '0')}\0`;
}

/** A ustar archive of exactly these entries, in this order (paths of up to 100 bytes). */
export function tarOf(entries: TarEntry[]): Buffer {
  const blocks: Buffer[] = [];
  for (const e of entries) {
    const type = e.type ?? 'file';
    const body = type === 'file' ? Buffer.from(e.body ?? '') : Buffer.alloc(0);
    const header = Buffer.alloc(512);
    header.write(e.path, 0, 100, 'utf8');
    header.write(octal(e.mode ?? (type === 'dir' ? 0o755 : 0o644), 8), 100, 'ascii');
    header.write(octal(e.uid ?? 0, 8), 108, 'ascii');
    header.write(octal(e.gid ?? 0, 8), 116, 'ascii');
    header.write(octal(body.length, 12), 124, 'ascii');
    header.write(octal(e.mtime ?? 1_700_000_000, 12), 136, 'ascii');
    header.write(TYPE_FLAGS[type], 156, 'ascii');
    header.write(e.linkpath ?? '', 157, 100, 'utf8');
    header.write('ustar\0' + '00', 257, 'ascii');
    header.fill(' ', 148, 156);
    const sum = header.reduce((a, b) => a + b, 0);
    header.write(`${sum.toString(8).padStart(6, '0')}\0 `, 148, 'ascii');
    blocks.push(header, body, Buffer.alloc((512 - (body.length % 512)) % 512));
  }
  blocks.push(Buffer.alloc(1024));
  return Buffer.concat(blocks);
}

export const sha256 = (bytes: Buffer): string => `sha256:${createHash('sha256').update(bytes).digest('hex')}`;

export type Compression = 'gzip' | 'zstd' | 'none';

/** A layer blob of an uncompressed tar, and the media type it is pushed under. */
export function layerBlob(tar: Buffer, compression: Compression): { bytes: Buffer; mediaType: string } {
  if (compression === 'gzip') return { bytes: gzipSync(tar), mediaType: 'application/vnd.oci.image.layer.v1.tar+gzip' };
  if (compression === 'zstd') return { bytes: execFileSync('zstd', ['-q', '-c'], { input: tar }), mediaType: 'application/vnd.oci.image.layer.v1.tar+zstd' };
  return { bytes: tar, mediaType: 'application/vnd.oci.image.layer.v1.tar' };
}

export interface ImageParts {
  config: Buffer;
  manifest: Buffer;
  /** Every blob by digest: the config and the layers. */
  blobs: Map<string, Buffer>;
}

/**
 * An OCI image of these layers (uncompressed tars), each compressed as `compression` says (one
 * for all, or one per layer), with a config carrying `run` (Env, Entrypoint, Cmd, WorkingDir, User).
 */
export function buildImage(layers: Buffer[], run: Record<string, unknown> = {}, compression: Compression | Compression[] = 'gzip', arch = 'amd64'): ImageParts {
  const config = Buffer.from(JSON.stringify({ architecture: arch, os: 'linux', config: run, rootfs: { type: 'layers', diff_ids: layers.map(sha256) } }));
  const blobs = new Map<string, Buffer>([[sha256(config), config]]);
  const layerDescriptors = layers.map((tar, i) => {
    const blob = layerBlob(tar, Array.isArray(compression) ? compression[i]! : compression);
    blobs.set(sha256(blob.bytes), blob.bytes);
    return { mediaType: blob.mediaType, digest: sha256(blob.bytes), size: blob.bytes.length };
  });
  const manifest = Buffer.from(
    JSON.stringify({
      schemaVersion: 2,
      mediaType: 'application/vnd.oci.image.manifest.v1+json',
      config: { mediaType: 'application/vnd.oci.image.config.v1+json', digest: sha256(config), size: config.length },
      layers: layerDescriptors,
    }),
  );
  return { config, manifest, blobs };
}

/** An OCI index of manifests, one per platform architecture. */
export function buildIndex(manifests: Array<{ manifest: Buffer; arch: string }>): Buffer {
  return Buffer.from(
    JSON.stringify({
      schemaVersion: 2,
      mediaType: 'application/vnd.oci.image.index.v1+json',
      manifests: manifests.map((m) => ({
        mediaType: 'application/vnd.oci.image.manifest.v1+json',
        digest: sha256(m.manifest),
        size: m.manifest.length,
        platform: { os: 'linux', architecture: m.arch },
      })),
    }),
  );
}

/** Pushes blobs (a monolithic upload each: POST, then PUT with the digest) and a manifest under `reference` (a tag or a digest). */
export async function push(
  registry: TestRegistry,
  repository: string,
  reference: string,
  parts: { blobs: Map<string, Buffer>; manifest: Buffer; mediaType?: string },
  authorization?: string,
): Promise<string> {
  const base = `http://${registry.host}/v2/${repository}`;
  const headers: Record<string, string> = authorization ? { authorization } : {};
  for (const [digest, bytes] of parts.blobs) {
    const started = await fetch(`${base}/blobs/uploads/`, { method: 'POST', headers });
    if (started.status !== 202) throw new Error(`blob upload of ${repository}: ${started.status} ${await started.text()}`);
    const location = new URL(started.headers.get('location')!, `http://${registry.host}`);
    location.searchParams.set('digest', digest);
    const put = await fetch(location, { method: 'PUT', headers: { ...headers, 'content-type': 'application/octet-stream' }, body: new Uint8Array(bytes) });
    if (put.status !== 201) throw new Error(`blob ${digest} of ${repository}: ${put.status} ${await put.text()}`);
  }
  const mediaType = parts.mediaType ?? (JSON.parse(parts.manifest.toString('utf8')) as { mediaType: string }).mediaType;
  const res = await fetch(`${base}/manifests/${reference}`, {
    method: 'PUT',
    headers: { ...headers, 'content-type': mediaType },
    body: new Uint8Array(parts.manifest),
  });
  if (res.status !== 201) throw new Error(`manifest ${repository}:${reference}: ${res.status} ${await res.text()}`);
  return sha256(parts.manifest);
}

/** Where the registry keeps a blob's bytes. */
export function storedBlob(registry: TestRegistry, digest: string): string {
  const hex = digest.slice('sha256:'.length);
  return path.join(registry.storage, 'docker/registry/v2/blobs/sha256', hex.slice(0, 2), hex, 'data');
}

/** How many times the registry served GET requests for this blob (from its access log). */
export function blobGets(registry: TestRegistry, digest: string): number {
  return registry
    .log()
    .split('\n')
    .filter((line) => line.includes(`"GET /v2/`) && line.includes(`/blobs/${digest} `) && / 200 /.test(line)).length;
}

/** /bin/sh and the libraries it links, with their directories: enough of a root filesystem to boot and run a command. */
export function shellLayer(): TarEntry[] {
  const sh = fs.realpathSync('/bin/sh');
  const libs = execFileSync('ldd', [sh], { encoding: 'utf8' }).match(/\/\S+/g) ?? [];
  const dirs = new Set<string>(['bin/', 'etc/']);
  const files: TarEntry[] = [];
  for (const file of [sh, ...libs]) {
    const parts = path.dirname(file).slice(1).split('/');
    for (let i = 1; i <= parts.length; i++) dirs.add(`${parts.slice(0, i).join('/')}/`);
    files.push({ path: file.slice(1), body: fs.readFileSync(file), mode: 0o755 });
  }
  const layer: TarEntry[] = [...[...dirs].map((d) => ({ path: d, type: 'dir' as const })), ...files];
  if (sh !== '/bin/sh') layer.push({ path: 'bin/sh', type: 'symlink', linkpath: sh });
  return layer;
}
