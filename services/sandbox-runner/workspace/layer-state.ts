/**
 * The state of a writable root over an image, seen from the host (the reconciliation's view of
 * `/`): the overlay's upper directory (captureState with whiteouts: a whiteout is a name gone, a
 * name not listed the image's, unchanged), plus, as whiteouts, the image's files the layer hides
 * without a whiteout of their own: overlayfs marks a directory removed (`rm -r /etc/x`) with one
 * whiteout, and one removed and made again as opaque, not each file under it. The upper directory
 * is the agent's and the image's links lead anywhere, so every walk here goes by descriptor
 * (beneath.ts), never through a link.
 */
import { fstatSync } from 'node:fs';
import { closeFd, lstatBeneath, openDirAt, openDirBeneath, openRoot, readdirFd } from './beneath.ts';
import { captureState, type CaptureOptions, type FilesystemState } from './state.ts';

export interface Layer {
  /** the overlay's upper directory */
  upper: string;
  /** the image below it */
  lower: string;
  /** the overlay as mounted (the sandbox's /, `/proc/<pid>/root`), asked which directories are opaque; null: not asked */
  merged: string | null;
}

const GONE = { size: 0, mode: '0000', whiteout: true } as const;
/** The longest path walked (as captureState: it bounds the held descriptors). */
const MAX_REL_BYTES = 4096;

/** The layer's state (see above): its files, and as whiteouts every name of the image it hides. */
export async function captureLayer(layer: Layer, options: CaptureOptions = {}): Promise<FilesystemState> {
  // every directory: a layer's node_modules or .git is the system's, not a workspace's to skip
  const state = await captureState(layer.upper, { ...options, whiteouts: true, everyDirectory: true });
  // A name of the layer over a directory of the image (a whiteout, a file, a link) hides all of it.
  const hiding = Object.keys(state.files);
  const merged = layer.merged ? openMerged(layer.merged) : null;
  if (merged !== null) {
    try {
      // Named gone as a whiteout would name them (a directory too), then what they held.
      for (const rel of opaqueHidden(layer, merged)) {
        state.files[rel] ??= { ...GONE };
        hiding.push(rel);
      }
    } finally {
      closeFd(merged);
    }
  }
  for (const rel of hiding) {
    for (const name of await imageFiles(layer.lower, rel)) state.files[`${rel}/${name}`] ??= { ...GONE };
  }
  return state;
}

/** The files of the image's directory `rel` (relative to it), none when that is not a directory of the image. */
async function imageFiles(lower: string, rel: string): Promise<string[]> {
  let fd: number;
  try {
    fd = openDirBeneath(lower, rel.split('/'));
  } catch {
    return [];
  }
  try {
    return Object.keys((await captureState(`/proc/self/fd/${fd}`, { checksumMaxBytes: 0, everyDirectory: true })).files);
  } finally {
    closeFd(fd);
  }
}

/** The merged view's root, held open (the sandbox may end meanwhile); null when it is gone already: no directory is then taken for opaque. */
function openMerged(merged: string): number | null {
  try {
    return openRoot(merged);
  } catch {
    return null;
  }
}

/**
 * The image's names in the upper directory's directories that the merged view (held by
 * `mergedFd`) no longer shows: those of an opaque directory. A directory of the merged view on
 * another filesystem (a mount point: /tmp, /workspace) is not looked into.
 */
function opaqueHidden(layer: Layer, mergedFd: number): string[] {
  const hidden: string[] = [];
  const merged = `/proc/self/fd/${mergedFd}`;
  const rootDev = fstatSync(mergedFd).dev;
  const stack: Array<{ fd: number; rel: string }> = [{ fd: openRoot(layer.upper), rel: '' }];
  while (stack.length > 0) {
    const { fd, rel } = stack.pop()!;
    try {
      const entries = readdirFd(fd);
      const inUpper = new Set(entries.map((d) => d.name));
      const absent = imageNames(layer.lower, rel).filter((name) => !inUpper.has(name));
      const join = (name: string) => (rel === '' ? name : `${rel}/${name}`);
      if (absent.length > 0 && lstatBeneath(merged, join(absent[0]!)) === undefined) hidden.push(...absent.map(join));
      for (const d of entries) {
        const child = join(d.name);
        if (!d.isDirectory() || Buffer.byteLength(child) >= MAX_REL_BYTES || lstatBeneath(merged, child)?.dev !== rootDev) continue;
        try {
          stack.push({ fd: openDirAt(fd, d.name), rel: child });
        } catch {
          // gone or swapped since the listing
        }
      }
    } finally {
      closeFd(fd);
    }
  }
  return hidden;
}

/** The names in the image's directory `rel`; none when it is not one. */
function imageNames(lower: string, rel: string): string[] {
  let fd: number;
  try {
    fd = openDirBeneath(lower, rel === '' ? [] : rel.split('/'));
  } catch {
    return [];
  }
  try {
    return readdirFd(fd).map((d) => d.name);
  } finally {
    closeFd(fd);
  }
}
