/**
 * Workspace path rules (the spec's file endpoints, docs/decisions.md, "Path prefixes" and "Audit log placement").
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
 * `resolveWorkspacePath` applies the lexical rules only (no filesystem access). The symlink rules
 * are beneath.ts's: every operation resolves its path there, by descriptor, at the moment it acts,
 * so a symlink swapped in meanwhile cannot redirect it. `resolveRealPath` is that resolution as a
 * plain answer (where a name leads now).
 */
import { realpath } from 'node:fs/promises';
import path from 'node:path';
import { badRequest } from '../../kernel/errors.ts';
import { closeFd, resolveBeneath } from './beneath.ts';

/** Where the workspace is mounted inside the sandbox. */
export const SANDBOX_WORKSPACE = '/workspace';
/** The service's own directory in the workspace. */
export const SERVICE_DIR = '.svc';

const MAX_PATH_BYTES = 4096;
const MAX_SEGMENT_BYTES = 255;

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
 * The lexical rules plus symlinks, resolved as the sandbox sees them (beneath.ts, by descriptor).
 * Components that do not exist yet are appended as named (a write creates them). Throws 400 naming
 * `field` when the chain leaves the workspace, 403 when `forWrite` and the resolved path is under
 * `.svc`. The answer is a name, already stale when it returns: operations use `resolveBeneath`.
 */
export async function resolveRealPath(workspace: string, input: unknown, field = 'path', options: ResolveOptions = {}): Promise<RealWorkspacePath> {
  const segments = workspaceSegments(input, field);
  const relative = segments.join('/');
  const root = await realpath(workspace);
  const resolved = resolveBeneath(root, segments, { field, followFinal: options.followFinal ?? true, forWrite: options.forWrite });
  closeFd(resolved.dir);
  return { relative, absolute: path.join(workspace, relative), root, realRelative: resolved.relative, real: path.join(root, resolved.relative) };
}
