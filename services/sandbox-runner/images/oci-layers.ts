/**
 * Applies an image's layers (tar, gzip or zstd, oldest first) to a new root filesystem, with
 * OCI whiteouts: `.wh.NAME` deletes NAME of a lower layer, `.wh..wh..opq` empties its directory
 * of what lower layers put there.
 *
 * Layers come from registries and archives that may be hostile, so nothing a layer holds may
 * reach outside the root filesystem:
 *   - an entry path is taken relative to the root (a leading `/` is dropped, as GNU tar does);
 *     a `..` component fails the layer;
 *   - every parent directory is walked with lstat, and one that is a symbolic link (planted by
 *     an earlier entry or layer) fails the layer: nothing is ever written through a link;
 *   - files are created with O_EXCL|O_NOFOLLOW after the old entry is removed;
 *   - a hard link's target is resolved the same way and must already be inside;
 *   - device nodes and FIFOs are skipped: the sandbox's /dev is the runtime's own, and a device
 *     node in an image would hand its processes a device of the host;
 *   - the bytes of all files together are bounded (`maxBytes`, SVC_IMAGE_MAX_BYTES), and the
 *     layers' tars, inflated, at twice that (headers, padding and what follows a tar's end count
 *     there): a gzip or zstd bomb is refused once it has inflated that far.
 * A bomb must not stall the event loop (the api may share it): gzip is inflated on libuv's pool,
 * zstd by the `zstd` command; the tar parser gets one chunk per turn and nothing after the tar's
 * end-of-archive blocks (node-tar re-copies all it holds on every chunk after it: quadratic; those
 * bytes are only hashed for the diff id), and a tar that is itself gzip is refused (node-tar would
 * inflate it on the event loop).
 * Only this process writes into the staging root while it is built, so what lstat saw holds
 * until the write that follows it.
 *
 * Modes (setuid bits too), owners (numeric uid/gid from the tar, when running as root) and
 * modification times are kept; extended attributes (file capabilities) are not.
 */
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { PassThrough, type Readable } from 'node:stream';
import { createGunzip } from 'node:zlib';
import { Parser, type ReadEntry } from 'tar';
import { tarGate } from '../../kernel/tar-gate.ts';

export interface LayerSource {
  /** The blob's file (compressed or not). */
  file: string;
  /** The blob's digest, to name the layer in errors. */
  digest: string;
  /** The digest of the uncompressed tar (the config's `rootfs.diff_ids`), checked as it is read. */
  diffId: string;
}

interface ApplyState {
  rootfs: string;
  maxBytes: number;
  written: number;
  /** Bytes of the layers' tars, inflated (at most INFLATED_FACTOR times maxBytes). */
  inflated: number;
  asRoot: boolean;
  /** Directory times are set last: adding entries to a directory changes its mtime. */
  dirTimes: Map<string, { atime: Date; mtime: Date }>;
  /** Paths the current layer wrote, which its own opaque whiteouts must not remove. */
  layerPaths: Set<string>;
}

/** The layers' tars, inflated, may be this many times the bound on the image's files. */
export const INFLATED_FACTOR = 2;

/** Applies `layers` in order into `rootfs` (an empty directory). Throws naming the layer at fault. */
export async function applyLayers(rootfs: string, layers: LayerSource[], maxBytes: number): Promise<void> {
  const state: ApplyState = { rootfs, maxBytes, written: 0, inflated: 0, asRoot: process.getuid?.() === 0, dirTimes: new Map(), layerPaths: new Set() };
  for (const layer of layers) {
    state.layerPaths = new Set();
    try {
      await applyLayer(layer, state);
    } catch (err) {
      throw new Error(`layer ${layer.digest}: ${(err as Error).message}`);
    }
  }
  const deepestFirst = [...state.dirTimes].sort(([a], [b]) => b.split('/').length - a.split('/').length);
  for (const [rel, { atime, mtime }] of deepestFirst) {
    const dir = await existingPath(rootfs, rel.split('/'));
    if (dir && (await fs.promises.lstat(dir)).isDirectory()) await fs.promises.lutimes(dir, atime, mtime);
  }
}

async function applyLayer(layer: LayerSource, state: ApplyState): Promise<void> {
  const hash = createHash('sha256');
  let onlyZeros = true;
  const tap = new PassThrough();
  const entries = tarEntries(tap, () => onlyZeros);
  tap.on('data', (chunk: Buffer) => {
    hash.update(chunk);
    if (onlyZeros && chunk.some((b) => b !== 0)) onlyZeros = false;
    state.inflated += chunk.length;
    const bound = state.maxBytes * INFLATED_FACTOR;
    if (state.inflated > bound) tap.destroy(new Error(`the image's layers inflate to more than ${bound} bytes (${INFLATED_FACTOR} times SVC_IMAGE_MAX_BYTES)`));
  });
  const input = decompressed(layer.file);
  input.on('error', (err) => tap.destroy(err));
  input.pipe(tap);
  try {
    for await (const entry of entries) await applyEntry(entry, state);
  } finally {
    input.destroy();
  }
  const actual = `sha256:${hash.digest('hex')}`;
  if (actual !== layer.diffId) throw new Error(`wrong digest: the image config says its content is ${layer.diffId}, it is ${actual}`);
}

/** The layer's tar stream, by its magic bytes: gzip, zstd (the `zstd` command: Node 20's zlib has none) or plain. */
function decompressed(file: string): Readable {
  const magic = Buffer.alloc(4);
  const fd = fs.openSync(file, 'r');
  try {
    fs.readSync(fd, magic, 0, 4, 0);
  } finally {
    fs.closeSync(fd);
  }
  if (magic[0] === 0x1f && magic[1] === 0x8b) return fs.createReadStream(file).pipe(createGunzip());
  if (magic.equals(Buffer.from([0x28, 0xb5, 0x2f, 0xfd]))) {
    const out = new PassThrough();
    const child = spawn('zstd', ['-dc', '--', file], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString('utf8').slice(0, 2000)));
    child.on('error', (err) => out.destroy(new Error(`a zstd layer needs the zstd command: ${err.message}`)));
    child.stdout.pipe(out, { end: false });
    child.on('close', (code) => (code === 0 ? out.end() : out.destroy(new Error(`zstd could not decompress it: ${stderr.trim() || `exit ${code}`}`))));
    out.on('close', () => child.kill());
    return out;
  }
  return fs.createReadStream(file);
}

/**
 * The entries of a tar stream, one at a time: each body-carrying entry holds the parser back
 * until it is read, so entries apply in order. Any parser warning is an error, except the
 * "unrecognized archive" of a layer that is all zeros (an empty layer, as builds make).
 */
function tarEntries(input: Readable, onlyZeros: () => boolean): AsyncGenerator<ReadEntry> {
  // Wired now, not when the generator first runs: no chunk may flow before the parser listens.
  const parser = new Parser({ strict: false, brotli: false, zstd: false });
  const queue: ReadEntry[] = [];
  let ended = false;
  let failure: Error | null = null;
  let wake: (() => void) | null = null;
  const notify = (): void => {
    wake?.();
    wake = null;
  };
  parser.on('entry', (entry: ReadEntry) => {
    queue.push(entry);
    notify();
  });
  parser.on('warn', (code: string, message: string | Error) => {
    const text = typeof message === 'string' ? message : message.message;
    if (code === 'TAR_BAD_ARCHIVE' && text === 'Unrecognized archive format' && onlyZeros()) return;
    failure ??= new Error(`not a valid tar: ${text}`);
    notify();
  });
  parser.on('end', () => {
    ended = true;
    notify();
  });
  input.on('error', (err) => {
    failure ??= err;
    notify();
  });
  const gate = tarGate(parser);
  gate.on('error', (err) => {
    failure ??= err;
    notify();
  });
  input.pipe(gate).pipe(parser as unknown as NodeJS.WritableStream);
  return (async function* () {
    try {
      for (;;) {
        if (failure) throw failure;
        const next = queue.shift();
        if (next) yield next;
        else if (ended) return;
        else await new Promise<void>((resolve) => (wake = resolve));
      }
    } finally {
      input.destroy();
    }
  })();
}

/** The components of an entry's path inside the root (`[]` for the root itself). */
function entryParts(entryPath: string): string[] {
  const parts = entryPath.split('/').filter((p) => p !== '' && p !== '.');
  if (parts.includes('..')) throw new Error(`entry ${JSON.stringify(entryPath)} has a ".." component`);
  return parts;
}

/**
 * The directory `parts` inside the root, walked without following links: missing ones are made
 * (`create`) or end the walk (null); a symbolic link or a non-directory on the way is an error.
 */
async function walkDirectory(rootfs: string, parts: string[], create: boolean, entryPath: string): Promise<string | null> {
  let dir = rootfs;
  for (const [i, part] of parts.entries()) {
    const next = path.join(dir, part);
    const stat = await fs.promises.lstat(next).catch(() => null);
    if (!stat) {
      if (!create) return null;
      await fs.promises.mkdir(next, { mode: 0o755 });
    } else if (stat.isSymbolicLink()) {
      throw new Error(`entry ${JSON.stringify(entryPath)} goes through the symbolic link "${parts.slice(0, i + 1).join('/')}"; refused`);
    } else if (!stat.isDirectory()) {
      throw new Error(`entry ${JSON.stringify(entryPath)}: "${parts.slice(0, i + 1).join('/')}" is not a directory`);
    }
    dir = next;
  }
  return dir;
}

/** An existing path inside the root whose parents are all real directories, or null. */
async function existingPath(rootfs: string, parts: string[]): Promise<string | null> {
  try {
    const dir = await walkDirectory(rootfs, parts.slice(0, -1), false, parts.join('/'));
    return dir && (await fs.promises.lstat(path.join(dir, parts.at(-1)!)).catch(() => null)) ? path.join(dir, parts.at(-1)!) : null;
  } catch {
    return null;
  }
}

async function applyEntry(entry: ReadEntry, state: ApplyState): Promise<void> {
  const parts = entryParts(entry.path);
  const name = parts.at(-1);
  // The root directory itself keeps the staging directory's mode and owner.
  if (name === undefined) return void entry.resume();
  if (name.startsWith('.wh.')) {
    entry.resume();
    return whiteout(parts, entry.path, state);
  }
  const dir = (await walkDirectory(state.rootfs, parts.slice(0, -1), true, entry.path))!;
  const target = path.join(dir, name);
  state.layerPaths.add(parts.join('/'));
  switch (entry.type) {
    case 'Directory':
    case 'GNUDumpDir':
      entry.resume();
      return writeDirectory(target, parts.join('/'), entry, state);
    case 'File':
    case 'OldFile':
    case 'ContiguousFile':
      return writeFile(target, entry, state);
    case 'SymbolicLink':
      entry.resume();
      await replace(target);
      await fs.promises.symlink(entry.linkpath ?? '', target);
      if (state.asRoot) await fs.promises.lchown(target, entry.uid ?? 0, entry.gid ?? 0);
      if (entry.mtime) await fs.promises.lutimes(target, entry.atime ?? entry.mtime, entry.mtime);
      return;
    case 'Link': {
      entry.resume();
      const source = await existingPath(state.rootfs, entryParts(entry.linkpath ?? ''));
      if (!source || (await fs.promises.lstat(source)).isDirectory())
        throw new Error(`hard link ${JSON.stringify(entry.path)} to ${JSON.stringify(entry.linkpath)}: no such file inside the image`);
      if (source === target) return;
      await replace(target);
      return fs.promises.link(source, target);
    }
    default:
      // CharacterDevice, BlockDevice, FIFO: skipped (see the module comment).
      return void entry.resume();
  }
}

/** Removes whatever is at `target` (a link itself, never what it points to). */
async function replace(target: string): Promise<void> {
  await fs.promises.rm(target, { recursive: true, force: true });
}

async function writeDirectory(target: string, rel: string, entry: ReadEntry, state: ApplyState): Promise<void> {
  const stat = await fs.promises.lstat(target).catch(() => null);
  if (stat && !stat.isDirectory()) await replace(target);
  if (!stat?.isDirectory()) await fs.promises.mkdir(target, { mode: 0o700 });
  if (state.asRoot) await fs.promises.lchown(target, entry.uid ?? 0, entry.gid ?? 0);
  await fs.promises.chmod(target, entry.mode ?? 0o755);
  if (entry.mtime) state.dirTimes.set(rel, { atime: entry.atime ?? entry.mtime, mtime: entry.mtime });
}

async function writeFile(target: string, entry: ReadEntry, state: ApplyState): Promise<void> {
  if (state.written + entry.size > state.maxBytes) {
    throw new Error(`the image unpacks to more than ${state.maxBytes} bytes (SVC_IMAGE_MAX_BYTES), past it at ${JSON.stringify(entry.path)}`);
  }
  state.written += entry.size;
  await replace(target);
  const { O_WRONLY, O_CREAT, O_EXCL, O_NOFOLLOW } = fs.constants;
  const file = await fs.promises.open(target, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0o600);
  try {
    for await (const chunk of entry as AsyncIterable<Buffer>) await file.write(chunk);
    // chown before chmod: chown clears the setuid and setgid bits.
    if (state.asRoot) await file.chown(entry.uid ?? 0, entry.gid ?? 0);
    await file.chmod(entry.mode ?? 0o644);
    if (entry.mtime) await file.utimes(entry.atime ?? entry.mtime, entry.mtime);
  } finally {
    await file.close();
  }
}

/** `.wh..wh..opq` empties its directory of lower layers' entries; `.wh.NAME` removes NAME. */
async function whiteout(parts: string[], entryPath: string, state: ApplyState): Promise<void> {
  const name = parts.at(-1)!;
  const dirParts = parts.slice(0, -1);
  if (name === '.wh..wh..opq') {
    const dir = await walkDirectory(state.rootfs, dirParts, true, entryPath);
    for (const child of await fs.promises.readdir(dir!)) {
      if (!state.layerPaths.has([...dirParts, child].join('/'))) await replace(path.join(dir!, child));
    }
    return;
  }
  // Other `.wh..wh.` names are AUFS bookkeeping, not whiteouts.
  if (name.startsWith('.wh..wh.')) return;
  const victim = name.slice('.wh.'.length);
  if (victim === '' || victim === '.' || victim === '..') throw new Error(`whiteout ${JSON.stringify(entryPath)} names no entry`);
  const dir = await walkDirectory(state.rootfs, dirParts, false, entryPath);
  if (dir) await replace(path.join(dir, victim));
}
