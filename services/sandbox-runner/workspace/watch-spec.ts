/**
 * What a file watch (fs-watcher.ts) is asked for: `audit.file_system.track` (the kinds of
 * operation it records) and `watch` (where), validated with a 400 naming the field, and the
 * directories inotifywait is given for them.
 */
import { lstat } from 'node:fs/promises';
import path from 'node:path';
import { badRequest } from '../../kernel/errors.ts';
import { closeFd, lstatBeneath, resolveBeneath } from './beneath.ts';
import { isServicePath, workspaceSegments } from './paths.ts';
import type { WritablePlaces } from './places.ts';

export type TrackKind = 'writes' | 'reads' | 'deletes';
export type OpKind = 'write' | 'read' | 'delete';
const TRACK_KINDS: readonly TrackKind[] = ['writes', 'reads', 'deletes'];

/** Validates `track`; 400 naming the field. */
export function parseTrack(track: unknown, field = 'audit.file_system.track'): Set<TrackKind> {
  if (!Array.isArray(track)) throw badRequest(field, 'must be a list of writes, reads, deletes');
  const out = new Set<TrackKind>();
  track.forEach((t, i) => {
    if (!TRACK_KINDS.includes(t as TrackKind)) throw badRequest(`${field}[${i}]`, 'must be one of writes, reads, deletes');
    out.add(t as TrackKind);
  });
  return out;
}

/**
 * Validates `watch` and resolves each entry to a name prefix (places.ts): '' is the whole
 * workspace, `/tmp` all of /tmp; a workspace path is resolved as the sandbox sees it (symlinks
 * followed), a path elsewhere lexically. 400 naming `watch[i]`.
 */
export function resolveWatchPrefixes(view: WritablePlaces, watch: unknown, field = 'audit.file_system.watch'): string[] {
  if (!Array.isArray(watch)) throw badRequest(field, 'must be a list of paths');
  const prefixes: string[] = [];
  for (let i = 0; i < watch.length; i++) {
    const f = `${field}[${i}]`;
    const w = watch[i];
    if (typeof w !== 'string') throw badRequest(f, 'must be a string');
    const named = view.watchPrefixes(w, f);
    if (named) {
      prefixes.push(...named);
      continue;
    }
    const resolved = resolveBeneath(view.workspace, workspaceSegments(w, f), { field: f });
    closeFd(resolved.dir);
    const rel = resolved.relative;
    if (isServicePath(rel)) throw badRequest(f, ".svc is the service's directory and is not watched");
    prefixes.push(rel);
  }
  return [...new Set(prefixes)];
}

/** Directories to hand to inotifywait: each prefix's nearest existing directory, nested ones dropped. */
export async function watchRoots(view: WritablePlaces, prefixes: string[]): Promise<string[]> {
  const dirs = new Set<string>();
  for (const p of prefixes) {
    let { root, rel } = view.locate(p);
    for (;;) {
      const abs = rel === '' ? root : path.join(root, rel);
      const st = rel === '' ? await lstat(root).catch(() => undefined) : lstatBeneath(root, rel);
      if (st?.isDirectory()) {
        dirs.add(abs);
        break;
      }
      if (rel === '') throw new Error(`${p || 'the workspace'} (${root}) is not a directory`);
      rel = rel.includes('/') ? rel.slice(0, rel.lastIndexOf('/')) : '';
    }
  }
  const sorted = [...dirs].sort((a, b) => a.length - b.length);
  return sorted.filter((d, i) => !sorted.slice(0, i).some((o) => d.startsWith(`${o}/`)));
}
