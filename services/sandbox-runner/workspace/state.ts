/**
 * Filesystem state and diff (the spec's "Filesystem state" and "Diff").
 *
 * `captureState(workspace)` lists every file under the workspace as
 * `{size, mode: "0644", checksum: sha256 hex}`, keyed by `/`-separated workspace-relative path, in
 * sorted order:
 *  - directories named `node_modules`, `.git`, `__pycache__` or `.svc` are skipped at any depth
 *    (a *file* with one of those names is listed);
 *  - files larger than `checksumMaxBytes` (1 MiB) keep size and mode but get no checksum;
 *  - symlinks are recorded, never followed: `size` is the length of the link text, `mode` its lstat
 *    mode, `checksum` the sha256 of the link text (as git does) and `symlink` the link text itself;
 *    a link to a directory is one entry, its contents are not walked;
 *  - other special files (fifos, sockets, devices) and directories themselves are not listed;
 *  - a file that vanishes or cannot be read while the capture runs is left out / listed without
 *    checksum; paths longer than 4096 bytes (deeper than the files API can name) are not listed.
 *
 * The walk goes by descriptor (beneath.ts): each directory is opened O_NOFOLLOW|O_DIRECTORY in its
 * held parent and listed through its own descriptor, each file opened O_NOFOLLOW in its held
 * directory and described by fstat of what was opened. A directory the agent swaps for a symlink
 * (to /root, another sandbox's workspace) while the capture runs is listed as the symlink it has
 * become, never entered: no host name, size or hash can come back.
 *
 * Speed: see the comment on `captureState` (time-sliced synchronous work for small files, bounded
 * parallel hashing for bigger ones); and a
 * `ChecksumCache` (one per sandbox, kept by the runner) remembers each file's checksum under
 * (path, dev, ino, size, mtime ns, ctime ns), so a later capture re-hashes only files that changed.
 * ctime cannot be set by the agent (unlike mtime), so a rewrite always changes the key, except
 * within one tick of the filesystem clock; entries whose ctime is within `racyMs` of the moment they
 * were hashed are therefore not trusted on the next capture (git's "racily clean" rule).
 *
 * `diffStates(before, after)` compares by checksum; when either side has no checksum (big files) it
 * compares size and mode instead, so a same-size rewrite of a file over 1 MiB is not seen. A file
 * that turned into a symlink (or back) is modified.
 */
import { createHash } from 'node:crypto';
import { closeSync, constants, fstatSync, readSync, type BigIntStats, type Dirent } from 'node:fs';
import pLimit, { type LimitFunction } from 'p-limit';
import type { WorkspaceDiff, WorkspaceFileEntry, WorkspaceState } from '../../domain/sandbox-ops.ts';
import { closeFd, lstatAt, openAt, openDirAt, openHandleAt, openRoot, readdirFd, readlinkAt } from './beneath.ts';

const SKIPPED_DIRS: ReadonlySet<string> = new Set(['node_modules', '.git', '__pycache__', '.svc']);
const DEFAULT_CHECKSUM_MAX_BYTES = 1024 * 1024;
const DEFAULT_CONCURRENCY = 8;
const DEFAULT_RACY_MS = 1000;

/** The shapes are the sandbox contract's (domain/sandbox-ops.ts): the api answers with them. */
export type FileEntry = WorkspaceFileEntry;
export type FilesystemState = WorkspaceState;
export type Diff = WorkspaceDiff;

interface CacheEntry {
  dev: bigint;
  ino: bigint;
  size: bigint;
  mtimeNs: bigint;
  ctimeNs: bigint;
  checksum: string;
}

/** Checksums of the last capture, keyed by relative path; one per workspace. */
export class ChecksumCache {
  private entries = new Map<string, CacheEntry>();
  /** Hashes computed during the last capture (for tests and metrics). */
  lastHashed = 0;

  get size(): number {
    return this.entries.size;
  }

  lookup(rel: string, st: BigIntStats): string | undefined {
    const e = this.entries.get(rel);
    if (!e) return undefined;
    if (e.dev !== st.dev || e.ino !== st.ino || e.size !== st.size || e.mtimeNs !== st.mtimeNs || e.ctimeNs !== st.ctimeNs) return undefined;
    return e.checksum;
  }

  /** Replaces the whole content (drops paths that are gone). */
  replace(next: Map<string, CacheEntry>, hashed: number): void {
    this.entries = next;
    this.lastHashed = hashed;
  }

  clear(): void {
    this.entries.clear();
  }
}

export interface CaptureOptions {
  /** Files larger than this get no checksum (default 1 MiB). */
  checksumMaxBytes?: number;
  /** Parallel hashing of files over `syncHashMaxBytes` (default 8). */
  concurrency?: number;
  /** Files up to this size are read and hashed on the calling thread, in time slices (default 64 KiB). */
  syncHashMaxBytes?: number;
  /** Longest stretch of synchronous work before yielding to the event loop (default 10 ms). */
  sliceMs?: number;
  /** Reuse checksums of unchanged files across captures. */
  cache?: ChecksumCache;
  /** Do not trust cached checksums of files changed this close to hashing time (default 1000 ms). */
  racyMs?: number;
  /**
   * An overlay's upper directory: its whiteouts (character devices 0/0) are listed as
   * `{whiteout: true}` entries, and a name it does not list is the image's, unchanged.
   */
  whiteouts?: boolean;
  /**
   * Walk the workspace's skipped directories too (node_modules, .git, __pycache__, .svc): a place
   * other than the workspace (a writable root's layer), where they would hide the agent's writes
   * from the reconciliation (an mmap'd write to /usr/lib/node_modules/x makes no inotify event).
   */
  everyDirectory?: boolean;
}

/*
 * Why mostly synchronous: with Node's promise fs API every lstat/open/read/close is a round trip
 * through the 4-thread libuv pool; on 10,000 small files that costs 4-6x more than the syscalls
 * themselves (measured: 10k lstat 156 ms async vs 44 ms sync; open+read+hash 1.2 s vs 0.2 s). So
 * the walk, the lstat calls and the hashing of small files run synchronously in slices of at most
 * `sliceMs`, yielding to the event loop in between (the server stays responsive), and only files
 * over `syncHashMaxBytes` go to the thread pool, `concurrency` at a time, where parallel reads pay.
 */
export async function captureState(workspace: string, options: CaptureOptions = {}): Promise<FilesystemState> {
  const captured_at = new Date().toISOString();
  const capture = new Capture(options);
  await capture.walk(workspace);
  options.cache?.replace(capture.nextCache, capture.hashed);
  const files: Record<string, FileEntry> = {};
  for (const rel of [...capture.found.keys()].sort(compare)) files[rel] = capture.found.get(rel)!;
  return { captured_at, files };
}

/** The longest workspace-relative path listed (the files API's own limit). */
const MAX_REL_BYTES = 4096;

/** One capture's walk: what it found, the checksums the cache keeps next, the hashing still running. */
class Capture {
  readonly found = new Map<string, FileEntry>();
  readonly nextCache = new Map<string, CacheEntry>();
  /** Files hashed (not taken from the cache). */
  hashed = 0;
  /** Directories still to list, each held open by its parent until then. */
  private readonly dirs: PendingDir[] = [{ parent: null, name: '', rel: '' }];
  private readonly asyncWork: Promise<void>[] = [];
  private readonly maxBytes: number;
  private readonly syncMax: number;
  private readonly limit: LimitFunction;
  private readonly sliceMs: number;
  private readonly racyNs: bigint;
  private readonly cache: ChecksumCache | undefined;
  private readonly whiteouts: boolean;
  private readonly skipped: ReadonlySet<string>;
  private sliceStart = performance.now();

  constructor(options: CaptureOptions) {
    this.maxBytes = options.checksumMaxBytes ?? DEFAULT_CHECKSUM_MAX_BYTES;
    this.syncMax = Math.min(this.maxBytes, options.syncHashMaxBytes ?? 64 * 1024);
    this.limit = pLimit(Math.max(1, options.concurrency ?? DEFAULT_CONCURRENCY));
    this.sliceMs = options.sliceMs ?? 10;
    this.racyNs = BigInt(Math.round((options.racyMs ?? DEFAULT_RACY_MS) * 1e6));
    this.cache = options.cache;
    this.whiteouts = options.whiteouts ?? false;
    this.skipped = options.everyDirectory ? new Set() : SKIPPED_DIRS;
  }

  /** Lists every directory under `workspace`, each through its own descriptor, then waits for the hashing. */
  async walk(workspace: string): Promise<void> {
    const root = new DirRef(openRoot(workspace));
    try {
      while (this.dirs.length > 0) {
        const pending = this.dirs.pop()!;
        const dir = pending.parent === null ? root : this.enter(pending.parent, pending.name, pending.rel);
        if (dir === undefined || !(await this.list(dir, pending.rel))) continue;
        await this.maybeYield();
      }
      await Promise.all(this.asyncWork);
    } finally {
      // After an error: let what was started finish, and close every directory still held.
      await Promise.allSettled(this.asyncWork);
      for (const p of this.dirs) p.parent?.release();
    }
  }

  /** Opens the directory `name` in its held `parent` (released here); undefined when it is not one (any more). */
  private enter(parent: DirRef, name: string, rel: string): DirRef | undefined {
    // O_NOFOLLOW|O_DIRECTORY in the held parent: a directory swapped for a symlink is not entered.
    let fd: number;
    try {
      fd = openDirAt(parent.fd, name);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      // Now a file or a symlink: listed as what it is (and if it flips back to a directory, skipped).
      if (code === 'ENOTDIR') this.visit(parent, name, rel, false);
      else if (!gone(err) && code !== 'EACCES') throw err;
      return undefined;
    } finally {
      parent.release();
    }
    return new DirRef(fd);
  }

  /** Queues the subdirectories of the held `dir` and visits its other entries, then releases it; false when it could not be read. */
  private async list(dir: DirRef, rel: string): Promise<boolean> {
    try {
      let entries: Dirent[];
      try {
        entries = readdirFd(dir.fd);
      } catch (err) {
        if (gone(err) || (rel !== '' && (err as NodeJS.ErrnoException).code === 'EACCES')) return false;
        throw err;
      }
      for (const d of entries) {
        const childRel = rel === '' ? d.name : `${rel}/${d.name}`;
        if (d.isDirectory()) {
          this.queueDir(dir, d.name, childRel);
        } else if (!(d.isFIFO() || d.isSocket() || (d.isCharacterDevice() && !this.whiteouts) || d.isBlockDevice())) {
          // Files, symlinks, and DT_UNKNOWN entries (some filesystems): lstat decides.
          this.visit(dir, d.name, childRel);
          await this.maybeYield();
        }
      }
      return true;
    } finally {
      dir.release();
    }
  }

  /** Queues the subdirectory `name` of `dir` to list, unless it is a skipped one or too deep. */
  private queueDir(dir: DirRef, name: string, rel: string): void {
    // Deeper than a path the API can name (4096 bytes) is not listed: it bounds the held descriptors too.
    if (!this.skipped.has(name) && Buffer.byteLength(rel) < MAX_REL_BYTES) this.dirs.push(dir.child(name, rel));
  }

  /** Looks at `name` in the held directory `dir`; a directory found there is queued when `descend`. */
  private visit(dir: DirRef, name: string, rel: string, descend = true): void {
    let st: BigIntStats;
    try {
      st = lstatAt(dir.fd, name, { bigint: true });
    } catch (err) {
      if (gone(err)) return;
      throw err;
    }
    if (st.isDirectory()) {
      if (descend) this.queueDir(dir, name, rel);
      return;
    }
    const entry: FileEntry = { size: Number(st.size), mode: modeString(st.mode) };
    if (st.isSymbolicLink()) {
      try {
        entry.symlink = readlinkAt(dir.fd, name);
      } catch (err) {
        if (gone(err) || (err as NodeJS.ErrnoException).code === 'EINVAL') return; // gone or no longer a link
        throw err;
      }
      entry.checksum = sha256(Buffer.from(entry.symlink));
      this.found.set(rel, entry);
      return;
    }
    if (this.whiteouts && st.isCharacterDevice() && st.rdev === 0n) {
      this.found.set(rel, { size: 0, mode: '0000', whiteout: true });
      return;
    }
    if (!st.isFile()) return;
    this.found.set(rel, entry);
    if (st.size <= BigInt(this.maxBytes)) this.checksum(dir, name, rel, st, entry);
  }

  /** The file's checksum: from the cache, hashed here (small files), or hashed in the thread pool. */
  private checksum(dir: DirRef, name: string, rel: string, st: BigIntStats, entry: FileEntry): void {
    const cached = this.cache?.lookup(rel, st);
    if (cached !== undefined) {
      entry.checksum = cached;
      this.nextCache.set(rel, cacheEntry(st, cached));
      return;
    }
    const startedNs = BigInt(Date.now()) * 1_000_000n;
    if (st.size <= BigInt(this.syncMax)) {
      this.hashedFile(rel, entry, hashFileSync(dir.fd, name, this.maxBytes), startedNs);
      return;
    }
    // The directory stays open until the file is: the file is opened in it, by name, later.
    dir.refs++;
    this.asyncWork.push(this.limit(() => hashFile(dir, name, this.maxBytes)).then((r) => this.hashedFile(rel, entry, r, startedNs)));
  }

  /** Fills in `entry` from what was opened and hashed (fstat of that file); a file gone meanwhile is not listed. */
  private hashedFile(rel: string, entry: FileEntry, r: Hashed | 'gone' | undefined, startedNs: bigint): void {
    if (r === 'gone') {
      this.found.delete(rel);
      return;
    }
    if (r === undefined) return; // unreadable: listed without checksum
    this.hashed++;
    entry.size = Number(r.st.size);
    entry.mode = modeString(r.st.mode);
    if (r.st.size > BigInt(this.maxBytes)) return;
    entry.checksum = r.checksum;
    if (startedNs - r.st.ctimeNs > this.racyNs && startedNs - r.st.mtimeNs > this.racyNs) this.nextCache.set(rel, cacheEntry(r.st, r.checksum));
  }

  private async maybeYield(): Promise<void> {
    if (performance.now() - this.sliceStart < this.sliceMs) return;
    await new Promise<void>((resolve) => setImmediate(resolve));
    this.sliceStart = performance.now();
  }
}

/** A directory held open while entries of it are still to be looked at; closed with the last. */
class DirRef {
  refs = 1;
  constructor(readonly fd: number) {}

  /** A subdirectory to open later, by name, in this one (which stays open until then). */
  child(name: string, rel: string): PendingDir {
    this.refs++;
    return { parent: this, name, rel };
  }

  release(): void {
    if (--this.refs === 0) closeFd(this.fd);
  }
}

interface PendingDir {
  /** Null for the workspace itself. */
  parent: DirRef | null;
  name: string;
  rel: string;
}

/**
 * Paths added, modified and removed between two states, each list sorted. With whiteouts (an
 * overlay's upper directory), a whiteout is a name gone and a name not listed the image's: a
 * whiteout where there was none is a removal, a file in the layer where there was none a write.
 */
export function diffStates(before: FilesystemState, after: FilesystemState): Diff {
  const added: string[] = [];
  const modified: string[] = [];
  const removed: string[] = [];
  for (const [rel, b] of Object.entries(before.files)) {
    const a = after.files[rel];
    if (b.whiteout) {
      if (a && !a.whiteout) added.push(rel);
    } else if (!a || a.whiteout) removed.push(rel);
    else if (!sameFile(b, a)) modified.push(rel);
  }
  for (const [rel, a] of Object.entries(after.files)) if (!(rel in before.files)) (a.whiteout ? removed : added).push(rel);
  return { added: added.sort(compare), modified: modified.sort(compare), removed: removed.sort(compare) };
}

function sameFile(a: FileEntry, b: FileEntry): boolean {
  if ((a.symlink === undefined) !== (b.symlink === undefined)) return false;
  if (a.checksum !== undefined && b.checksum !== undefined) return a.checksum === b.checksum;
  return a.size === b.size && a.mode === b.mode;
}

type Hashed = { st: BigIntStats; checksum: string };

// O_NONBLOCK: a file swapped for a fifo since lstat does not hang (openAt adds O_NOFOLLOW).
const OPEN_FLAGS = constants.O_RDONLY | constants.O_NONBLOCK;

function openFailed(err: unknown): 'gone' | undefined {
  const code = (err as NodeJS.ErrnoException).code;
  if (gone(err) || code === 'ELOOP') return 'gone';
  if (code === 'EACCES' || code === 'ENXIO' || code === 'EPERM') return undefined;
  throw err;
}

function hashFileSync(dirFd: number, name: string, maxBytes: number): Hashed | 'gone' | undefined {
  let fd: number;
  try {
    fd = openAt(dirFd, name, OPEN_FLAGS);
  } catch (err) {
    return openFailed(err);
  }
  try {
    const st = fstatSync(fd, { bigint: true });
    if (!st.isFile()) return 'gone';
    if (st.size > BigInt(maxBytes)) return { st, checksum: '' };
    const hash = createHash('sha256');
    const buf = Buffer.allocUnsafe(Math.max(1, Math.min(Number(st.size) + 1, 1024 * 1024)));
    for (;;) {
      const n = readSync(fd, buf, 0, buf.length, null);
      if (n === 0) break;
      hash.update(buf.subarray(0, n));
    }
    return { st, checksum: hash.digest('hex') };
  } finally {
    closeSync(fd);
  }
}

/** Opens `name` in `dir` (releasing the directory once the file is open), then hashes off the event loop. */
async function hashFile(dir: DirRef, name: string, maxBytes: number): Promise<Hashed | 'gone' | undefined> {
  let fh: Awaited<ReturnType<typeof openHandleAt>>;
  try {
    fh = await openHandleAt(dir.fd, name, OPEN_FLAGS);
  } catch (err) {
    return openFailed(err);
  } finally {
    dir.release();
  }
  try {
    const st = await fh.stat({ bigint: true });
    if (!st.isFile()) return 'gone';
    if (st.size > BigInt(maxBytes)) return { st, checksum: '' };
    const data = await fh.readFile();
    return { st, checksum: sha256(data) };
  } finally {
    await fh.close();
  }
}

function cacheEntry(st: BigIntStats, checksum: string): CacheEntry {
  return { dev: st.dev, ino: st.ino, size: st.size, mtimeNs: st.mtimeNs, ctimeNs: st.ctimeNs, checksum };
}

function sha256(data: Buffer): string {
  return createHash('sha256').update(data).digest('hex');
}

function modeString(mode: bigint | number): string {
  return (Number(mode) & 0o7777).toString(8).padStart(4, '0');
}

function gone(err: unknown): boolean {
  const code = (err as NodeJS.ErrnoException).code;
  return code === 'ENOENT' || code === 'ENOTDIR';
}

function compare(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}
