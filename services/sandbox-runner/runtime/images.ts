/**
 * The local image store: root filesystems the `local` runtime mounts read-only as a sandbox's /.
 *
 *   <dataDir>/images/<dir>/rootfs       the root filesystem
 *   <dataDir>/images/<dir>/image.json   { name, source, importedAt, bytes, entrypoint? }
 *
 * `entrypoint` (exec form, set with `--entrypoint` at import) is what an `image` agent runs.
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
 * Sources: a directory (copied with `cp -a`) or a tarball of a root filesystem such as
 * `docker export` writes (plain, gzip, bzip2, xz or zstd; unpacked with GNU `tar`, owners kept).
 * Image archives with layers (`docker save`, OCI layouts) are not root filesystems: export a
 * container instead. `infra/images/debian-rootfs.sh` builds a Debian one with debootstrap.
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';

export interface ImageInfo {
  name: string;
  rootfs: string;
  source: string;
  importedAt: string;
  bytes: number;
  /** The image's agent command (exec form), for specs whose agent is `type: image`. */
  entrypoint?: string[];
}

const REFERENCE = /^[a-z0-9]([a-z0-9._\-/]*[a-z0-9])?(:[0-9]+)?([a-z0-9._\-/]*[a-z0-9])?(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$/;

/** The store name of an image reference (see the module comment); throws on a malformed one. */
export function normalizeReference(reference: string): string {
  let ref = reference.trim();
  if (!ref || ref.length > 255 || ref.includes('+') || ref.includes('..') || !REFERENCE.test(ref)) throw new Error(`invalid image reference: ${JSON.stringify(reference)}`);
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

export class ImageStore {
  readonly dir: string;

  /** imagesDir: `<dataDir>/images` */
  constructor(imagesDir: string) {
    this.dir = path.resolve(imagesDir);
  }

  /** The root filesystem of an image reference, or null when the store does not have it. */
  resolveImage(reference: string): string | null {
    const rootfs = path.join(this.dir, dirName(normalizeReference(reference)), 'rootfs');
    return fs.existsSync(path.join(rootfs, '..', 'image.json')) ? rootfs : null;
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
      if (entry.startsWith('.')) continue;
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
   * Imports a root filesystem (a directory or a tarball) under `name` (an image reference),
   * replacing an image of that name. The import is staged and renamed into place, so a reader
   * never sees half an image.
   */
  async importImage(name: string, source: string, entrypoint?: string[]): Promise<ImageInfo> {
    const normalized = normalizeReference(name);
    const src = path.resolve(source);
    const stat = await fs.promises.stat(src).catch(() => null);
    if (!stat) throw new Error(`no such directory or tarball: ${source}`);
    await fs.promises.mkdir(this.dir, { recursive: true });
    const staging = path.join(this.dir, `.import-${randomBytes(6).toString('hex')}`);
    const rootfs = path.join(staging, 'rootfs');
    await fs.promises.mkdir(rootfs, { recursive: true });
    try {
      if (stat.isDirectory()) await run('cp', ['-a', '--', `${src}/.`, `${rootfs}/`]);
      else await run('tar', ['-xf', src, '-C', rootfs, '--numeric-owner', '--same-owner', '--same-permissions', '--exclude=./dev/*', '--exclude=dev/*']);
      const sh = path.join(rootfs, 'bin/sh');
      if (!fs.existsSync(sh) && !isLink(sh)) throw new Error(`${source} is not a root filesystem: it has no /bin/sh`);
      // mount points the runtime needs in a read-only root
      for (const dir of ['proc', 'dev', 'tmp', 'run', 'workspace', 'agent', 'etc']) await fs.promises.mkdir(path.join(rootfs, dir), { recursive: true });
      await fs.promises.chmod(path.join(rootfs, 'tmp'), 0o1777);
      const hosts = path.join(rootfs, 'etc/hosts');
      if (!fs.existsSync(hosts) && !isLink(hosts)) await fs.promises.writeFile(hosts, '');
      const bytes = Number((await run('du', ['-sb', rootfs])).split('\t')[0]) || 0;
      const info = { name: normalized, source: src, importedAt: new Date().toISOString(), bytes, ...(entrypoint ? { entrypoint } : {}) };
      await fs.promises.writeFile(path.join(staging, 'image.json'), `${JSON.stringify(info, null, 2)}\n`);
      const target = path.join(this.dir, dirName(normalized));
      const old = path.join(this.dir, `.old-${randomBytes(6).toString('hex')}`);
      const replaced = await fs.promises.rename(target, old).then(() => true, () => false);
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

/** `--entrypoint '["python", "agent.py"]'` (JSON, exec form) or `--entrypoint "python agent.py"` (split on spaces). */
function parseEntrypoint(raw: string): string[] {
  const value: unknown = raw.trim().startsWith('[') ? JSON.parse(raw) : raw.trim().split(/\s+/);
  if (!Array.isArray(value) || value.length === 0 || !value.every((v) => typeof v === 'string' && v !== '')) {
    throw new Error('--entrypoint must be a JSON list of strings or a command line');
  }
  return value;
}

/**
 * `svc images ...` for the CLI: `import NAME DIR|TARBALL [--entrypoint CMD]`, `list`,
 * `resolve REFERENCE`, `rm NAME`. Returns the exit code; prints with `out`.
 */
export async function imagesCommand(args: string[], dataDir: string, out: (line: string) => void = console.log): Promise<number> {
  const store = new ImageStore(path.join(dataDir, 'images'));
  const flag = args.indexOf('--entrypoint');
  const [sub, ...rest] = flag === -1 ? args : [...args.slice(0, flag), ...args.slice(flag + 2)];
  try {
    if (sub === 'import' && rest.length === 2 && (flag === -1 || args[flag + 1] !== undefined)) {
      const info = await store.importImage(rest[0]!, rest[1]!, flag === -1 ? undefined : parseEntrypoint(args[flag + 1]!));
      out(`imported ${info.name} (${(info.bytes / 1e6).toFixed(1)} MB) into ${info.rootfs}`);
      return 0;
    }
    if (sub === 'list' && rest.length === 0) {
      for (const image of await store.listImages()) out(`${image.name}\t${(image.bytes / 1e6).toFixed(1)} MB\t${image.importedAt}`);
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
  out('usage: svc images import NAME DIR|TARBALL [--entrypoint CMD] | list | resolve REFERENCE | rm NAME');
  return 2;
}

/** The root filesystem of `reference` in the store at `imagesDir`, or null (then the boot fails with 'image could not be pulled'). */
export async function resolveImage(imagesDir: string, reference: string): Promise<string | null> {
  return new ImageStore(imagesDir).resolveImage(reference);
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
