/**
 * The scan of a directory the file watch (fs-watcher.ts) saw created: files already in it when its
 * CREATE arrives were perhaps written before its watch. Walked by descriptor (beneath.ts), never
 * through a symlink: the agent may have swapped the directory for a link to a host directory or
 * another sandbox's workspace by now.
 */
import type { Dirent } from 'node:fs';
import { closeFd, openDirAt, openDirBeneath, readdirFd } from './beneath.ts';
import { childName, type WritablePlaces } from './places.ts';

/** Calls `onFile` with the name (places.ts) of every file and symlink under the directory named `rel`, depth first. */
export async function scanNewDir(view: WritablePlaces, rel: string, onFile: (name: string) => void): Promise<void> {
  let top: number;
  try {
    const at = view.locate(rel);
    top = openDirBeneath(at.root, at.rel.split('/'));
  } catch {
    return; // gone, or no longer a directory
  }
  // Depth first, one held descriptor per level.
  const stack: { fd: number; rel: string; entries?: Dirent[]; next: number }[] = [{ fd: top, rel, next: 0 }];
  try {
    while (stack.length > 0) {
      const dir = stack.at(-1)!;
      if (!dir.entries) {
        try {
          dir.entries = readdirFd(dir.fd);
        } catch {
          dir.entries = [];
        }
      }
      const d = dir.entries[dir.next++];
      if (!d) {
        closeFd(stack.pop()!.fd);
        await new Promise<void>((resolve) => setImmediate(resolve));
        continue;
      }
      const child = childName(dir.rel, d.name);
      if (d.isDirectory()) {
        // Deeper than a path the API can name is not scanned (it bounds the held descriptors).
        if (Buffer.byteLength(child) >= 4096) continue;
        try {
          stack.push({ fd: openDirAt(dir.fd, d.name), rel: child, next: 0 });
        } catch {
          // Gone or swapped for something else since the listing: not entered.
        }
      } else if (d.isFile() || d.isSymbolicLink()) {
        onFile(child);
      }
    }
  } finally {
    for (const dir of stack) closeFd(dir.fd);
  }
}
