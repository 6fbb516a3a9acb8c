/**
 * Agent bundles: `.tar.gz` blobs stored once per content under SVC_BLOB_DIR
 * (`sha256/<2 hex>/<hex>.tar.gz`), checked while they stream in, and extracted once per digest
 * for the sandboxes that mount them read-only at /agent.
 *
 * An upload streams through one pass: the sha256, the byte count against the size limit, the tar
 * parser that checks every entry, and a temporary file; nothing holds the whole bundle in memory
 * (only its links: at the end each one is resolved against the others, as the kernel would in an
 * extracted copy, and a link that climbs out of the bundle through another link is refused; the
 * workspace's own path-safe layer never follows one anyway, but a bundle that needs it is refused).
 */
import { createHash, randomBytes } from 'node:crypto';
import { createWriteStream } from 'node:fs';
import { chmod, lstat, mkdir, readdir, rename, rm, stat } from 'node:fs/promises';
import path from 'node:path';
import { Transform, type Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { extract, Parser, type ReadEntry } from 'tar';
import { AppError, badRequest } from './errors.ts';

/** The subdirectory of the blob store that holds task-file bundles (agent bundles are at its top). */
export const TASK_FILES_SUBDIR = 'task-files';

/** A decompressed bundle may be at most this many times its compressed size limit (gzip bombs). */
const MAX_EXPANSION = 10;
const GZIP_MAGIC = [0x1f, 0x8b];
/** Entry types a bundle may hold; devices and FIFOs have no place in agent code. */
const ALLOWED_TYPES = new Set(['File', 'OldFile', 'ContiguousFile', 'Directory', 'SymbolicLink', 'Link']);

/** A size limit, with the name the 413 gives it (e.g. `agents.max_size`). */
export interface SizeLimit {
  bytes: number;
  name: string;
}

export interface ReceivedBundle {
  /** `sha256:<hex>` of the uploaded bytes. */
  digest: string;
  sizeBytes: number;
  entries: number;
  tempPath: string;
}

/** Longest entry path or link target (Linux's PATH_MAX): long-name headers could carry megabytes. */
const PATH_MAX = 4096;
/** Work allowed for resolving every link against the others (about a second at most). */
const MAX_LINK_RESOLUTION_CHARS = 100_000_000;

/** Why an entry path or link target would escape the bundle's root, or null when it stays inside. */
function escapes(entryPath: string): string | null {
  if (path.posix.isAbsolute(entryPath) || /^[A-Za-z]:/.test(entryPath)) return 'is an absolute path';
  if (entryPath.split(/[\\/]/).includes('..')) return 'contains ".."';
  return null;
}

/** The kernel's own limit on symlinks followed in one lookup (MAXSYMLINKS). */
const MAX_SYMLINK_HOPS = 40;

/** An entry's path as a key: `/`-separated, no `./` or trailing `/`. */
function entryKey(entryPath: string): string {
  return path.posix.normalize(entryPath.replace(/\\/g, '/')).replace(/^(\.\/)+|\/+$/g, '');
}

/**
 * Where `segments` (from the bundle's root) lead once the bundle's own symlinks are followed, the
 * way the kernel follows them in an extracted copy: `outside` when they climb above the root, `loop`
 * past the kernel's symlink limit. A link that is lexically fine can still escape through another
 * one (`up -> ../..` deep down, `esc -> deep/up/../..`). `followFinal` false for a hard link's target.
 */
function resolveInBundle(links: ReadonlyMap<string, string>, segments: string[], followFinal: boolean, budget: { chars: number }): 'inside' | 'outside' | 'loop' | 'too_complex' {
  const at: string[] = [];
  const queue = [...segments];
  let hops = 0;
  while (queue.length > 0) {
    const seg = queue.shift()!;
    if (seg === '' || seg === '.') continue;
    if (seg === '..') {
      if (at.length === 0) return 'outside';
      at.pop();
      continue;
    }
    const key = [...at, seg].join('/');
    // Each lookup costs its key's length: a bundle of many deep links is refused, not checked for minutes.
    if ((budget.chars -= key.length) < 0) return 'too_complex';
    const target = links.get(key);
    if (target !== undefined && (queue.length > 0 || followFinal)) {
      if (++hops > MAX_SYMLINK_HOPS) return 'loop';
      if (path.posix.isAbsolute(target)) return 'outside';
      queue.unshift(...target.split('/'));
      continue;
    }
    at.push(seg);
  }
  return 'inside';
}

/** The first link of the bundle that escapes it physically (through its other links), or null. */
function physicalEscape(links: ReadonlyMap<string, string>, hardLinks: ReadonlyMap<string, string>): string | null {
  const budget = { chars: MAX_LINK_RESOLUTION_CHARS };
  const problem = (kind: string, name: string, target: string, where: 'inside' | 'outside' | 'loop' | 'too_complex') =>
    where === 'inside'
      ? null
      : where === 'too_complex'
        ? `has more or deeper links than can be checked (over ${MAX_LINK_RESOLUTION_CHARS} path characters resolved)`
        : `${kind} ${JSON.stringify(name)} ${where === 'outside' ? 'points outside the bundle through another link' : 'is part of a symbolic link loop'} (${JSON.stringify(target)})`;
  for (const [name, target] of links) {
    const found = problem('symbolic link', name, target, resolveInBundle(links, [...name.split('/').slice(0, -1), ...target.split('/')], true, budget));
    if (found) return found;
  }
  for (const [name, target] of hardLinks) {
    const found = problem('hard link', name, target, resolveInBundle(links, target.split('/'), false, budget));
    if (found) return found;
  }
  return null;
}

function checkEntry(entry: ReadEntry): string | null {
  const name = JSON.stringify(entry.path.slice(0, 200));
  if (Buffer.byteLength(entry.path) > PATH_MAX || Buffer.byteLength(entry.linkpath ?? '') > PATH_MAX) return `entry ${name} has a path or link target over ${PATH_MAX} bytes`;
  if (!ALLOWED_TYPES.has(entry.type)) return `entry ${name} is a ${entry.type}; only files, directories and links are allowed`;
  const pathProblem = escapes(entry.path);
  if (pathProblem) return `entry ${name} ${pathProblem}`;
  if (entry.type === 'Link' && entry.linkpath !== undefined) {
    const linkProblem = escapes(entry.linkpath);
    if (linkProblem) return `hard link ${name} points outside the bundle (${JSON.stringify(entry.linkpath)})`;
  }
  if (entry.type === 'SymbolicLink' && entry.linkpath !== undefined) {
    const target = path.posix.isAbsolute(entry.linkpath) ? entry.linkpath : path.posix.normalize(path.posix.join(path.posix.dirname(entry.path), entry.linkpath));
    if (path.posix.isAbsolute(target) || target === '..' || target.startsWith('../')) {
      return `symbolic link ${name} points outside the bundle (${JSON.stringify(entry.linkpath)})`;
    }
  }
  return null;
}

/**
 * Checks a stream as a gzip'd tar while passing it through: fails with a 400 naming `bundle` on
 * the first bad entry or a corrupt archive, and with a 413 past `maxBytes`.
 */
class BundleCheck extends Transform {
  readonly hash = createHash('sha256');
  sizeBytes = 0;
  entries = 0;
  private expandedBytes = 0;
  private problem: AppError | null = null;
  private readonly parser = new Parser({ strict: true });
  /** Symbolic and hard links by entry path, checked against each other once all are in. */
  private readonly links = new Map<string, string>();
  private readonly hardLinks = new Map<string, string>();

  private readonly maxBytes: number;

  constructor(private readonly limit: SizeLimit) {
    super();
    const maxBytes = (this.maxBytes = limit.bytes);
    this.parser.on('entry', (entry: ReadEntry) => {
      this.entries++;
      // Headers count too: they bound the links kept in memory.
      this.expandedBytes += 512 + (entry.size ?? 0) + Buffer.byteLength(entry.path) + Buffer.byteLength(entry.linkpath ?? '');
      const problem = checkEntry(entry);
      if (problem) this.fail(badRequest('bundle', problem));
      else if (this.expandedBytes > maxBytes * MAX_EXPANSION) this.fail(badRequest('bundle', `expands to more than ${MAX_EXPANSION} times the size limit`));
      else if (entry.type === 'SymbolicLink' && entry.linkpath !== undefined) this.links.set(entryKey(entry.path), entry.linkpath);
      else if (entry.type === 'Link' && entry.linkpath !== undefined) this.hardLinks.set(entryKey(entry.path), entryKey(entry.linkpath));
      entry.resume();
    });
    this.parser.on('error', (err: Error) => this.fail(badRequest('bundle', `is not a valid .tar.gz archive (${err.message.replace(/^TAR_BAD_ARCHIVE: /, '')})`)));
  }

  private fail(err: AppError): void {
    this.problem ??= err;
  }

  /**
   * After the first problem the rest of the upload is read and dropped, not refused mid-stream:
   * the client is still sending, and most clients cannot read an answer they are not done sending.
   */
  override _transform(chunk: Buffer, _encoding: BufferEncoding, done: (err?: Error | null, data?: Buffer) => void): void {
    if (this.sizeBytes === 0 && (chunk[0] !== GZIP_MAGIC[0] || (chunk.length > 1 && chunk[1] !== GZIP_MAGIC[1]))) {
      this.fail(badRequest('bundle', 'is not gzip-compressed: upload a .tar.gz archive'));
    }
    this.sizeBytes += chunk.length;
    if (this.sizeBytes > this.maxBytes) {
      this.fail(new AppError('payload_too_large', `bundle: larger than the size limit of ${this.maxBytes} bytes (${this.limit.name})`));
    }
    if (this.problem) return done();
    this.hash.update(chunk);
    this.parser.write(chunk);
    done(null, chunk);
  }

  override _flush(done: (err?: Error | null) => void): void {
    if (this.problem) return done(this.problem);
    if (this.sizeBytes === 0) return done(badRequest('bundle', 'is empty'));
    // A truncated archive ends in an 'error' and never in 'end': either settles the check.
    let settled = false;
    const settle = () => {
      if (settled) return;
      settled = true;
      if (!this.problem && this.entries === 0) this.problem = badRequest('bundle', 'holds no files');
      const escape = this.problem ? null : physicalEscape(this.links, this.hardLinks);
      if (escape) this.problem = badRequest('bundle', escape);
      done(this.problem);
    };
    this.parser.on('error', settle);
    this.parser.end(settle);
  }
}

export class BundleStore {
  constructor(readonly dir: string) {}

  /** The blob's path relative to the store (the snapshot's `storage_path`). */
  static storagePath(digest: string): string {
    const hex = digest.replace(/^sha256:/, '');
    return `sha256/${hex.slice(0, 2)}/${hex}.tar.gz`;
  }

  absolute(storagePath: string): string {
    return path.join(this.dir, storagePath);
  }

  /** Streams an upload to a temporary file, checking it on the way; the caller commits or discards it. */
  async receive(source: Readable, limit: SizeLimit): Promise<ReceivedBundle> {
    const tmpDir = path.join(this.dir, 'tmp');
    await mkdir(tmpDir, { recursive: true });
    const tempPath = path.join(tmpDir, `${Date.now()}-${randomBytes(6).toString('hex')}.part`);
    const check = new BundleCheck(limit);
    const file = createWriteStream(tempPath);
    try {
      await pipeline(source, check, file);
    } catch (err) {
      // The file may be opened after the failure: remove it once the stream is closed.
      if (!file.closed) await new Promise<void>((resolve) => file.once('close', () => resolve()));
      await rm(tempPath, { force: true });
      throw err;
    }
    return { digest: `sha256:${check.hash.digest('hex')}`, sizeBytes: check.sizeBytes, entries: check.entries, tempPath };
  }

  /** Moves a received bundle to its content address; identical bytes already stored are kept once. */
  async commit(received: ReceivedBundle): Promise<string> {
    const storagePath = BundleStore.storagePath(received.digest);
    const target = this.absolute(storagePath);
    if (await exists(target)) {
      await rm(received.tempPath, { force: true });
    } else {
      await mkdir(path.dirname(target), { recursive: true });
      await rename(received.tempPath, target);
    }
    return storagePath;
  }

  discard(received: ReceivedBundle): Promise<void> {
    return rm(received.tempPath, { force: true });
  }

  async remove(digest: string): Promise<void> {
    await rm(this.absolute(BundleStore.storagePath(digest)), { force: true });
  }

  has(digest: string): Promise<boolean> {
    return exists(this.absolute(BundleStore.storagePath(digest)));
  }

  /** Temporary files left by uploads that died with their process. */
  async sweepTemporary(): Promise<void> {
    await rm(path.join(this.dir, 'tmp'), { recursive: true, force: true });
  }
}

/**
 * Bundles extracted once per digest under `<dir>/<hex>`, world-readable, for read-only mounts.
 * Extraction goes to a temporary directory renamed into place, so a crash never leaves half a
 * bundle that looks complete.
 */
export class ExtractedBundles {
  private readonly inFlight = new Map<string, Promise<string>>();

  constructor(
    private readonly dir: string,
    private readonly store: BundleStore,
  ) {}

  /** The extracted bundle's directory on the host. */
  async ensure(digest: string): Promise<string> {
    const hex = digest.replace(/^sha256:/, '');
    const target = path.join(this.dir, hex);
    if (await exists(target)) return target;
    const pending = this.inFlight.get(hex) ?? this.extract(digest, target).finally(() => this.inFlight.delete(hex));
    this.inFlight.set(hex, pending);
    return pending;
  }

  private async extract(digest: string, target: string): Promise<string> {
    const blob = this.store.absolute(BundleStore.storagePath(digest));
    if (!(await exists(blob))) throw new Error(`the bundle ${digest} is not in the blob store (${this.store.dir})`);
    const temp = `${target}.${randomBytes(4).toString('hex')}.tmp`;
    await mkdir(temp, { recursive: true });
    try {
      // The checks ran at upload; these options refuse the same things again, defensively.
      await extract({ file: blob, cwd: temp, strict: true, preservePaths: false, preserveOwner: false, noMtime: true });
      await makeReadable(temp);
      await rename(temp, target).catch(async (err: NodeJS.ErrnoException) => {
        // Another boot extracted the same bundle first: keep that one.
        if (err.code !== 'ENOTEMPTY' && err.code !== 'EEXIST') throw err;
        await rm(temp, { recursive: true, force: true });
      });
      return target;
    } catch (err) {
      await rm(temp, { recursive: true, force: true });
      throw err;
    }
  }

  /** Removes extracted copies whose blob is gone (the last snapshot row using it was deleted). */
  async prune(inUse: ReadonlySet<string>): Promise<void> {
    const names = await readdir(this.dir).catch(() => [] as string[]);
    for (const name of names) {
      if (!/^[0-9a-f]{64}$/.test(name) || inUse.has(`sha256:${name}`)) continue;
      if (!(await this.store.has(`sha256:${name}`))) await rm(path.join(this.dir, name), { recursive: true, force: true });
    }
  }
}

/** Directories 0755, files readable by all (their execute bits kept): the sandbox user reads them. */
async function makeReadable(dir: string): Promise<void> {
  await chmod(dir, 0o755);
  for (const name of await readdir(dir)) {
    const full = path.join(dir, name);
    const info = await lstat(full);
    if (info.isSymbolicLink()) continue;
    if (info.isDirectory()) await makeReadable(full);
    else await chmod(full, (info.mode & 0o777) | 0o444 | (info.mode & 0o100 ? 0o055 : 0));
  }
}

async function exists(file: string): Promise<boolean> {
  return stat(file).then(
    () => true,
    () => false,
  );
}
