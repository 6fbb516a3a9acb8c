/**
 * Image archives: what `docker save` writes (`manifest.json` naming a config and layer tars,
 * and since Docker 25 an OCI layout beside it) and OCI image layouts (`oci-layout`,
 * `index.json`, `blobs/sha256/...`), as a directory or a tarball (plain or gzip). Their blobs
 * go into the blob cache, each checked against its digest; when both descriptions are there the
 * OCI one is read.
 *
 * A tarball is unpacked into a scratch directory with node-tar (which keeps every entry inside
 * it), keeping only files, directories and links; a file of the layout is read only when its
 * real path, links resolved, is inside the layout. Like a layer, it is inflated by node's zlib
 * (not node-tar's, on the event loop), parsed only up to its end-of-archive blocks and bounded
 * inflated at twice SVC_IMAGE_MAX_BYTES (oci-layers.ts).
 */
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { Transform, type Readable } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { createGunzip } from 'node:zlib';
import { Parser, type ReadEntry, x as extractTar } from 'tar';
import { tarGate } from '../../kernel/tar-gate.ts';
import { INFLATED_FACTOR } from './oci-layers.ts';
import { type BlobCache, choosePlatform, type Descriptor, DIGEST, MAX_CONFIG_BYTES, MAX_MANIFEST_BYTES, parseImageDocument, sha256Digest } from './oci.ts';

export interface ArchiveImage {
  /** The manifest's digest (OCI layouts); null for the older `docker save` format, which has no manifest. */
  digest: string | null;
  config: Descriptor;
  /** Layer blobs, in order, as stored in the cache. */
  layers: string[];
}

/** The first entries of a `docker save` or OCI archive, where a root filesystem has `./`, `bin/`, `etc/`... */
const ARCHIVE_ENTRY = /^(\.\/)?(blobs\/|oci-layout$|index\.json$|manifest\.json$|repositories$|[a-f0-9]{64}(\/|\.json$))/;

/** Whether `source` (a directory or a tarball) is an image archive rather than a root filesystem. */
export async function isImageArchive(source: string): Promise<boolean> {
  const stat = await fs.promises.stat(source);
  if (stat.isDirectory()) return ['index.json', 'manifest.json'].some((f) => fs.existsSync(path.join(source, f))) && !fs.existsSync(path.join(source, 'bin'));
  const names = await firstEntryNames(source, 3);
  return names.length > 0 && names.every((n) => ARCHIVE_ENTRY.test(n));
}

/** The paths of a tarball's first `count` entries (the root `./` left out), read without unpacking it. */
function firstEntryNames(file: string, count: number): Promise<string[]> {
  return new Promise((resolve) => {
    const names: string[] = [];
    const input = inflated(file);
    const parser = new Parser({ strict: false, brotli: false, zstd: false });
    const finish = (): void => {
      input.destroy();
      resolve(names);
    };
    parser.on('entry', (entry: ReadEntry) => {
      if (entry.path !== './') names.push(entry.path);
      entry.resume();
      if (names.length >= count) finish();
    });
    parser.on('end', finish);
    parser.on('eof', finish);
    parser.on('warn', finish);
    input.on('error', finish);
    const gate = tarGate(parser);
    gate.on('error', finish);
    input.pipe(gate).pipe(parser as unknown as NodeJS.WritableStream);
  });
}

/** A tarball's bytes, inflated by node's zlib when they are gzip (node-tar would inflate them on the event loop). */
function inflated(file: string): Readable {
  const magic = Buffer.alloc(2);
  const fd = fs.openSync(file, 'r');
  try {
    fs.readSync(fd, magic, 0, 2, 0);
  } finally {
    fs.closeSync(fd);
  }
  const input = fs.createReadStream(file);
  if (magic[0] !== 0x1f || magic[1] !== 0x8b) return input;
  const gunzip = createGunzip();
  input.on('error', (err) => gunzip.destroy(err));
  return input.pipe(gunzip);
}

/** Unpacks the tarball `source` into `into`: files, directories and links only, at most `bound` bytes inflated. */
async function unpackTarball(source: string, into: string, bound: number): Promise<void> {
  const kept = new Set(['File', 'OldFile', 'Directory', 'SymbolicLink', 'Link']);
  const unpack = extractTar({ cwd: into, strict: true, preserveOwner: false, filter: (_p, entry) => kept.has((entry as ReadEntry).type) });
  let bytes = 0;
  const counted = new Transform({
    transform(chunk: Buffer, _encoding, done) {
      bytes += chunk.length;
      done(bytes > bound ? new Error(`${source} inflates to more than ${bound} bytes (${INFLATED_FACTOR} times SVC_IMAGE_MAX_BYTES)`) : null, chunk);
    },
  });
  await pipeline(inflated(source), counted, tarGate(unpack), unpack as unknown as NodeJS.WritableStream);
}

/**
 * The image of the archive at `source` whose name `matches` (or its only image), with its
 * config and layers put into `cache`. `scratch` is a directory where a tarball may be unpacked.
 */
export async function readImageArchive(
  source: string,
  matches: (name: string) => boolean,
  cache: BlobCache,
  scratch: string,
  maxBytes: number,
): Promise<ArchiveImage> {
  const stat = await fs.promises.stat(source);
  const unpacked = stat.isDirectory() ? null : path.join(scratch, `.archive-${randomBytes(6).toString('hex')}`);
  try {
    if (unpacked) {
      await fs.promises.mkdir(unpacked, { recursive: true });
      await unpackTarball(source, unpacked, maxBytes * INFLATED_FACTOR);
    }
    const layout = await fs.promises.realpath(unpacked ?? source);
    if (fs.existsSync(path.join(layout, 'index.json'))) return await readOciLayout(layout, source, matches, cache);
    if (fs.existsSync(path.join(layout, 'manifest.json'))) return await readDockerSave(layout, source, matches, cache);
    throw new Error(`${source} is neither an OCI image layout (index.json) nor a docker save archive (manifest.json)`);
  } finally {
    if (unpacked) await fs.promises.rm(unpacked, { recursive: true, force: true });
  }
}

/** A regular file of the layout, its real path inside it (a link may not lead out). */
async function layoutFile(layout: string, rel: string, what: string): Promise<string> {
  const real = await fs.promises.realpath(path.join(layout, rel)).catch(() => null);
  if (!real?.startsWith(`${layout}${path.sep}`) || !(await fs.promises.stat(real)).isFile()) throw new Error(`${what}: ${rel} is missing from the archive`);
  return real;
}

async function readJson(layout: string, rel: string, what: string): Promise<unknown> {
  const file = await layoutFile(layout, rel, what);
  if ((await fs.promises.stat(file)).size > MAX_MANIFEST_BYTES) throw new Error(`${what}: ${rel} is too large`);
  try {
    return JSON.parse(await fs.promises.readFile(file, 'utf8'));
  } catch {
    throw new Error(`${what}: ${rel} is not JSON`);
  }
}

/** A blob of the layout into the cache, checked against its digest. */
async function importBlob(layout: string, digest: string, size: number | undefined, cache: BlobCache, what: string): Promise<string> {
  if (!DIGEST.test(digest)) throw new Error(`${what}: unsupported digest ${JSON.stringify(digest)}`);
  const file = await layoutFile(layout, `blobs/sha256/${digest.slice('sha256:'.length)}`, what);
  if (cache.has(digest)) return cache.pathOf(digest);
  return cache.write(fs.createReadStream(file), { digest, size }, what);
}

async function readOciLayout(layout: string, source: string, matches: (name: string) => boolean, cache: BlobCache): Promise<ArchiveImage> {
  const index = parseImageDocument(Buffer.from(JSON.stringify(await readJson(layout, 'index.json', source))), undefined, `${source}: index.json`);
  if (index.kind !== 'index') throw new Error(`${source}: index.json is not an index`);
  const named = (d: Descriptor): string[] =>
    ['io.containerd.image.name', 'org.opencontainers.image.ref.name'].map((k) => d.annotations?.[k]).filter((n): n is string => !!n);
  const chosen = index.manifests.find((d) => named(d).some(matches)) ?? (index.manifests.length === 1 ? index.manifests[0] : undefined);
  if (!chosen)
    throw new Error(
      `${source} holds ${index.manifests.length} images and none is named so: ${index.manifests.flatMap(named).join(', ') || 'they have no names'}`,
    );
  let doc = parseImageDocument(
    await readBlob(layout, chosen, `${source}: manifest ${chosen.digest}`),
    chosen.mediaType,
    `${source}: manifest ${chosen.digest}`,
  );
  if (doc.kind === 'index') {
    const platform = choosePlatform(doc.manifests, `${source}: ${chosen.digest}`);
    doc = parseImageDocument(
      await readBlob(layout, platform, `${source}: manifest ${platform.digest}`),
      platform.mediaType,
      `${source}: manifest ${platform.digest}`,
    );
    if (doc.kind !== 'manifest') throw new Error(`${source}: the index's entry ${platform.digest} is another index`);
  }
  await importBlob(layout, doc.config.digest, doc.config.size, cache, `${source}: config`);
  const layers: string[] = [];
  for (const layer of doc.layers) layers.push(await importBlob(layout, layer.digest, layer.size, cache, `${source}: layer ${layer.digest}`));
  return { digest: chosen.digest, config: doc.config, layers };
}

/** A manifest blob of the layout, read whole and checked against its descriptor. */
async function readBlob(layout: string, descriptor: Descriptor, what: string): Promise<Buffer> {
  if (descriptor.size > MAX_MANIFEST_BYTES) throw new Error(`${what}: larger than ${MAX_MANIFEST_BYTES} bytes`);
  const bytes = await fs.promises.readFile(await layoutFile(layout, `blobs/sha256/${descriptor.digest.slice('sha256:'.length)}`, what));
  const actual = sha256Digest(bytes);
  if (actual !== descriptor.digest) throw new Error(`${what}: wrong digest: expected ${descriptor.digest}, the content is ${actual}`);
  return bytes;
}

async function readDockerSave(layout: string, source: string, matches: (name: string) => boolean, cache: BlobCache): Promise<ArchiveImage> {
  const entries = await readJson(layout, 'manifest.json', source);
  if (!Array.isArray(entries) || entries.length === 0) throw new Error(`${source}: manifest.json lists no image`);
  const tags = (e: { RepoTags?: unknown }): string[] => (Array.isArray(e.RepoTags) ? e.RepoTags.filter((t): t is string => typeof t === 'string') : []);
  const chosen = (entries.find((e) => tags(e).some(matches)) ?? (entries.length === 1 ? entries[0] : undefined)) as
    | { Config?: unknown; Layers?: unknown }
    | undefined;
  if (!chosen) throw new Error(`${source} holds ${entries.length} images and none is tagged so: ${entries.flatMap(tags).join(', ') || 'they have no tags'}`);
  if (typeof chosen.Config !== 'string' || !Array.isArray(chosen.Layers) || !chosen.Layers.every((l) => typeof l === 'string'))
    throw new Error(`${source}: manifest.json: an entry without Config or Layers`);
  const configFile = await layoutFile(layout, chosen.Config, source);
  if ((await fs.promises.stat(configFile)).size > MAX_CONFIG_BYTES) throw new Error(`${source}: ${chosen.Config} is too large`);
  const configBytes = await fs.promises.readFile(configFile);
  const config = { digest: sha256Digest(configBytes), size: configBytes.length };
  // The older format's layers are plain tars whose digests are the config's diff_ids; the newer one names blobs.
  const diffIds = ((JSON.parse(configBytes.toString('utf8')) as { rootfs?: { diff_ids?: string[] } }).rootfs?.diff_ids ?? []) as string[];
  if (diffIds.length !== chosen.Layers.length)
    throw new Error(`${source}: ${chosen.Config} lists ${diffIds.length} layers, manifest.json ${chosen.Layers.length}`);
  if (!cache.has(config.digest)) await cache.write(fs.createReadStream(configFile), config, `${source}: config`);
  const layers: string[] = [];
  for (const [i, rel] of (chosen.Layers as string[]).entries()) {
    const blob = /^blobs\/sha256\/([a-f0-9]{64})$/.exec(rel);
    const digest = blob ? `sha256:${blob[1]}` : diffIds[i]!;
    const file = await layoutFile(layout, rel, source);
    layers.push(cache.has(digest) ? cache.pathOf(digest) : await cache.write(fs.createReadStream(file), { digest }, `${source}: layer ${rel}`));
  }
  return { digest: null, config, layers };
}
