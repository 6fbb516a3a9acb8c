/**
 * Layers the image builder makes: a list of entries written as an uncompressed tar (ustar, with
 * PAX records for long names, large sizes and large ids), and the entries of an overlay's upper
 * directory after a RUN step: its files with their owners shifted back to the ids the sandbox
 * saw, and its whiteouts (character devices 0/0, and names of the image a directory's
 * recreation hid) written as OCI whiteouts (`.wh.NAME`).
 */
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import type { RootChanges } from '../runtimes/runtime.ts';
import { ROOT_IDS_DEFAULT } from '../runtimes/local/sandbox-root.ts';

export interface LayerEntry {
  /** Relative to the root, `/`-separated, no leading or trailing slash. */
  path: string;
  type: 'file' | 'dir' | 'symlink' | 'link' | 'whiteout';
  /** The host file a `file` entry's bytes come from. */
  source?: string;
  /** A symbolic link's target; a hard link's first path (relative to the root). */
  linkpath?: string;
  mode: number;
  uid: number;
  gid: number;
  /** Seconds since the epoch. */
  mtime: number;
  size: number;
}

const NOBODY = 65_534;
/** What a RUN step's layer leaves out: /run is the sandbox's runtime state (the supervisor's mount point is there). */
const RUNTIME_ONLY = new Set(['run']);
const TYPE_FLAGS = { file: '0', whiteout: '0', link: '1', symlink: '2', dir: '5' } as const;

/** Writes `entries` as a tar to `file`; returns its sha256 digest (its diff id). */
export async function writeLayerTar(entries: LayerEntry[], file: string): Promise<string> {
  const hash = createHash('sha256');
  const out = await fs.promises.open(file, 'w', 0o644);
  const write = async (bytes: Buffer): Promise<void> => {
    hash.update(bytes);
    await out.write(bytes);
  };
  try {
    for (const entry of entries) {
      for (const block of headerBlocks(entry)) await write(block);
      if (entry.type !== 'file' || entry.size === 0) continue;
      let copied = 0;
      for await (const chunk of fs.createReadStream(entry.source!) as AsyncIterable<Buffer>) {
        copied += chunk.length;
        if (copied > entry.size) throw new Error(`${entry.source} grew while it was written into a layer`);
        await write(chunk);
      }
      if (copied !== entry.size) throw new Error(`${entry.source} shrank while it was written into a layer`);
      await write(Buffer.alloc((512 - (entry.size % 512)) % 512));
    }
    await write(Buffer.alloc(1024));
  } finally {
    await out.close();
  }
  return `sha256:${hash.digest('hex')}`;
}

/** The header of an entry, after a PAX header when ustar's fields cannot hold it. */
function headerBlocks(entry: LayerEntry): Buffer[] {
  const name = entry.type === 'dir' ? `${entry.path}/` : entry.type === 'whiteout' ? whiteoutPath(entry.path) : entry.path;
  const size = entry.type === 'file' ? entry.size : 0;
  const pax: Record<string, string> = {};
  if (Buffer.byteLength(name) > 100) pax.path = name;
  if (entry.linkpath && Buffer.byteLength(entry.linkpath) > 100) pax.linkpath = entry.linkpath;
  if (size > 0o77777777777) pax.size = String(size);
  if (entry.uid > 0o7777777) pax.uid = String(entry.uid);
  if (entry.gid > 0o7777777) pax.gid = String(entry.gid);
  const main = ustar({
    name,
    size,
    flag: TYPE_FLAGS[entry.type],
    linkpath: entry.linkpath ?? '',
    mode: entry.type === 'whiteout' ? 0 : entry.mode,
    uid: entry.uid,
    gid: entry.gid,
    mtime: entry.mtime,
  });
  if (Object.keys(pax).length === 0) return [main];
  const records = Buffer.from(
    Object.entries(pax)
      .map(([key, value]) => paxRecord(key, value))
      .join(''),
    'utf8',
  );
  const paxHeader = ustar({ name: 'PaxHeader', size: records.length, flag: 'x', linkpath: '', mode: 0o644, uid: 0, gid: 0, mtime: entry.mtime });
  return [paxHeader, records, Buffer.alloc((512 - (records.length % 512)) % 512), main];
}

function whiteoutPath(victim: string): string {
  const dir = path.posix.dirname(victim);
  return `${dir === '.' ? '' : `${dir}/`}.wh.${path.posix.basename(victim)}`;
}

/** `LEN key=value\n`, LEN counting itself. */
function paxRecord(key: string, value: string): string {
  const body = ` ${key}=${value}\n`;
  let length = Buffer.byteLength(body) + 1;
  while (String(length).length + Buffer.byteLength(body) !== length) length++;
  return `${length}${body}`;
}

function ustar(h: { name: string; size: number; flag: string; linkpath: string; mode: number; uid: number; gid: number; mtime: number }): Buffer {
  const octal = (value: number, width: number): string =>
    `${Math.min(value, 8 ** (width - 1) - 1)
      .toString(8)
      .padStart(width - 1, '0')}\0`;
  const header = Buffer.alloc(512);
  header.write(h.name, 0, 100, 'utf8');
  header.write(octal(h.mode & 0o7777, 8), 100, 'ascii');
  header.write(octal(h.uid, 8), 108, 'ascii');
  header.write(octal(h.gid, 8), 116, 'ascii');
  header.write(octal(h.size, 12), 124, 'ascii');
  header.write(octal(Math.max(0, Math.floor(h.mtime)), 12), 136, 'ascii');
  header.write(h.flag, 156, 'ascii');
  header.write(h.linkpath, 157, 100, 'utf8');
  header.write('ustar\u000000', 257, 'ascii');
  header.fill(' ', 148, 156);
  const sum = header.reduce((a, b) => a + b, 0);
  header.write(`${sum.toString(8).padStart(6, '0')}\0 `, 148, 'ascii');
  return header;
}

/** The entry of a host file at `rel` (lstat'ed, never followed); hard links after the first refer to it through `inodes`. */
export async function fileEntry(host: string, rel: string, owner: (id: number) => number, inodes: Map<string, string>): Promise<LayerEntry | null> {
  const stat = await fs.promises.lstat(host);
  const base = { path: rel, mode: stat.mode & 0o7777, uid: owner(stat.uid), gid: owner(stat.gid), mtime: Math.floor(stat.mtimeMs / 1000), size: 0 };
  if (stat.isDirectory()) return { ...base, type: 'dir' };
  if (stat.isSymbolicLink()) return { ...base, type: 'symlink', linkpath: await fs.promises.readlink(host) };
  if (!stat.isFile()) return null;
  const inode = `${stat.dev}:${stat.ino}`;
  const first = stat.nlink > 1 ? inodes.get(inode) : undefined;
  if (first) return { ...base, type: 'link', linkpath: first };
  if (stat.nlink > 1) inodes.set(inode, rel);
  return { ...base, type: 'file', source: host, size: stat.size };
}

/**
 * The layer a RUN step left in a writable root (RootChanges): the upper directory's entries,
 * parents first. A name of the image that is in neither the upper directory nor the sandbox's
 * merged view was hidden (a whiteout, or a directory removed and made again: overlayfs marks
 * that opaque) and becomes a whiteout. Sockets, FIFOs and devices are left out.
 */
export async function upperLayer(changes: RootChanges): Promise<LayerEntry[]> {
  const shift = changes.idShift;
  const owner = (id: number): number => (id >= shift && id < shift + ROOT_IDS_DEFAULT.count ? id - shift : NOBODY);
  const entries: LayerEntry[] = [];
  const inodes = new Map<string, string>();
  const walk = async (rel: string): Promise<void> => {
    const names = (await fs.promises.readdir(path.join(changes.upper, rel))).sort();
    for (const name of names) {
      if (!rel && RUNTIME_ONLY.has(name)) continue;
      const childRel = rel ? `${rel}/${name}` : name;
      const host = path.join(changes.upper, childRel);
      const stat = await fs.promises.lstat(host);
      if (stat.isCharacterDevice() && stat.rdev === 0) {
        entries.push({ path: childRel, type: 'whiteout', mode: 0, uid: 0, gid: 0, mtime: Math.floor(stat.mtimeMs / 1000), size: 0 });
        continue;
      }
      const entry = await fileEntry(host, childRel, owner, inodes);
      if (!entry) continue;
      entries.push(entry);
      if (entry.type === 'dir') await walk(childRel);
    }
    const kept = rel ? names : [...names, ...RUNTIME_ONLY];
    entries.push(...(await hiddenNames(changes, rel, new Set(kept))));
  };
  await walk('');
  return entries;
}

/** Names of the image's directory `rel` gone from the merged view without a whiteout in the upper directory. */
async function hiddenNames(changes: RootChanges, rel: string, inUpper: Set<string>): Promise<LayerEntry[]> {
  const lower = path.join(changes.lower, rel);
  // Only a real directory of the image, never through one of its links.
  if ((await fs.promises.realpath(lower).catch(() => null)) !== path.resolve(lower)) return [];
  if (!(await fs.promises.lstat(lower)).isDirectory()) return [];
  const hidden: LayerEntry[] = [];
  for (const name of (await fs.promises.readdir(lower)).sort()) {
    if (inUpper.has(name)) continue;
    const merged = await fs.promises.lstat(path.join(changes.merged, rel, name)).catch(() => null);
    if (!merged) hidden.push({ path: rel ? `${rel}/${name}` : name, type: 'whiteout', mode: 0, uid: 0, gid: 0, mtime: 0, size: 0 });
  }
  return hidden;
}

/** A temporary file name beside `dir`'s contents. */
export function tempName(dir: string, prefix: string): string {
  return path.join(dir, `.${prefix}-${randomBytes(6).toString('hex')}`);
}
