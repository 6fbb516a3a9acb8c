/**
 * The one way the service touches names inside a sandbox's workspace from the host: every read,
 * write, listing and stat of the files API, setup files, agent config files, state, diff,
 * snapshots, the audit watcher's scans and the run checks goes through here.
 *
 * The agent runs while the service works and may swap any directory for a symlink at any moment
 * (even atomically, renameat2 RENAME_EXCHANGE), so a path string is never trusted twice. Node has
 * no openat2 (RESOLVE_BENEATH), so this is openat done by hand: a directory is held open by its
 * descriptor, and a name inside it is reached as `/proc/self/fd/<fd>/<name>`: the kernel jumps to
 * the directory that descriptor holds (whatever its path is now) and looks up that one name there.
 * With O_NOFOLLOW (opens) or lstat/readlink/unlink/mkdir (which never follow the last name), no
 * symlink is ever followed by the kernel; the symlinks the sandbox view does follow are read and
 * resolved here, one name at a time from a held directory, and a chain that would leave the
 * workspace is refused. A name is one path segment, never `.` or `..`, so nothing climbs out of a
 * held directory. The agent cannot move a held directory out of its tree either (rename across
 * the sandbox's bind mount is EXDEV).
 *
 * `resolveBeneath` resolves a caller's path as the sandbox sees it (symlinks inside the workspace
 * followed, `/workspace/...` targets meaning the workspace) and hands back the final name's
 * directory, held open. Races (a name that changed kind between two syscalls) are looked at again,
 * at most 40 times, then a 400 `changed while being resolved`; never a 500.
 *
 * Linux only (/proc/self/fd); sandboxes only run there.
 *
 * One file on purpose (~520 lines): the path-safe layer is reviewed as one unit, and `at` (a name
 * in a held directory as a path) stays private to it.
 */
import {
  closeSync,
  constants,
  fchmodSync,
  fchownSync,
  lchownSync,
  lstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readlinkSync,
  realpathSync,
  rmdirSync,
  symlinkSync,
  unlinkSync,
  type BigIntStats,
  type Dirent,
  type Stats,
} from 'node:fs';
import path from 'node:path';
import { open, type FileHandle } from 'node:fs/promises';
import { AppError, badRequest } from '../../kernel/errors.ts';
import { SANDBOX_WORKSPACE, SERVICE_DIR } from './paths.ts';

const { O_RDONLY, O_NOFOLLOW } = constants;
const O_DIRECTORY = constants.O_DIRECTORY ?? 0;
/** The kernel's own limit (MAXSYMLINKS); also bounds retries after races. */
const MAX_SYMLINK_HOPS = 40;

/** `name` inside the directory held by `dirFd`: openat(dirFd, name) as a path. */
function at(dirFd: number, name: string): string {
  if (name === '' || name === '.' || name === '..' || name.includes('/') || name.includes('\0'))
    throw new Error(`not a single path segment: ${JSON.stringify(name)}`);
  return `/proc/self/fd/${dirFd}/${name}`;
}

/** Opens the workspace directory itself (the service's own path; its parents may be symlinks). */
export function openRoot(root: string): number {
  return openSync(root, O_RDONLY | O_DIRECTORY);
}

/** Opens the directory `name` in `dirFd`; ENOTDIR when it is anything else, a symlink included. */
export function openDirAt(dirFd: number, name: string): number {
  return openSync(at(dirFd, name), O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
}

/** Opens `name` in `dirFd` (O_NOFOLLOW always: ELOOP when it is a symlink). */
export function openAt(dirFd: number, name: string, flags: number, mode?: number): number {
  return openSync(at(dirFd, name), flags | O_NOFOLLOW, mode);
}

/** `openAt` as a FileHandle, for I/O off the event loop. */
export function openHandleAt(dirFd: number, name: string, flags: number, mode?: number): Promise<FileHandle> {
  return open(at(dirFd, name), flags | O_NOFOLLOW, mode);
}

export function lstatAt(dirFd: number, name: string): Stats;
export function lstatAt(dirFd: number, name: string, options: { bigint: true }): BigIntStats;
export function lstatAt(dirFd: number, name: string, options?: { bigint: true }): Stats | BigIntStats {
  return options ? lstatSync(at(dirFd, name), options) : lstatSync(at(dirFd, name));
}

export function readlinkAt(dirFd: number, name: string): string {
  return readlinkSync(at(dirFd, name));
}

/** A host uid and gid: whom the service's writes for a sandbox belong to. */
export interface Owner {
  uid: number;
  gid: number;
}

/**
 * Makes the directory `name` in `dirFd` with exactly `mode` (no umask), owned by `owner` when
 * given; false when the name exists already. The mode and owner are set on the directory opened
 * (O_NOFOLLOW), never through a path: should the agent swap the name between the mkdir and the
 * open, a link or file is left as it is, and a directory of its own gets what it could set itself.
 */
export function makeDirAt(dirFd: number, name: string, mode: number, owner?: Owner): boolean {
  try {
    mkdirSync(at(dirFd, name), { mode });
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'EEXIST') return false;
    throw err;
  }
  let fd: number;
  try {
    fd = openDirAt(dirFd, name);
  } catch {
    return true;
  }
  try {
    if (owner) fchownSync(fd, owner.uid, owner.gid);
    fchmodSync(fd, mode);
  } finally {
    closeSync(fd);
  }
  return true;
}

export function unlinkAt(dirFd: number, name: string): void {
  unlinkSync(at(dirFd, name));
}

/** The entries of the directory held by `dirFd` (the held one, whatever its name is now). */
export function readdirFd(dirFd: number): Dirent[] {
  return readdirSync(`/proc/self/fd/${dirFd}`, { withFileTypes: true });
}

export function closeFd(fd: number): void {
  if (fd >= 0) closeSync(fd);
}

/** Directories deeper than this are left in place by `removeBeneath` (each level holds a descriptor). */
const MAX_REMOVE_DEPTH = 1024;

/**
 * Removes the directory `root` and everything in it, each name unlinked in its held parent, so a
 * directory the agent swaps for a symlink meanwhile is removed as the link, never followed (a
 * recursive `rm` by path would delete host files as root). Returns how many names it had to
 * leave (nested deeper than MAX_REMOVE_DEPTH, or changing under it); 0 when `root` is gone.
 */
export function removeBeneath(root: string): number {
  let parent: number;
  try {
    parent = openRoot(path.dirname(root));
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return 0;
    throw err;
  }
  try {
    return removeAt(parent, path.basename(root));
  } finally {
    closeSync(parent);
  }
}

/** `removeBeneath` of the name `name` in the directory held by `dirFd` (a link or file is unlinked itself). */
export function removeAt(dirFd: number, name: string): number {
  let top: number;
  try {
    top = openDirAt(dirFd, name);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') return 0;
    let left = 0;
    if (code === 'ENOTDIR' || code === 'ELOOP') removeName(dirFd, name, () => left++);
    else left++;
    return left;
  }
  let left = 0;
  // Each level: its directory, the names still to remove, and the child directory being emptied.
  const stack: Array<{ fd: number; names: string[]; entered?: string }> = [{ fd: top, names: readdirFd(top).map((e) => e.name) }];
  try {
    while (stack.length > 0) {
      const dir = stack[stack.length - 1];
      const child = dir.names.pop();
      if (child === undefined) {
        closeSync(dir.fd);
        stack.pop();
        const parent = stack[stack.length - 1];
        if (parent?.entered !== undefined) removeName(parent.fd, parent.entered, () => left++);
        continue;
      }
      let childFd: number | undefined;
      try {
        if (stack.length < MAX_REMOVE_DEPTH) childFd = openDirAt(dir.fd, child);
      } catch {
        // Not a directory (a file, a symlink, gone): unlinked below as it is.
      }
      if (childFd === undefined) {
        removeName(dir.fd, child, () => left++);
        continue;
      }
      dir.entered = child;
      stack.push({ fd: childFd, names: readdirFd(childFd).map((e) => e.name) });
    }
  } finally {
    for (const { fd } of stack) closeSync(fd);
  }
  removeName(dirFd, name, () => left++);
  return left;
}

/** Makes the symbolic link `name` -> `target` in `dirFd` (replacing a file or link there), owned by `owner`; the link itself, never what it points at. */
export function symlinkAt(dirFd: number, name: string, target: string, owner: Owner): void {
  try {
    symlinkSync(target, at(dirFd, name));
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    unlinkSync(at(dirFd, name));
    symlinkSync(target, at(dirFd, name));
  }
  lchownSync(at(dirFd, name), owner.uid, owner.gid);
}

/** Unlinks `name` in `dirFd` (rmdir when it is an empty directory); counts it with `onLeft` when it cannot go. */
function removeName(dirFd: number, name: string, onLeft: () => void): void {
  try {
    unlinkSync(at(dirFd, name));
    return;
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') return;
    if (code !== 'EISDIR' && code !== 'EPERM') return onLeft();
  }
  try {
    rmdirSync(at(dirFd, name));
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') onLeft();
  }
}

/**
 * Opens the directory at workspace-relative `segments` without following any symlink (the path is
 * a real one, e.g. from inotify). Throws the errno error (ENOTDIR for a symlink on the way).
 */
export function openDirBeneath(root: string, segments: readonly string[]): number {
  let fd = openRoot(root);
  try {
    for (const seg of segments) {
      const next = openDirAt(fd, seg);
      closeSync(fd);
      fd = next;
    }
    return fd;
  } catch (err) {
    closeSync(fd);
    throw err;
  }
}

/** lstat of a real workspace-relative path, no symlink followed on the way; undefined when not there. */
export function lstatBeneath(root: string, relative: string): Stats | undefined {
  const segments = relative.split('/');
  const name = segments.pop()!;
  let dir: number;
  try {
    dir = openDirBeneath(root, segments);
  } catch {
    return undefined;
  }
  try {
    return lstatAt(dir, name);
  } catch {
    return undefined;
  } finally {
    closeSync(dir);
  }
}

/**
 * lstatBeneath of many paths, each directory opened once (a watcher's batch of thousands of files
 * in a few directories costs one walk per directory, not per file). Missing paths are absent.
 */
export function lstatManyBeneath(root: string, relatives: Iterable<string>): Map<string, Stats> {
  const byDir = new Map<string, string[]>();
  for (const rel of relatives) {
    const cut = rel.lastIndexOf('/');
    const dir = cut < 0 ? '' : rel.slice(0, cut);
    if (!byDir.has(dir)) byDir.set(dir, []);
    byDir.get(dir)!.push(rel);
  }
  const found = new Map<string, Stats>();
  for (const [dir, rels] of byDir) {
    let fd: number;
    try {
      fd = openDirBeneath(root, dir === '' ? [] : dir.split('/'));
    } catch {
      continue;
    }
    try {
      for (const rel of rels) {
        try {
          found.set(rel, lstatAt(fd, rel.slice(dir === '' ? 0 : dir.length + 1)));
        } catch {
          // gone meanwhile
        }
      }
    } finally {
      closeSync(fd);
    }
  }
  return found;
}

export interface ResolveOptions {
  /** Field named in 400s. */
  field: string;
  /** Follow a symlink in the last component (default true; a delete removes the link itself). */
  followFinal?: boolean;
  /** Refuse (403 `forbidden`) anything under `.svc`, before creating anything. */
  forWrite?: boolean;
  /** Create missing parent directories with this mode (writes). */
  createDirs?: number;
  /** Who owns the directories `createDirs` makes (default: the service's own user). */
  dirOwner?: Owner;
}

export interface Resolved {
  /** Workspace-relative path after symlinks (sandbox view); components past a missing one as named. */
  relative: string;
  /** The directory holding `name`, open (the caller closes it with closeFd); -1 when a parent is missing. */
  dir: number;
  /** The last component, inside `dir`. */
  name: string;
}

/**
 * Resolves normalised `segments` (paths.ts `workspaceSegments`) beneath `root` as the sandbox sees
 * them. 400 naming `field` when a symlink chain leaves the workspace or loops, or a component keeps
 * changing under the walk; 403 under `.svc` when `forWrite` (checked before anything is created).
 */
export function resolveBeneath(root: string, segments: readonly string[], options: ResolveOptions): Resolved {
  const walk = new BeneathWalk(root, segments, options);
  try {
    return walk.run();
  } finally {
    walk.close();
  }
}

/** One `resolveBeneath`: the directories held, the names below the root, and the components still to resolve. */
class BeneathWalk {
  /** The root, then one held directory per name while not `missing`. */
  private readonly fds: number[];
  /** Components below the root; while not `missing`, names[i] is held by fds[i + 1]. */
  private readonly names: string[] = [];
  private readonly queue: string[];
  private readonly field: string;
  private hops = 0;
  private races = 0;
  /** A parent component does not exist (and is not to be created): the rest are only named. */
  private missing = false;
  private realRoot: string | undefined;

  constructor(
    root: string,
    segments: readonly string[],
    private readonly options: ResolveOptions,
  ) {
    this.field = options.field;
    this.fds = [openRoot(root)];
    this.queue = [...segments];
  }

  run(): Resolved {
    while (this.queue.length > 0) {
      const seg = this.queue.shift()!;
      if (seg === '' || seg === '.') continue;
      if (seg === '..') {
        this.up();
        continue;
      }
      if (this.options.forWrite && this.names.length === 0 && seg === SERVICE_DIR) {
        throw new AppError('forbidden', `${this.field}: ${SERVICE_DIR}/ is managed by the service and cannot be changed`);
      }
      if (this.missing) {
        this.names.push(seg);
        continue;
      }
      if (this.queue.length > 0) {
        this.enter(seg);
        continue;
      }
      const resolved = this.last(seg);
      if (resolved) return resolved;
    }
    return this.ranOut();
  }

  /** Closes every directory still held (the one handed back in a Resolved is no longer among them). */
  close(): void {
    for (const fd of this.fds) closeSync(fd);
  }

  private escape(): AppError {
    return badRequest(this.field, 'resolves outside the workspace (through a symlink)');
  }

  /** `..`: only symlink targets bring it here (callers' `..` is refused up front). */
  private up(): void {
    if (this.names.length === 0) throw this.escape();
    this.names.pop();
    if (!this.missing) closeSync(this.fds.pop()!);
  }

  /** The last component stays a name in its held directory, for the caller's own operation; undefined when there is more to resolve. */
  private last(seg: string): Resolved | undefined {
    const dir = this.fds.at(-1)!;
    const st = lstatIfThere(dir, seg);
    if (st?.isSymbolicLink() && (this.options.followFinal ?? true)) {
      if (!this.followLink(seg)) this.again(seg);
      return undefined;
    }
    this.fds.pop();
    return { relative: [...this.names, seg].join('/'), dir, name: seg };
  }

  /** Holds the directory `seg` of the top one; a missing one is created (`createDirs`) or noted, anything else looked at. */
  private enter(seg: string): void {
    const dir = this.fds.at(-1)!;
    try {
      this.fds.push(openDirAt(dir, seg));
      this.names.push(seg);
      return;
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === 'ENOENT' && this.options.createDirs === undefined) {
        this.missing = true;
        this.names.push(seg);
        return;
      }
      if (code === 'ENOENT') {
        makeDirAt(dir, seg, this.options.createDirs!, this.options.dirOwner);
        this.again(seg);
        return;
      }
      if (code !== 'ENOTDIR') throw err;
    }
    // Not a directory: a symlink to follow, a file (400), or it changed since the open.
    const st = lstatIfThere(dir, seg);
    if (st && !st.isSymbolicLink() && !st.isDirectory()) throw badRequest(this.field, 'a parent component is not a directory');
    if (!st?.isSymbolicLink() || !this.followLink(seg)) this.again(seg);
  }

  /**
   * The components ran out with no last name handed back: past a missing one (`dir` -1), or ending
   * in a directory reached through a symlink (`x -> ..`); the workspace itself is refused.
   */
  private ranOut(): Resolved {
    const { names, fds } = this;
    if (names.length === 0) throw badRequest(this.field, 'resolves to the workspace itself, not a file');
    if (this.missing) return { relative: names.join('/'), dir: -1, name: names.at(-1)! };
    closeSync(fds.pop()!);
    return { relative: names.join('/'), dir: fds.pop()!, name: names.at(-1)! };
  }

  /** `seg` changed kind between two syscalls (the agent is racing us): look at it again. */
  private again(seg: string): void {
    if (++this.races > MAX_SYMLINK_HOPS) throw badRequest(this.field, 'changed while being resolved; try again');
    this.queue.unshift(seg);
  }

  /** Follows the symlink `seg` of the top directory; false when it is no longer one. */
  private followLink(seg: string): boolean {
    let target: string;
    try {
      target = readlinkAt(this.fds.at(-1)!, seg);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === 'EINVAL' || code === 'ENOENT') return false;
      throw err;
    }
    this.follow(target);
    return true;
  }

  /** Queues a link's target: a relative one from where the link is, an absolute one from the root when it names the workspace. */
  private follow(target: string): void {
    if (++this.hops > MAX_SYMLINK_HOPS) throw badRequest(this.field, 'too many levels of symbolic links');
    if (!target.startsWith('/')) {
      this.queue.unshift(...pathParts(target));
      return;
    }
    this.realRoot ??= realpathSync(`/proc/self/fd/${this.fds[0]}`);
    let inside: string | undefined;
    if (target === SANDBOX_WORKSPACE || target.startsWith(`${SANDBOX_WORKSPACE}/`)) inside = target.slice(SANDBOX_WORKSPACE.length);
    else if (target === this.realRoot || target.startsWith(`${this.realRoot}/`)) inside = target.slice(this.realRoot.length); // written on the host
    if (inside === undefined) throw this.escape();
    while (this.fds.length > 1) closeSync(this.fds.pop()!);
    this.names.length = 0;
    this.queue.unshift(...pathParts(inside));
  }
}

/** A link target's components (`..` kept: the walk climbs it in its held directories). */
function pathParts(target: string): string[] {
  return target.split('/').filter((s) => s !== '' && s !== '.');
}

/** lstat of `name` in `dirFd`; undefined when it is not there. */
function lstatIfThere(dirFd: number, name: string): Stats | undefined {
  try {
    return lstatAt(dirFd, name);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    return undefined;
  }
}

/** An errno error of an operation on a resolved name, as the API's answer (unknown ones stay 500s). */
export function mapErrno(err: unknown, field: string, relative: string): unknown {
  if (err instanceof AppError) return err;
  switch ((err as NodeJS.ErrnoException).code) {
    case 'ENOENT':
      return new AppError('not_found', `file ${relative} not found`);
    case 'ENOTDIR':
      return badRequest(field, 'a parent component is not a directory');
    case 'EISDIR':
      return badRequest(field, 'is a directory');
    case 'ELOOP':
    case 'EMLINK':
      return badRequest(field, 'changed to a symbolic link while being resolved; try again');
    case 'EINVAL':
      return badRequest(field, 'changed while being resolved; try again');
    case 'ENAMETOOLONG':
      return badRequest(field, 'is too long');
    case 'ENXIO':
      return badRequest(field, 'is not a regular file');
    default:
      return err;
  }
}
