/**
 * The file endpoints' operations on a sandbox workspace (host side): read, write, delete. Setup
 * files and agent config files are written through `writeFile` too (with their own mode).
 *
 * Names go through paths.ts (`/workspace/` prefix, `..`) and beneath.ts: the path is resolved at
 * the moment of the operation, one name at a time from held directory descriptors, symlinks
 * followed only as the sandbox sees them and never out of the workspace, `.svc` read-only; the
 * file itself is opened with O_NOFOLLOW in its held directory. The agent runs at the same time and
 * may swap a directory for a symlink at any moment: that fails the call with a 400 (or is followed
 * as the link it now is, if it stays inside), it never leads the service out of the workspace.
 *
 * What `writeFile` writes (the file, and the directories it makes on the way) belongs to the owner
 * of the root it writes beneath, with exactly the mode asked for: the runtime gives the workspace
 * to the sandbox's user, so the agent and setup commands may chmod or rewrite what the service
 * wrote for them. `makeDirectory` makes such a root elsewhere (the agent's home, a check's
 * directory in the sandbox's /tmp).
 *
 * Each operation returns what the audit record needs: `{path, bytes}` with the workspace-relative path
 * the caller named. Auditing itself is the caller's (the runner records `file_read`/`file_write`/
 * `file_delete` through AuditLog, and tells the FsWatcher to ignore these paths meanwhile).
 */
import { constants, createReadStream, createWriteStream, statSync } from 'node:fs';
import { lstat, readdir, readlink, type FileHandle } from 'node:fs/promises';
import path from 'node:path';
import { pipeline } from 'node:stream/promises';
import { AppError, badRequest } from '../../kernel/errors.ts';
import {
  closeFd,
  lstatAt,
  makeDirAt,
  mapErrno,
  openHandleAt,
  openRoot,
  removeAt,
  resolveBeneath,
  symlinkAt,
  unlinkAt,
  type Owner,
  type Resolved,
} from './beneath.ts';
import { workspaceSegments } from './paths.ts';

/** Mode of files written through the API (the spec: 0644), whatever the umask. */
const FILE_MODE = 0o644;
/** Mode of parent directories the write creates. */
const DIR_MODE = 0o755;
/** Default largest file `readFile` returns (413 above). */
const DEFAULT_MAX_READ_BYTES = 64 * 1024 * 1024;

const { O_RDONLY, O_WRONLY, O_CREAT, O_EXCL, O_NONBLOCK } = constants;

export interface FileReadResult {
  path: string;
  content: Buffer;
  bytes: number;
}

export interface FileWriteResult {
  path: string;
  bytes: number;
  /** True when the file did not exist before. */
  created: boolean;
}

export interface FileDeleteResult {
  path: string;
  /** Size of the file that was removed. */
  bytes: number;
}

export async function readFile(workspace: string, input: unknown, options: { field?: string; maxBytes?: number } = {}): Promise<FileReadResult> {
  const field = options.field ?? 'path';
  const maxBytes = options.maxBytes ?? DEFAULT_MAX_READ_BYTES;
  const relative = workspaceSegments(input, field).join('/');
  return withResolved(workspace, input, { field }, async (target) => {
    const fh = await openIn(target, O_RDONLY | O_NONBLOCK, field, relative);
    try {
      const st = await fh.stat();
      if (st.isDirectory()) throw badRequest(field, 'is a directory');
      if (!st.isFile()) throw badRequest(field, 'is not a regular file');
      if (st.size > maxBytes) throw new AppError('payload_too_large', `${field}: file is ${st.size} bytes, more than the ${maxBytes} bytes a read returns`);
      const content = await fh.readFile();
      return { path: relative, content, bytes: content.length };
    } finally {
      await fh.close();
    }
  });
}

/** Copies a workspace file to `target`, a host path outside the workspace (exports); returns its size. */
export async function copyFileOut(workspace: string, input: unknown, target: string, options: { field?: string } = {}): Promise<number> {
  const field = options.field ?? 'path';
  const relative = workspaceSegments(input, field).join('/');
  return withResolved(workspace, input, { field }, async (source) => {
    const fh = await openIn(source, O_RDONLY | O_NONBLOCK, field, relative);
    try {
      const st = await fh.stat();
      if (!st.isFile()) throw badRequest(field, 'is not a regular file');
      await pipeline(fh.createReadStream({ autoClose: false }), createWriteStream(target));
      return st.size;
    } finally {
      await fh.close();
    }
  });
}

/** True when `input` names something that exists (a file or a directory; symlinks followed inside the workspace). */
export async function exists(workspace: string, input: unknown, options: { field?: string } = {}): Promise<boolean> {
  return withResolved(workspace, input, { field: options.field ?? 'path' }, async (target) => {
    if (target.dir < 0) return false;
    try {
      lstatAt(target.dir, target.name);
      return true;
    } catch {
      return false;
    }
  });
}

/**
 * Writes `content` (text as UTF-8, or bytes) as the whole file, creating parent directories;
 * `mode` (default 0644) exactly, whatever the umask. File and new directories belong to `owner`,
 * by default the owner of `workspace` (the root written beneath).
 */
export async function writeFile(
  workspace: string,
  input: unknown,
  content: unknown,
  options: { field?: string; contentField?: string; mode?: number; owner?: Owner } = {},
): Promise<FileWriteResult> {
  if (typeof content !== 'string' && !Buffer.isBuffer(content)) throw badRequest(options.contentField ?? 'content', 'must be a string');
  const data = typeof content === 'string' ? Buffer.from(content, 'utf8') : content;
  return writeWith(workspace, input, options, async (fh) => {
    await fh.writeFile(data);
    return data.length;
  });
}

/** `writeFile` with the bytes of `hostFile`, a file of the service's own (streamed, never held whole). */
export function writeFileFrom(
  workspace: string,
  input: unknown,
  hostFile: string,
  options: { field?: string; mode?: number; owner?: Owner } = {},
): Promise<FileWriteResult> {
  return writeWith(workspace, input, options, async (fh) => {
    let bytes = 0;
    for await (const chunk of createReadStream(hostFile) as AsyncIterable<Buffer>) bytes += (await fh.write(chunk)).bytesWritten;
    return bytes;
  });
}

/** Opens `input` for a whole-file write as `writeFile` says (made or truncated), lets `write` fill it, then sets owner and mode. */
async function writeWith(
  workspace: string,
  input: unknown,
  options: { field?: string; mode?: number; owner?: Owner },
  write: (fh: FileHandle) => Promise<number>,
): Promise<FileWriteResult> {
  const field = options.field ?? 'path';
  const mode = (options.mode ?? FILE_MODE) & 0o777;
  const relative = workspaceSegments(input, field).join('/');
  const owner = options.owner ?? ownerOf(workspace);
  return withResolved(workspace, input, { field, forWrite: true, createDirs: DIR_MODE, dirOwner: owner }, async (target) => {
    let fh: FileHandle;
    let created = true;
    try {
      fh = await openIn(target, O_WRONLY | O_CREAT | O_EXCL, field, relative, mode);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      created = false;
      fh = await openIn(target, O_WRONLY | O_NONBLOCK, field, relative);
    }
    try {
      const st = await fh.stat();
      if (!st.isFile()) throw badRequest(field, 'is not a regular file');
      await fh.truncate(0);
      const bytes = await write(fh);
      // Owner first: a chown may clear mode bits.
      await fh.chown(owner.uid, owner.gid);
      await fh.chmod(mode);
      return { path: relative, bytes, created };
    } finally {
      await fh.close();
    }
  });
}

/**
 * Copies the directory `from` (the service's own, e.g. an extracted bundle) into the workspace
 * under `to` ('' for the workspace itself), each name resolved beneath the workspace as it is
 * written (`writeFile`'s rules: never through a link out of it, never into `.svc`). Files and
 * directories keep their modes, symbolic links are copied as links; everything belongs to the
 * workspace's owner. Returns the workspace paths of `from`'s top-level names (what to remove later).
 */
export async function copyTreeIn(workspace: string, from: string, to: string, options: { field: string }): Promise<string[]> {
  const owner = ownerOf(workspace);
  const under = (rel: string) => (to === '' ? rel : `${to.replace(/\/+$/, '')}/${rel}`);
  const copy = async (rel: string): Promise<void> => {
    const host = path.join(from, rel);
    const st = await lstat(host);
    if (st.isSymbolicLink()) return makeLink(workspace, under(rel), await readlink(host), { field: options.field, owner });
    if (st.isFile()) {
      await writeFileFrom(workspace, under(rel), host, { field: options.field, mode: st.mode, owner });
      return;
    }
    if (!st.isDirectory()) return;
    await makeDirs(workspace, under(rel), { field: options.field, mode: st.mode & 0o777, owner });
    for (const name of await readdir(host)) await copy(path.join(rel, name));
  };
  const top = await readdir(from);
  if (to !== '') await makeDirs(workspace, to, { field: options.field, mode: DIR_MODE, owner });
  for (const name of top) await copy(name);
  return top.map(under);
}

/** Makes the directory `input` (and its parents) beneath the workspace; one already there is kept as it is. */
async function makeDirs(workspace: string, input: string, options: { field: string; mode: number; owner: Owner }): Promise<void> {
  await withResolved(workspace, input, { field: options.field, forWrite: true, createDirs: DIR_MODE, dirOwner: options.owner }, async (target) => {
    try {
      if (target.dir < 0) throw Object.assign(new Error('missing parent'), { code: 'ENOENT' });
      if (!makeDirAt(target.dir, target.name, options.mode, options.owner) && !lstatAt(target.dir, target.name).isDirectory()) {
        throw badRequest(options.field, `${input} is in the way of a directory`);
      }
    } catch (err) {
      throw mapErrno(err, options.field, input);
    }
  });
}

/** Makes the symbolic link `input` -> `linkTarget` beneath the workspace (a name already there is replaced, never followed). */
async function makeLink(workspace: string, input: string, linkTarget: string, options: { field: string; owner: Owner }): Promise<void> {
  await withResolved(
    workspace,
    input,
    { field: options.field, followFinal: false, forWrite: true, createDirs: DIR_MODE, dirOwner: options.owner },
    async (target) => {
      try {
        if (target.dir < 0) throw Object.assign(new Error('missing parent'), { code: 'ENOENT' });
        symlinkAt(target.dir, target.name, linkTarget, options.owner);
      } catch (err) {
        throw mapErrno(err, options.field, input);
      }
    },
  );
}

/** Removes `input` beneath the workspace, a directory with everything in it (a link is removed itself, never followed); quiet when missing. */
export async function removeTree(workspace: string, input: string, options: { field: string }): Promise<void> {
  await withResolved(workspace, input, { field: options.field, followFinal: false, forWrite: true }, async (target) => {
    if (target.dir >= 0) removeAt(target.dir, target.name);
  });
}

/** The owner of a root directory of the service's (its own path, not one the agent can swap). */
function ownerOf(root: string): Owner {
  const { uid, gid } = statSync(root);
  return { uid, gid };
}

/**
 * Makes the new directory `name` directly in `root` (a directory of the service's, such as the
 * sandbox's /tmp on the host) with exactly `mode`, owned by `owner` (default: the service's own
 * user); returns its host path. It must not exist yet: a name already there (made by someone
 * else) is refused, never reused.
 */
export function makeDirectory(root: string, name: string, options: { mode: number; owner?: Owner }): string {
  const fd = openRoot(root);
  try {
    if (!makeDirAt(fd, name, options.mode, options.owner)) throw new Error(`${path.join(root, name)} exists already`);
  } finally {
    closeFd(fd);
  }
  return path.join(root, name);
}

/** Removes a file (a symlink is removed itself, not its target). 404 `not_found` when missing. */
export async function deleteFile(workspace: string, input: unknown, options: { field?: string } = {}): Promise<FileDeleteResult> {
  const field = options.field ?? 'path';
  const relative = workspaceSegments(input, field).join('/');
  return withResolved(workspace, input, { field, followFinal: false, forWrite: true }, async (target) => {
    try {
      if (target.dir < 0) throw Object.assign(new Error('missing parent'), { code: 'ENOENT' });
      const st = lstatAt(target.dir, target.name);
      if (st.isDirectory()) throw badRequest(field, 'is a directory; only files can be deleted');
      // Swapped for a directory since the lstat: EISDIR, a 400.
      unlinkAt(target.dir, target.name);
      return { path: relative, bytes: st.size };
    } catch (err) {
      throw mapErrno(err, field, relative);
    }
  });
}

/** Resolves `input` beneath the workspace, runs `fn` with the final name's directory held, closes it. */
async function withResolved<T>(
  workspace: string,
  input: unknown,
  options: { field: string; followFinal?: boolean; forWrite?: boolean; createDirs?: number; dirOwner?: Owner },
  fn: (target: Resolved) => Promise<T>,
): Promise<T> {
  const field = options.field;
  const segments = workspaceSegments(input, field);
  let target: Resolved;
  try {
    target = resolveBeneath(workspace, segments, options);
  } catch (err) {
    throw mapErrno(err, field, segments.join('/'));
  }
  try {
    return await fn(target);
  } finally {
    closeFd(target.dir);
  }
}

/** Opens the resolved file (O_NOFOLLOW); EEXIST is passed on as is for the caller's create-or-open. */
async function openIn(target: Resolved, flags: number, field: string, relative: string, mode?: number): Promise<FileHandle> {
  try {
    if (target.dir < 0) throw Object.assign(new Error('missing parent'), { code: 'ENOENT' });
    return await openHandleAt(target.dir, target.name, flags, mode);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'EEXIST') throw err;
    throw mapErrno(err, field, relative);
  }
}
