/**
 * The local image store: root filesystems the `local` runtime mounts read-only as a sandbox's /.
 *
 *   <dataDir>/images/<dir>/rootfs        the root filesystem
 *   <dataDir>/images/<dir>/image.json    { name, source, importedAt, bytes, entrypoint?, digest?,
 *                                          manifestDigest?, id?, config?, layers? }
 *   <dataDir>/images/blobs/sha256/<hex>  layers (and configs) pulled or imported, once per content
 *
 * `entrypoint` (exec form) is what an `image` agent runs: `--entrypoint` at import, else the
 * image config's Entrypoint followed by its Cmd. Images from a registry or an image archive also
 * record their manifest `digest` (what the reference resolved to; for a multi-platform image the
 * index's, with `manifestDigest` this platform's), `id` (the config's digest), `config` (env,
 * entrypoint, cmd, workdir, user, from the image config) and `layers` (blob digests, oldest first).
 *
 * (`ImageStore` and the free functions take the images directory, `<dataDir>/images`.)
 *
 * A spec's image reference maps to a store name by `normalizeReference`, as Docker reads
 * references: `docker.io/` and `library/` are dropped and a missing tag means `:latest`, so
 * `python:3.12-slim`, `library/python:3.12-slim` and `docker.io/library/python:3.12-slim` are
 * all `python:3.12-slim`, and `debian` is `debian:latest`. The directory is the name with every
 * `/` written as `+` (a character references cannot contain, so two names never share one):
 * `ghcr.io/acme/tools:1` lives in `images/ghcr.io+acme+tools:1/`.
 *
 * Sources:
 *   - a registry (`pullImage`, `ensureImage`; registry.ts), layers applied by oci-layers.ts;
 *   - an image archive, `docker save` or an OCI layout, directory or tarball (oci-archive.ts);
 *   - a directory (copied with `cp -a`) or a tarball of a root filesystem such as `docker export`
 *     writes (plain, gzip, bzip2, xz or zstd; unpacked with GNU `tar`, owners kept).
 *     `infra/images/debian-rootfs.sh` builds a Debian one with debootstrap.
 * Every import is staged and renamed into place, so a reader never sees half an image.
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { SETTINGS } from '../../kernel/config.ts';
import { isImageArchive, readImageArchive } from './oci-archive.ts';
import { applyLayers } from './oci-layers.ts';
import { BlobCache, type Descriptor, type ImageRunConfig, MAX_CONFIG_BYTES, parseImageConfig } from './oci.ts';
import { parseImageReference, RegistryClient, type RegistrySettings } from './registry.ts';

export interface ImageInfo {
  name: string;
  rootfs: string;
  /** Where it came from: the directory or tarball imported, or the reference pulled (`host/repository:tag`). */
  source: string;
  importedAt: string;
  bytes: number;
  /** The image's agent command (exec form), for specs whose agent is `type: image`. */
  entrypoint?: string[];
  /** The manifest digest the reference resolved to (an index's, for a multi-platform image). */
  digest?: string;
  /** The image manifest of this platform. */
  manifestDigest?: string;
  /** The image config's digest (Docker's image ID). */
  id?: string;
  config?: ImageRunConfig;
  layers?: string[];
}

/** What pulls and imports read of the settings (a `Config` has them all). */
export type PullSettings = RegistrySettings & { imageMaxBytes: number };

/** How long a failed pull of a reference is not tried again. */
const PULL_RETRY_MS = 30_000;
/** store dir + name -> the last failed pull */
const recentPullFailures = new Map<string, { at: number; message: string }>();

export interface PullResult {
  image: ImageInfo;
  /** Layers downloaded, and layers the blob cache already had. */
  downloaded: number;
  cached: number;
  /** The store already had this manifest: nothing was pulled. */
  upToDate: boolean;
}

/** Metadata of a new image, besides what staging measures. */
export type ImageMeta = Omit<ImageInfo, 'name' | 'rootfs' | 'importedAt' | 'bytes'>;

const REFERENCE = /^[a-z0-9]([a-z0-9._\-/]*[a-z0-9])?(:[0-9]+)?([a-z0-9._\-/]*[a-z0-9])?(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$/;
/** Where the runtime mounts things over the read-only root. */
const MOUNT_POINTS = ['proc', 'dev', 'tmp', 'run', 'workspace', 'agent', 'etc'];
const DEFAULT_MAX_BYTES = SETTINGS.imageMaxBytes.parse(SETTINGS.imageMaxBytes.default!);
/** Pulls under way, by store and name: a second pull of the same image waits for the first. */
const pullsInFlight = new Map<string, Promise<PullResult>>();

/** The store name of an image reference (see the module comment); throws on a malformed one. */
export function normalizeReference(reference: string): string {
  let ref = reference.trim();
  if (!ref || ref.length > 255 || ref.includes('+') || ref.includes('..') || !REFERENCE.test(ref))
    throw new Error(`invalid image reference: ${JSON.stringify(reference)}`);
  ref = ref.replace(/^(index\.)?docker\.io\//, '').replace(/^library\//, '');
  const lastSlash = ref.lastIndexOf('/');
  const namePart = ref.split('@')[0]!;
  const hasTag = namePart.lastIndexOf(':') > lastSlash;
  if (!hasTag && !ref.includes('@')) ref = `${ref}:latest`;
  return ref;
}

function dirName(name: string): string {
  return name.replace(/\//g, '+');
}

/** Whether an archive's image name (a full reference, or a bare tag as OCI layouts write) names `name`. */
function namesImage(name: string): (candidate: string) => boolean {
  const tag = /:([^:/@]+)$/.exec(name.split('@')[0]!)?.[1];
  return (candidate) => {
    try {
      return normalizeReference(candidate) === name || candidate === tag;
    } catch {
      return false;
    }
  };
}

export class ImageStore {
  readonly dir: string;
  readonly blobs: BlobCache;

  /** imagesDir: `<dataDir>/images` */
  constructor(imagesDir: string) {
    this.dir = path.resolve(imagesDir);
    this.blobs = new BlobCache(path.join(this.dir, 'blobs'));
  }

  /** The root filesystem of an image reference, or null when the store does not have it. */
  resolveImage(reference: string): string | null {
    const rootfs = path.join(this.dir, dirName(normalizeReference(reference)), 'rootfs');
    return fs.existsSync(path.join(rootfs, '..', 'image.json')) ? rootfs : null;
  }

  /** The stored image of a reference, or null. */
  async getImage(reference: string): Promise<ImageInfo | null> {
    const dir = path.join(this.dir, dirName(normalizeReference(reference)));
    try {
      const meta = JSON.parse(await fs.promises.readFile(path.join(dir, 'image.json'), 'utf8')) as Omit<ImageInfo, 'rootfs'>;
      return { ...meta, rootfs: path.join(dir, 'rootfs') };
    } catch {
      return null;
    }
  }

  async listImages(): Promise<ImageInfo[]> {
    let entries: string[];
    try {
      entries = await fs.promises.readdir(this.dir);
    } catch {
      return [];
    }
    const images: ImageInfo[] = [];
    for (const entry of entries.sort()) {
      if (entry.startsWith('.') || entry === 'blobs') continue;
      try {
        const meta = JSON.parse(await fs.promises.readFile(path.join(this.dir, entry, 'image.json'), 'utf8')) as Omit<ImageInfo, 'rootfs'>;
        images.push({ ...meta, rootfs: path.join(this.dir, entry, 'rootfs') });
      } catch {
        /* an import in progress or a damaged entry */
      }
    }
    return images;
  }

  /**
   * Imports `source` under `name` (an image reference), replacing an image of that name: an
   * image archive (`docker save`, OCI layout; directory or tarball), or a root filesystem
   * (directory or tarball). `entrypoint` overrides the image config's command.
   */
  async importImage(name: string, source: string, options: { entrypoint?: string[]; maxBytes?: number } = {}): Promise<ImageInfo> {
    const normalized = normalizeReference(name);
    const src = path.resolve(source);
    const stat = await fs.promises.stat(src).catch(() => null);
    if (!stat) throw new Error(`no such directory or tarball: ${source}`);
    const entrypoint = options.entrypoint ? { entrypoint: options.entrypoint } : {};
    if (await isImageArchive(src)) {
      await fs.promises.mkdir(this.dir, { recursive: true });
      const maxBytes = options.maxBytes ?? DEFAULT_MAX_BYTES;
      const archive = await readImageArchive(src, namesImage(normalized), this.blobs, this.dir, maxBytes);
      const meta = { source: src, ...entrypoint, ...(archive.digest ? { digest: archive.digest } : {}) };
      return this.fromLayers(normalized, archive.config, archive.layers, meta, maxBytes);
    }
    return this.stage(normalized, source, async (rootfs) => {
      if (stat.isDirectory()) await run('cp', ['-a', '--', `${src}/.`, `${rootfs}/`]);
      else await run('tar', ['-xf', src, '-C', rootfs, '--numeric-owner', '--same-owner', '--same-permissions', '--exclude=./dev/*', '--exclude=dev/*']);
      return { source: src, ...entrypoint };
    });
  }

  /**
   * Pulls `reference` from its registry (always asking it what the reference is now), unless
   * the store has that manifest already. A pull of an image already being pulled waits for it.
   */
  pullImage(reference: string, settings: PullSettings): Promise<PullResult> {
    return this.once(normalizeReference(reference), () => this.pull(reference, settings));
  }

  /**
   * The stored image of `reference`, pulled first when the store does not have it. A pull that
   * failed is not tried again for PULL_RETRY_MS: a burst of sandboxes of an image no registry
   * has (or with no way to a registry) asks once, not once each.
   */
  async ensureImage(reference: string, settings: PullSettings): Promise<ImageInfo> {
    const stored = await this.getImage(reference);
    if (stored) return stored;
    const key = `${this.dir}\0${normalizeReference(reference)}`;
    const failed = recentPullFailures.get(key);
    if (failed && Date.now() - failed.at < PULL_RETRY_MS)
      throw new Error(`${failed.message} (a pull ${Math.round((Date.now() - failed.at) / 1000)} s ago; tried again ${PULL_RETRY_MS / 1000} s after it)`);
    try {
      const { image } = await this.pullImage(reference, settings);
      recentPullFailures.delete(key);
      return image;
    } catch (err) {
      recentPullFailures.set(key, { at: Date.now(), message: (err as Error).message });
      throw err;
    }
  }

  private once(name: string, pull: () => Promise<PullResult>): Promise<PullResult> {
    const key = `${this.dir}\0${name}`;
    const pending = pullsInFlight.get(key);
    if (pending) return pending;
    const started = pull().finally(() => pullsInFlight.delete(key));
    pullsInFlight.set(key, started);
    return started;
  }

  private async pull(reference: string, settings: PullSettings): Promise<PullResult> {
    const name = normalizeReference(reference);
    const ref = parseImageReference(reference);
    const client = new RegistryClient(settings);
    const what = client.describe(ref);
    const resolved = await client.resolve(ref);
    const existing = await this.getImage(name);
    if (existing?.manifestDigest === resolved.manifestDigest) return { image: existing, downloaded: 0, cached: resolved.layers.length, upToDate: true };
    const packed = resolved.layers.reduce((sum, l) => sum + l.size, 0);
    if (packed > settings.imageMaxBytes)
      throw new Error(`${what}: its layers are ${packed} bytes compressed, more than SVC_IMAGE_MAX_BYTES (${settings.imageMaxBytes})`);
    await client.fetchBlob(ref, resolved.config, this.blobs, `${what}: config`);
    let downloaded = 0;
    for (const layer of resolved.layers) if (await client.fetchBlob(ref, layer, this.blobs, `${what}: layer`)) downloaded++;
    const layers = resolved.layers.map((l) => this.blobs.pathOf(l.digest));
    const image = await this.fromLayers(
      name,
      resolved.config,
      layers,
      { source: what, digest: resolved.digest, manifestDigest: resolved.manifestDigest },
      settings.imageMaxBytes,
    );
    return { image, downloaded, cached: resolved.layers.length - downloaded, upToDate: false };
  }

  /** A new image of `layers` (cached blobs, oldest first) with the run settings of `config`; `meta.entrypoint` overrides its command. */
  private async fromLayers(name: string, config: Descriptor, layers: string[], meta: ImageMeta, maxBytes: number): Promise<ImageInfo> {
    const { run: runConfig, diffIds } = parseImageConfig(
      await this.blobs.readSmall(config.digest, MAX_CONFIG_BYTES, `${meta.source}: config`),
      `${meta.source}: config`,
    );
    if (diffIds.length !== layers.length) throw new Error(`${meta.source}: the manifest has ${layers.length} layers, the image config ${diffIds.length}`);
    const command = [...(runConfig.entrypoint ?? []), ...(runConfig.cmd ?? [])];
    return this.stage(name, meta.source, async (rootfs) => {
      await applyLayers(
        rootfs,
        layers.map((file, i) => ({ file, digest: `sha256:${path.basename(file)}`, diffId: diffIds[i]! })),
        maxBytes,
      );
      return {
        ...(command.length ? { entrypoint: command } : {}),
        ...meta,
        id: config.digest,
        config: runConfig,
        layers: layers.map((f) => `sha256:${path.basename(f)}`),
      };
    });
  }

  /**
   * Stores the root filesystem `dir` as image `name`, replacing an image of that name. `dir` is
   * moved, not copied: it must be on the store's filesystem (the image builder makes it in `dir`).
   */
  async adoptRootfs(name: string, dir: string, meta: ImageMeta): Promise<ImageInfo> {
    return this.stage(normalizeReference(name), meta.source, async (rootfs) => {
      await fs.promises.rmdir(rootfs);
      await fs.promises.rename(dir, rootfs);
      return meta;
    });
  }

  /** Builds an image in a staging directory with `fill`, then renames it into place. */
  private async stage(name: string, what: string, fill: (rootfs: string) => Promise<ImageMeta>): Promise<ImageInfo> {
    await fs.promises.mkdir(this.dir, { recursive: true });
    const staging = path.join(this.dir, `.import-${randomBytes(6).toString('hex')}`);
    const rootfs = path.join(staging, 'rootfs');
    await fs.promises.mkdir(rootfs, { recursive: true });
    try {
      const meta = await fill(rootfs);
      await prepareRoot(rootfs, what);
      const bytes = Number((await run('du', ['-sb', rootfs])).split('\t')[0]) || 0;
      const info = { name, ...meta, importedAt: new Date().toISOString(), bytes };
      await fs.promises.writeFile(path.join(staging, 'image.json'), `${JSON.stringify(info, null, 2)}\n`);
      const target = path.join(this.dir, dirName(name));
      const old = path.join(this.dir, `.old-${randomBytes(6).toString('hex')}`);
      const replaced = await fs.promises.rename(target, old).then(
        () => true,
        () => false,
      );
      await fs.promises.rename(staging, target);
      if (replaced) await fs.promises.rm(old, { recursive: true, force: true });
      return { ...info, rootfs: path.join(target, 'rootfs') };
    } catch (err) {
      await fs.promises.rm(staging, { recursive: true, force: true });
      throw err;
    }
  }

  async removeImage(name: string): Promise<boolean> {
    const target = path.join(this.dir, dirName(normalizeReference(name)));
    if (!fs.existsSync(target)) return false;
    const old = path.join(this.dir, `.old-${randomBytes(6).toString('hex')}`);
    await fs.promises.rename(target, old);
    await fs.promises.rm(old, { recursive: true, force: true });
    return true;
  }
}

/**
 * What the runtime needs of a read-only root: a /bin/sh, its mount points as real directories
 * (a link there, from a hostile image, could aim a mount or the writes below at the host), a
 * world-writable /tmp and an /etc/hosts file.
 */
async function prepareRoot(rootfs: string, what: string): Promise<void> {
  const sh = path.join(rootfs, 'bin/sh');
  if (!fs.existsSync(sh) && !isLink(sh)) throw new Error(`${what} is not a root filesystem: it has no /bin/sh`);
  for (const dir of MOUNT_POINTS) {
    const target = path.join(rootfs, dir);
    const stat = await fs.promises.lstat(target).catch(() => null);
    if (stat?.isDirectory()) continue;
    if (stat) await fs.promises.rm(target, { recursive: true, force: true });
    await fs.promises.mkdir(target, { mode: 0o755 });
  }
  await fs.promises.chmod(path.join(rootfs, 'tmp'), 0o1777);
  const hosts = path.join(rootfs, 'etc/hosts');
  const stat = await fs.promises.lstat(hosts).catch(() => null);
  if (stat?.isFile()) return;
  if (stat) await fs.promises.rm(hosts, { recursive: true, force: true });
  await fs.promises.writeFile(hosts, '');
}

/** `--entrypoint '["python", "agent.py"]'` (JSON, exec form) or `--entrypoint "python agent.py"` (split on spaces). */
function parseEntrypoint(raw: string): string[] {
  const value: unknown = raw.trim().startsWith('[') ? JSON.parse(raw) : raw.trim().split(/\s+/);
  if (!Array.isArray(value) || value.length === 0 || !value.every((v) => typeof v === 'string' && v !== '')) {
    throw new Error('--entrypoint must be a JSON list of strings or a command line');
  }
  return value;
}

const USAGE =
  'usage: svc images import NAME DIR|TARBALL|ARCHIVE [--entrypoint CMD] | pull REFERENCE | build NAME DOCKERFILE [CONTEXT_DIR] | list | resolve REFERENCE | rm NAME';
const megabytes = (bytes: number): string => `${(bytes / 1e6).toFixed(1)} MB`;

/**
 * `svc images ...` for the CLI: `import NAME DIR|TARBALL|ARCHIVE [--entrypoint CMD]`,
 * `pull REFERENCE`, `build NAME DOCKERFILE [CONTEXT_DIR]` (image-builder.ts), `list`, `resolve REFERENCE`,
 * `rm NAME`. `settings` (registries, size bound)
 * default to the settings' defaults. Returns the exit code; prints with `out`.
 */
export async function imagesCommand(args: string[], dataDir: string, out: (line: string) => void = console.log, settings?: PullSettings): Promise<number> {
  const store = new ImageStore(path.join(dataDir, 'images'));
  const pullSettings = settings ?? { registryAuth: null, registryInsecure: null, registryMirror: null, imageMaxBytes: DEFAULT_MAX_BYTES };
  const flag = args.indexOf('--entrypoint');
  const [sub, ...rest] = flag === -1 ? args : [...args.slice(0, flag), ...args.slice(flag + 2)];
  try {
    if (sub === 'import' && rest.length === 2 && (flag === -1 || args[flag + 1] !== undefined)) {
      const entrypoint = flag === -1 ? undefined : parseEntrypoint(args[flag + 1]!);
      const info = await store.importImage(rest[0]!, rest[1]!, { entrypoint, maxBytes: pullSettings.imageMaxBytes });
      out(`imported ${info.name} (${megabytes(info.bytes)}${info.digest ? `, ${info.digest}` : ''}) into ${info.rootfs}`);
      return 0;
    }
    if (sub === 'pull' && rest.length === 1 && flag === -1) {
      const { image, downloaded, cached, upToDate } = await store.pullImage(rest[0]!, pullSettings);
      if (upToDate) out(`${image.name} is up to date (${image.digest})`);
      else out(`pulled ${image.source} (${image.digest}; ${downloaded} layers downloaded, ${cached} cached; ${megabytes(image.bytes)}) into ${image.rootfs}`);
      return 0;
    }
    if (sub === 'build' && (rest.length === 2 || rest.length === 3) && flag === -1) {
      // Loaded when asked for: the builder needs the runtime, and imports this module.
      const { buildCommand } = await import('./image-builder.ts');
      return await buildCommand(rest[0]!, rest[1]!, rest[2] ?? null, dataDir, pullSettings, out);
    }
    if (sub === 'list' && rest.length === 0) {
      for (const image of await store.listImages())
        out([image.name, megabytes(image.bytes), image.importedAt, ...(image.digest ? [image.digest] : [])].join('\t'));
      return 0;
    }
    if (sub === 'resolve' && rest.length === 1) {
      const rootfs = store.resolveImage(rest[0]!);
      out(rootfs ?? `image could not be pulled: ${rest[0]} is not in ${store.dir}`);
      return rootfs ? 0 : 1;
    }
    if (sub === 'rm' && rest.length === 1) {
      const removed = await store.removeImage(rest[0]!);
      out(removed ? `removed ${normalizeReference(rest[0]!)}` : `no image ${rest[0]}`);
      return removed ? 0 : 1;
    }
  } catch (err) {
    out(`svc images: ${(err as Error).message}`);
    return 1;
  }
  out(USAGE);
  return 2;
}

/** The root filesystem of `reference` in the store at `imagesDir`, or null; the store only, no pull (see `ensureImage`). */
export async function resolveImage(imagesDir: string, reference: string): Promise<string | null> {
  return new ImageStore(imagesDir).resolveImage(reference);
}

/**
 * The image of `reference` in the store at `imagesDir`, pulled from its registry when the store
 * does not have it; throws an Error saying why it could not be pulled (unknown image, refused
 * credentials, wrong digest, unreachable registry, too large...).
 */
export function ensureImage(imagesDir: string, reference: string, settings: PullSettings): Promise<ImageInfo> {
  return new ImageStore(imagesDir).ensureImage(reference, settings);
}

export function listImages(imagesDir: string): Promise<ImageInfo[]> {
  return new ImageStore(imagesDir).listImages();
}

function isLink(file: string): boolean {
  try {
    return fs.lstatSync(file).isSymbolicLink();
  } catch {
    return false;
  }
}

function run(command: string, args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString('utf8')));
    child.stderr.on('data', (chunk: Buffer) => {
      if (stderr.length < 4000) stderr += chunk.toString('utf8');
    });
    child.on('error', (err) => reject(new Error(`${command}: ${err.message}`)));
    child.on('close', (code) => (code === 0 ? resolve(stdout) : reject(new Error(`${command} failed (${code}): ${stderr.trim()}`))));
  });
}
