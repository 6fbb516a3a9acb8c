/**
 * Workspace path rules (the spec's file endpoints, DECISIONS "Path prefixes" and "Audit log placement").
 *
 * A caller names a file in the sandbox's view: `/workspace/foo.txt` and `foo.txt` are the same file.
 * The workspace is a host directory bind-mounted at `/workspace` inside the sandbox, so the service
 * resolves every name on the host side, under these rules:
 *
 *  - the input must be a non-empty string without NUL bytes, at most 4096 bytes, each segment at most
 *    255 bytes; a leading `/workspace/` is stripped; any other absolute path is 400;
 *  - a `..` segment anywhere is 400 (the spec: "a path containing `..` is rejected"); `.` and empty
 *    segments (`a//b`, `./a`) are dropped;
 *  - symlinks are resolved the way the sandbox sees them (an absolute target `/workspace/x` means the
 *    workspace's `x`); a chain that leaves the workspace (an absolute target elsewhere, or a relative
 *    one with too many `..`) is 400 `resolves outside the workspace`, so the service never reads or
 *    writes a host file outside the workspace on behalf of a caller;
 *  - `.svc/` belongs to the service (the audit log lives there; inside the sandbox it is mounted
 *    read-only). Reading it through the API is allowed; writing or deleting under it is 403
 *    `forbidden` (the path is well-formed, the caller just may not change it), checked on the
 *    resolved path so a symlink to `.svc` does not get around it.
 *
 * `resolveWorkspacePath` applies the lexical rules only (no filesystem access). `resolveRealPath`
 * adds the symlink rules; files.ts then re-checks at open time (see there) so a symlink swapped in
 * between the check and the operation cannot redirect it either.
 */
import { lstat, readlink, realpath } from 'node:fs/promises';
import path from 'node:path';
import { AppError, badRequest } from '../../kernel/errors.ts';

/** Where the workspace is mounted inside the sandbox. */
export const SANDBOX_WORKSPACE = '/workspace';
/** The service's own directory in the workspace. */
export const SERVICE_DIR = '.svc';

const MAX_PATH_BYTES = 4096;
const MAX_SEGMENT_BYTES = 255;
const MAX_SYMLINK_HOPS = 40;

export interface WorkspacePath {
  /** Normalised workspace-relative path, `/`-separated, never empty, never starting with `/`. */
  relative: string;
  /** `path.join(workspace, relative)`: the host path, symlinks not resolved. */
  absolute: string;
}

export interface RealWorkspacePath extends WorkspacePath {
  /** The real workspace directory (workspace with its own symlinks resolved). */
  root: string;
  /** Relative path after resolving symlinks inside the workspace (components that exist). */
  realRelative: string;
  /** `path.join(root, realRelative)`. */
  real: string;
}

/**
 * Splits and validates a caller's path; returns the normalised segments. Throws 400 naming `field`.
 * Accepts a string, or a `WorkspacePath` already made by `resolveWorkspacePath` (its `relative`).
 */
export function workspaceSegments(input: unknown, field = 'path'): string[] {
  if (isWorkspacePath(input)) input = input.relative;
  if (typeof input !== 'string') throw badRequest(field, 'must be a string');
  if (input.length === 0) throw badRequest(field, 'must not be empty');
  if (input.includes('\0')) throw badRequest(field, 'must not contain NUL bytes');
  if (Buffer.byteLength(input) > MAX_PATH_BYTES) throw badRequest(field, `must be at most ${MAX_PATH_BYTES} bytes`);
  let rest = input;
  if (rest.startsWith('/')) {
    if (rest === SANDBOX_WORKSPACE || rest === `${SANDBOX_WORKSPACE}/`) throw badRequest(field, 'names the workspace itself, not a file');
    if (!rest.startsWith(`${SANDBOX_WORKSPACE}/`)) throw badRequest(field, `must be relative to the workspace or under ${SANDBOX_WORKSPACE}/`);
    rest = rest.slice(SANDBOX_WORKSPACE.length + 1);
  }
  const raw = rest.split('/');
  if (raw.includes('..')) throw badRequest(field, 'must not contain a ".." segment');
  const segments = raw.filter((s) => s !== '' && s !== '.');
  if (segments.length === 0) throw badRequest(field, 'names the workspace itself, not a file');
  for (const s of segments) {
    if (Buffer.byteLength(s) > MAX_SEGMENT_BYTES) throw badRequest(field, `each path segment must be at most ${MAX_SEGMENT_BYTES} bytes`);
  }
  return segments;
}

function isWorkspacePath(v: unknown): v is WorkspacePath {
  return typeof v === 'object' && v !== null && typeof (v as WorkspacePath).relative === 'string' && typeof (v as WorkspacePath).absolute === 'string';
}

/** Lexical rules only: see the file comment. */
export function resolveWorkspacePath(workspace: string, input: unknown, field = 'path'): WorkspacePath {
  const relative = workspaceSegments(input, field).join('/');
  return { relative, absolute: path.join(workspace, relative) };
}

/** True when `relative` (already normalised) is `.svc` or under it. */
export function isServicePath(relative: string): boolean {
  return relative === SERVICE_DIR || relative.startsWith(`${SERVICE_DIR}/`);
}

export interface ResolveOptions {
  /** Follow a symlink in the last component (reads, writes: true; delete removes the link itself: false). */
  followFinal?: boolean;
  /** Refuse (403) when the resolved path is under `.svc` (writes and deletes). */
  forWrite?: boolean;
}

/**
 * The lexical rules plus symlinks, resolved as the sandbox sees them. Components that do not exist
 * yet are appended as named (a write creates them). Throws 400 naming `field` when the chain leaves
 * the workspace, 403 when `forWrite` and the resolved path is under `.svc`.
 */
export async function resolveRealPath(
  workspace: string,
  input: unknown,
  field = 'path',
  options: ResolveOptions = {},
): Promise<RealWorkspacePath> {
  const segments = workspaceSegments(input, field);
  const relative = segments.join('/');
  const root = await realpath(workspace);
  const resolved = await resolveSegments(root, segments, field, options.followFinal ?? true);
  const realRelative = resolved.join('/');
  if (realRelative === '') throw badRequest(field, 'resolves to the workspace itself, not a file');
  if (options.forWrite && (isServicePath(relative) || isServicePath(realRelative))) {
    throw new AppError('forbidden', `${field}: ${SERVICE_DIR}/ is managed by the service and cannot be changed`);
  }
  return { relative, absolute: path.join(workspace, relative), root, realRelative, real: path.join(root, realRelative) };
}

/**
 * Walks `segments` from the real workspace root, following symlinks (sandbox view). Returns the
 * resolved segments relative to the root; components after the first missing one are kept as named.
 */
export async function resolveSegments(root: string, segments: string[], field: string, followFinal: boolean): Promise<string[]> {
  const escape = () => badRequest(field, 'resolves outside the workspace (through a symlink)');
  const done: string[] = [];
  const queue = [...segments];
  let hops = 0;
  let missing = false;
  while (queue.length > 0) {
    const seg = queue.shift()!;
    if (seg === '' || seg === '.') continue;
    if (seg === '..') {
      // Only symlink targets bring `..` here (callers' `..` is refused up front).
      if (done.length === 0) throw escape();
      done.pop();
      continue;
    }
    if (missing) {
      done.push(seg);
      continue;
    }
    const here = path.join(root, ...done, seg);
    let isLink = false;
    try {
      isLink = (await lstat(here)).isSymbolicLink();
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code !== 'ENOENT' && code !== 'ENOTDIR') throw err;
      missing = true;
    }
    const isFinal = queue.length === 0;
    if (!isLink || (isFinal && !followFinal)) {
      done.push(seg);
      continue;
    }
    if (++hops > MAX_SYMLINK_HOPS) throw badRequest(field, 'too many levels of symbolic links');
    const target = await readlink(here);
    if (target.startsWith('/')) {
      let inside: string | undefined;
      if (target === SANDBOX_WORKSPACE || target.startsWith(`${SANDBOX_WORKSPACE}/`)) inside = target.slice(SANDBOX_WORKSPACE.length);
      else if (target === root || target.startsWith(`${root}/`)) inside = target.slice(root.length); // written on the host
      if (inside === undefined) throw escape();
      done.length = 0;
      queue.unshift(...inside.split('/'));
    } else {
      queue.unshift(...target.split('/'));
    }
  }
  return done;
}
