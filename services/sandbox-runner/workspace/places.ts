/**
 * Where the agent can write, as the service reaches it from the host: the workspace, and the
 * runtime's other writable places (/tmp and /dev/shm, and `/` itself for a writable root: the
 * directory that takes its writes, SandboxHandle.writablePlaces). A file is
 * named the way the audit records name it: workspace-relative in the workspace (`src/a.py`, as the
 * files API names it), by its absolute path in the sandbox elsewhere (`/tmp/a`). The file watch,
 * the reconciliation and `file_writes_outside` all speak these names.
 */
import { realpath } from 'node:fs/promises';
import path from 'node:path';
import { badRequest } from '../../kernel/errors.ts';
import { SANDBOX_WORKSPACE } from './paths.ts';

/**
 * A writable place other than the workspace: where the sandbox sees it, and its host directory.
 * `/` is a writable root's layer, under every other place: a name goes to the deepest place holding it.
 */
export interface Place {
  at: string;
  host: string;
  /** The image below, when `host` is an overlay's upper directory (a character device 0/0 in it is a whiteout: a name deleted). */
  lower?: string;
}

export class WritablePlaces {
  private constructor(
    /** The workspace's real host directory. */
    readonly workspace: string,
    readonly others: readonly Place[],
  ) {}

  /** With every host directory's symlinks resolved (inotify reports real paths). */
  static async of(workspace: string, others: readonly Place[] = []): Promise<WritablePlaces> {
    const resolved = await Promise.all(others.map(async (p) => ({ ...p, host: await realpath(p.host) })));
    // Deepest first: /tmp's files are /tmp's, not the root layer's.
    return new WritablePlaces(
      await realpath(workspace),
      resolved.sort((a, b) => b.at.length - a.at.length),
    );
  }

  /** Every host directory: the workspace first. */
  get roots(): string[] {
    return [this.workspace, ...this.others.map((p) => p.host)];
  }

  /** Every place by the name of its root: `''` for the workspace, then `/tmp`, `/dev/shm`. */
  get names(): string[] {
    return ['', ...this.others.map((p) => p.at)];
  }

  /** The name of a host path; null outside every place and for a place's root itself. */
  nameOf(hostPath: string): string | null {
    if (hostPath.startsWith(`${this.workspace}/`)) return hostPath.slice(this.workspace.length + 1);
    for (const p of this.others) if (hostPath.startsWith(`${p.host}/`)) return childName(p.at, hostPath.slice(p.host.length + 1));
    return null;
  }

  /** The host directory a name is under and its path beneath it (`''`: the place's root). */
  locate(name: string): { root: string; rel: string } {
    if (!name.startsWith('/')) return { root: this.workspace, rel: name };
    const p = this.placeOf(name);
    if (!p) throw new Error(`${name} is in no writable place`);
    return { root: p.host, rel: name === p.at ? '' : name.slice(p.at === '/' ? 1 : p.at.length + 1) };
  }

  /** The place a name is in, or undefined for the workspace's names. */
  placeOf(name: string): Place | undefined {
    return this.others.find((p) => underPrefix(name, p.at));
  }

  /**
   * A `watch` entry of the sandbox's view as a name prefix: `/` is every place, `/workspace` or `.`
   * the workspace, `/tmp/x` a path in a place; null for a workspace path (paths.ts resolves those).
   * 400 naming `field` for an absolute path where the agent cannot write or a `..` segment.
   */
  watchPrefixes(entry: string, field: string): string[] | null {
    if (entry === '/') return this.names;
    if (entry === '.' || entry === './' || entry === SANDBOX_WORKSPACE || entry === `${SANDBOX_WORKSPACE}/`) return [''];
    if (!entry.startsWith('/') || entry.startsWith(`${SANDBOX_WORKSPACE}/`)) return null;
    const segments = entry.split('/').filter((s) => s !== '' && s !== '.');
    if (segments.includes('..')) throw badRequest(field, 'must not contain a ".." segment');
    const name = `/${segments.join('/')}`;
    const p = this.placeOf(name);
    if (!p)
      throw badRequest(field, `is not a place the agent can write (${[SANDBOX_WORKSPACE, ...this.others.map((o) => o.at)].join(', ')}, or / for all of them)`);
    return [name];
  }
}

/** `name` is `prefix` or under it (`''` is the whole workspace, whose names are relative; `/` every absolute name). */
export function underPrefix(name: string, prefix: string): boolean {
  if (prefix === '') return !name.startsWith('/');
  if (prefix === '/') return name.startsWith('/');
  return name === prefix || name.startsWith(`${prefix}/`);
}

/** `path.join` for names: `/tmp` + `a` is `/tmp/a`, `/` + `a` is `/a`, `''` + `a` is `a`. */
export function childName(parent: string, child: string): string {
  return parent === '' ? child : path.posix.join(parent, child);
}
