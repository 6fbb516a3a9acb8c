/**
 * The file endpoints' operations on a sandbox workspace (host side): read, write, delete.
 *
 * Names go through paths.ts (`/workspace/` prefix, `..`, symlinks as the sandbox sees them, `.svc`
 * read-only). The agent runs at the same time and may swap a directory for a symlink between that
 * check and the operation, so the operation itself does not trust the path again: it walks the
 * resolved path one directory at a time with O_NOFOLLOW, each step opened relative to the previous
 * directory's descriptor (through /proc/self/fd, i.e. openat), and opens the file with O_NOFOLLOW
 * relative to the last one. A component that became a symlink fails the walk (400). Off Linux
 * (no /proc/self/fd) it falls back to plain paths after the check.
 *
 * Each operation returns what the audit record needs: `{path, bytes}` with the workspace-relative path
 * the caller named. Auditing itself is the caller's (the runner records `file_read`/`file_write`/
 * `file_delete` through AuditLog, and tells the FsWatcher to ignore these paths meanwhile).
 */
import { constants, existsSync } from 'node:fs';
import { lstat, mkdir, open, readlink, unlink, type FileHandle } from 'node:fs/promises';
import path from 'node:path';
import { AppError, badRequest } from '../../kernel/errors.ts';
import { resolveRealPath, type RealWorkspacePath } from './paths.ts';

/** Mode of files written through the API (the spec: 0644), whatever the umask. */
export const FILE_MODE = 0o644;
/** Mode of parent directories the write creates. */
export const DIR_MODE = 0o755;
/** Default largest file `readFile` returns (413 above). */
export const DEFAULT_MAX_READ_BYTES = 64 * 1024 * 1024;

const PROC_FD = process.platform === 'linux' && existsSync('/proc/self/fd');
const { O_RDONLY, O_WRONLY, O_CREAT, O_NOFOLLOW, O_NONBLOCK } = constants;
const O_DIRECTORY = constants.O_DIRECTORY ?? 0;

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

export async function readFile(
  workspace: string,
  input: unknown,
  options: { field?: string; maxBytes?: number } = {},
): Promise<FileReadResult> {
  const field = options.field ?? 'path';
  const maxBytes = options.maxBytes ?? DEFAULT_MAX_READ_BYTES;
  const target = await resolveRealPath(workspace, input, field, { followFinal: true });
  const dir = await openParent(target, field, false);
  let fh: FileHandle | undefined;
  try {
    fh = await openIn(dir, target, O_RDONLY | O_NOFOLLOW | O_NONBLOCK, field);
    const st = await fh.stat();
    if (st.isDirectory()) throw badRequest(field, 'is a directory');
    if (!st.isFile()) throw badRequest(field, 'is not a regular file');
    if (st.size > maxBytes) throw new AppError('payload_too_large', `${field}: file is ${st.size} bytes, more than the ${maxBytes} bytes a read returns`);
    const content = await fh.readFile();
    return { path: target.relative, content, bytes: content.length };
  } finally {
    await fh?.close();
    await dir?.close();
  }
}

export async function writeFile(
  workspace: string,
  input: unknown,
  content: unknown,
  options: { field?: string; contentField?: string } = {},
): Promise<FileWriteResult> {
  const field = options.field ?? 'path';
  if (typeof content !== 'string') throw badRequest(options.contentField ?? 'content', 'must be a string');
  const target = await resolveRealPath(workspace, input, field, { followFinal: true, forWrite: true });
  const data = Buffer.from(content, 'utf8');
  const dir = await openParent(target, field, true);
  let fh: FileHandle | undefined;
  let created = true;
  try {
    try {
      fh = await openIn(dir, target, O_WRONLY | O_CREAT | constants.O_EXCL | O_NOFOLLOW, field, FILE_MODE);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      created = false;
      fh = await openIn(dir, target, O_WRONLY | O_NOFOLLOW | O_NONBLOCK, field);
    }
    const st = await fh.stat();
    if (!st.isFile()) throw badRequest(field, 'is not a regular file');
    await fh.truncate(0);
    await fh.writeFile(data);
    await fh.chmod(FILE_MODE);
    return { path: target.relative, bytes: data.length, created };
  } finally {
    await fh?.close();
    await dir?.close();
  }
}

/** Removes a file (a symlink is removed itself, not its target). 404 `not_found` when missing. */
export async function deleteFile(workspace: string, input: unknown, options: { field?: string } = {}): Promise<FileDeleteResult> {
  const field = options.field ?? 'path';
  const target = await resolveRealPath(workspace, input, field, { followFinal: false, forWrite: true });
  const dir = await openParent(target, field, false);
  try {
    const name = path.basename(target.real);
    const where = dir ? `/proc/self/fd/${dir.fd}/${name}` : target.real;
    let bytes: number;
    try {
      const st = await lstat(where);
      if (st.isDirectory()) throw badRequest(field, 'is a directory; only files can be deleted');
      bytes = st.size;
      await unlink(where);
    } catch (err) {
      throw mapErrno(err, field, target.relative);
    }
    return { path: target.relative, bytes };
  } finally {
    await dir?.close();
  }
}

/**
 * Opens the parent directory of `target` by walking from the root with O_NOFOLLOW at each step,
 * creating missing directories when `create`. Returns undefined off Linux (plain paths are used).
 * 404 when a parent is missing and not created.
 */
async function openParent(target: RealWorkspacePath, field: string, create: boolean): Promise<FileHandle | undefined> {
  const parents = target.realRelative.split('/').slice(0, -1);
  if (!PROC_FD) {
    if (create) await mkdir(path.dirname(target.real), { recursive: true, mode: DIR_MODE });
    return undefined;
  }
  let dir = await open(target.root, O_RDONLY | O_DIRECTORY);
  try {
    for (const seg of parents) {
      const next = `/proc/self/fd/${dir.fd}/${seg}`;
      let child: FileHandle;
      try {
        child = await open(next, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
      } catch (err) {
        const code = (err as NodeJS.ErrnoException).code;
        if (code === 'ENOENT' && create) {
          try {
            await mkdir(next, { mode: DIR_MODE });
          } catch (e) {
            if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
          }
          child = await open(next, O_RDONLY | O_DIRECTORY | O_NOFOLLOW).catch((e) => {
            throw mapErrno(e, field, target.relative);
          });
        } else {
          throw mapErrno(err, field, target.relative);
        }
      }
      await dir.close();
      dir = child;
    }
    // Belt and braces: the directory we hold is where the check said it would be.
    const held = await readlink(`/proc/self/fd/${dir.fd}`);
    const expected = path.dirname(target.real);
    if (held !== expected) throw badRequest(field, 'changed while being resolved; try again');
    return dir;
  } catch (err) {
    await dir.close();
    throw err;
  }
}

async function openIn(dir: FileHandle | undefined, target: RealWorkspacePath, flags: number, field: string, mode?: number): Promise<FileHandle> {
  const where = dir ? `/proc/self/fd/${dir.fd}/${path.basename(target.real)}` : target.real;
  try {
    return await open(where, flags, mode);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'EEXIST') throw err;
    throw mapErrno(err, field, target.relative);
  }
}

function mapErrno(err: unknown, field: string, relative: string): unknown {
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
    case 'ENAMETOOLONG':
      return badRequest(field, 'is too long');
    case 'ENXIO':
      return badRequest(field, 'is not a regular file');
    default:
      return err;
  }
}
