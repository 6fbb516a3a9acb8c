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
 *
 * A gzip bomb must cost the event loop nothing: the bytes are inflated by node's zlib on libuv's
 * pool (node-tar would inflate them synchronously, megabytes per chunk), the inflated bytes are
 * bounded (MAX_EXPANSION times the size limit), and the tar parser gets one inflated chunk (16 KiB)
 * per turn of the loop and nothing past the archive's end (node-tar copies all it holds on every
 * chunk after it: quadratic). Entries are bounded too (MAX_ENTRIES).
 */
import { createHash, randomBytes } from 'node:crypto';
import { createReadStream, createWriteStream } from 'node:fs';
import { chmod, lstat, mkdir, readdir, rename, rm, stat } from 'node:fs/promises';
import path from 'node:path';
import { Transform, type Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { createGunzip } from 'node:zlib';
import { extract, Parser, type ReadEntry } from 'tar';
import { AppError, badRequest } from './errors.ts';
import { tarGate } from './tar-gate.ts';

/** The subdirectory of the blob store that holds task-file bundles (agent bundles are at its top). */
export const TASK_FILES_SUBDIR = 'task-files';

/** A decompressed bundle may be at most this many times its compressed size limit (gzip bombs). */
export const MAX_EXPANSION = 10;
/** Most entries a bundle may hold: each is a file on the host once extracted. */
export const MAX_ENTRIES = 200_000;
/** Most bytes after the tar's end-of-archive blocks (tar pads its last record with zeros: 10 KiB, 1 MiB at `-b 2048`). */
export const MAX_TRAILING_BYTES = 1024 * 1024;
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
function resolveInBundle(
  links: ReadonlyMap<string, string>,
  segments: string[],
  followFinal: boolean,
  budget: { chars: number },
): 'inside' | 'outside' | 'loop' | 'too_complex' {
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
  if (Buffer.byteLength(entry.path) > PATH_MAX || Buffer.byteLength(entry.linkpath ?? '') > PATH_MAX)
    return `entry ${name} has a path or link target over ${PATH_MAX} bytes`;
  if (!ALLOWED_TYPES.has(entry.type)) return `entry ${name} is a ${entry.type}; only files, directories and links are allowed`;
  const pathProblem = escapes(entry.path);
  if (pathProblem) return `entry ${name} ${pathProblem}`;
  if (entry.type === 'Link' && entry.linkpath !== undefined) {
    const linkProblem = escapes(entry.linkpath);
    if (linkProblem) return `hard link ${name} points outside the bundle (${JSON.stringify(entry.linkpath)})`;
  }
  if (entry.type === 'SymbolicLink' && entry.linkpath !== undefined) {
    const target = path.posix.isAbsolute(entry.linkpath)
      ? entry.linkpath
      : path.posix.normalize(path.posix.join(path.posix.dirname(entry.path), entry.linkpath));
    if (path.posix.isAbsolute(target) || target === '..' || target.startsWith('../')) {
      return `symbolic link ${name} points outside the bundle (${JSON.stringify(entry.linkpath)})`;
    }
  }
  return null;
}

/**
 * Checks a stream as a gzip'd tar while passing it through: fails with a 400 naming `bundle` on
 * the first bad entry or a corrupt archive, and with a 413 past `maxBytes` (or past its bounds
 * once inflated).
 */
class BundleCheck extends Transform {
  readonly hash = createHash('sha256');
  sizeBytes = 0;
  entries = 0;
  /** Bytes the entry headers declare, checked before their bodies are inflated. */
  private declaredBytes = 0;
  private inflatedBytes = 0;
  /** Inflated bytes after the end-of-archive blocks, which the parser is not given. */
  private trailingBytes = 0;
  private tarEnded = false;
  private problem: AppError | null = null;
  /** Inflates on libuv's pool, one output chunk per turn of the event loop. */
  private readonly gunzip = createGunzip();
  private readonly parser = new Parser({ strict: true, brotli: false, zstd: false });
  /** Symbolic and hard links by entry path, checked against each other once all are in. */
  private readonly links = new Map<string, string>();
  private readonly hardLinks = new Map<string, string>();

  private readonly maxBytes: number;

  constructor(private readonly limit: SizeLimit) {
    super();
    this.maxBytes = limit.bytes;
    this.parser.on('entry', (entry: ReadEntry) => this.onEntry(entry));
    this.parser.on('eof', () => (this.tarEnded = true));
    this.parser.on('error', (err: Error) =>
      this.fail(badRequest('bundle', `is not a valid .tar.gz archive (${err.message.replace(/^TAR_BAD_ARCHIVE: /, '')})`)),
    );
    this.gunzip.on('data', (chunk: Buffer) => this.onInflated(chunk));
    this.gunzip.on('error', (err: Error) => this.fail(badRequest('bundle', `is not a valid .tar.gz archive (gzip: ${err.message})`)));
  }

  private tooLarge(): AppError {
    return new AppError(
      'payload_too_large',
      `bundle: expands to more than ${this.maxBytes * MAX_EXPANSION} bytes unpacked (${MAX_EXPANSION} times ${this.limit.name})`,
    );
  }

  private onEntry(entry: ReadEntry): void {
    this.entries++;
    // Headers count too: they bound the links kept in memory.
    this.declaredBytes += 512 + (entry.size ?? 0) + Buffer.byteLength(entry.path) + Buffer.byteLength(entry.linkpath ?? '');
    const problem = checkEntry(entry);
    if (problem) this.fail(badRequest('bundle', problem));
    else if (this.entries > MAX_ENTRIES) this.fail(new AppError('payload_too_large', `bundle: holds more than ${MAX_ENTRIES} entries`));
    else if (this.declaredBytes > this.maxBytes * MAX_EXPANSION) this.fail(this.tooLarge());
    else if (entry.type === 'SymbolicLink' && entry.linkpath !== undefined) this.links.set(entryKey(entry.path), entry.linkpath);
    else if (entry.type === 'Link' && entry.linkpath !== undefined) this.hardLinks.set(entryKey(entry.path), entryKey(entry.linkpath));
    entry.resume();
  }

  /** An inflated chunk: counted, then parsed while the archive lasts. */
  private onInflated(chunk: Buffer): void {
    if (this.problem) return;
    const first = this.inflatedBytes === 0;
    this.inflatedBytes += chunk.length;
    if (this.inflatedBytes > this.maxBytes * MAX_EXPANSION) return this.fail(this.tooLarge());
    // The parser would inflate a second gzip layer itself, synchronously and unbounded.
    if (first && chunk[0] === GZIP_MAGIC[0] && chunk[1] === GZIP_MAGIC[1])
      return this.fail(badRequest('bundle', 'is compressed twice: upload a .tar.gz archive'));
    if (!this.tarEnded) return void this.parser.write(chunk);
    this.trailingBytes += chunk.length;
    if (this.trailingBytes > MAX_TRAILING_BYTES) this.fail(badRequest('bundle', `has more than ${MAX_TRAILING_BYTES} bytes after the end of its tar archive`));
  }

  private fail(err: AppError): void {
    this.problem ??= err;
    // Nothing more is inflated: the rest of the upload is only read and dropped.
    this.gunzip.destroy();
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
    this.push(chunk);
    // The next chunk waits until this one is inflated (or inflating stopped): memory stays bounded.
    if (this.gunzip.write(chunk)) return done();
    settled(this.gunzip, 'drain', () => done());
  }

  override _flush(done: (err?: Error | null) => void): void {
    if (this.problem) return done(this.problem);
    if (this.sizeBytes === 0) return done(badRequest('bundle', 'is empty'));
    settled(this.gunzip, 'end', () => {
      if (this.problem) return done(this.problem);
      // A truncated archive ends in an 'error' and never in 'end': either settles the check.
      let ended = false;
      const settle = () => {
        if (ended) return;
        ended = true;
        if (!this.problem && this.entries === 0) this.problem = badRequest('bundle', 'holds no files');
        const escaping = this.problem ? null : physicalEscape(this.links, this.hardLinks);
        if (escaping) this.problem = badRequest('bundle', escaping);
        done(this.problem);
      };
      this.parser.on('error', settle);
      this.parser.end(settle);
    });
    this.gunzip.end();
  }

  override _destroy(err: Error | null, done: (err?: Error | null) => void): void {
    this.gunzip.destroy();
    done(err);
  }
}

/** Calls `then` once, on `event` or when `stream` closes (destroyed or failed) first. */
function settled(stream: NodeJS.EventEmitter, event: string, then: () => void): void {
  const once = () => {
    stream.off(event, once);
    stream.off('close', once);
    then();
  };
  stream.on(event, once);
  stream.on('close', once);
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
      // The checks ran at upload; these options refuse the same things again, defensively. Inflated
      // by node's zlib on libuv's pool (node-tar's own gunzip would run on this event loop), and
      // parsed only up to the tar's end (a blob stored before those bounds may go on).
      const unpack = extract({ cwd: temp, strict: true, preservePaths: false, preserveOwner: false, noMtime: true });
      await pipeline(createReadStream(blob), createGunzip(), tarGate(unpack), unpack as unknown as NodeJS.WritableStream);
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
