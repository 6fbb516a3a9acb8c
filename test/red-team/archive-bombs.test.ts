/**
 * Red team: archive bombs against the uploads that unpack a tenant's archive (POST /v1/bundles,
 * POST /v1/agents). `head -c 200000000 /dev/zero | gzip -1` (under 1 MB) pinned the api's event
 * loop for minutes: node-tar inflated it synchronously and, past the tar's end-of-archive blocks,
 * copied everything it held on every chunk (quadratic); /health stopped answering and the runners'
 * heartbeats went unread. The expansion guard counted entry headers only, so a pax record's body
 * inflated without bound, and nothing bounded the number of entries.
 *
 * Pinned here: the bomb is refused in seconds while /health and another tenant answer within 1 s
 * (the largest latency over polls during the upload); inflated bytes are bounded at 10 times the
 * size limit (a 413 naming `bundle`); entries at MAX_ENTRIES (a 413); after the end-of-archive
 * blocks at most MAX_TRAILING_BYTES; truncated, twice-compressed, huge-header and deep archives are
 * a 400 naming `bundle`, never a 500 or a hang; concatenated gzip members are legal gzip.
 *
 * Image layers pulled from a registry (the runner may share the api's event loop): a layer of a
 * small tar and 200 MB of zeros after it re-copied node-tar's growing buffer on every chunk (many
 * minutes), and a gzip'd .tar.gz layer was inflated again by node-tar on the event loop. Pinned:
 * both are refused within seconds, the event loop never stalls 1 s, inflated layers are bounded at
 * twice SVC_IMAGE_MAX_BYTES. The same for `svc images import` of a gzip'd OCI layout tarball
 * followed by 200 MB of zeros (node-tar inflated it synchronously, then went quadratic).
 */
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { createGzip, gzipSync } from 'node:zlib';
import { Header, Pax } from 'tar';
import type { EntryTypeName } from 'tar/types';
import { ImageStore, type PullSettings } from '../../services/sandbox-runner/images/images.ts';
import { makeBundle, uploadAgent, uploadTaskFiles } from '../helpers/bundles.ts';
import { push, REGISTRY_BINARY, sha256, startRegistry, tarOf, type TestRegistry } from '../helpers/oci-registry.ts';
import { createTenantKey, startServer, type TestServer } from '../helpers/server.ts';

const MiB = 1024 * 1024;
/** The size limits of this server: 10 times that (160 MiB) is the most a bundle may inflate to. */
const LIMIT = 16 * MiB;
const RESPONSIVE_MS = 1000;

/** A 512-byte tar header block. */
function header(path: string, size: number, type: EntryTypeName = 'File'): Buffer {
  const block = Buffer.alloc(512);
  new Header({ path, size, type, mode: 0o644, uid: 0, gid: 0, mtime: new Date(0) }).encode(block, 0);
  return block;
}

/** `gzip -1` of `head` + `zeros` zero bytes + `tail`, made 1 MiB at a time (about 4.5 KB per MiB of zeros). */
async function gzipWithZeros(head: Buffer, zeros: number, tail = Buffer.alloc(0)): Promise<Buffer> {
  const gz = createGzip({ level: 1 });
  const parts: Buffer[] = [];
  gz.on('data', (c: Buffer) => parts.push(c));
  const block = Buffer.alloc(MiB);
  gz.write(head);
  for (let n = 0; n < zeros; n += MiB) if (!gz.write(block.subarray(0, Math.min(MiB, zeros - n)))) await once(gz, 'drain');
  gz.end(tail);
  await once(gz, 'end');
  return Buffer.concat(parts);
}

describe('red team: archive bombs cannot freeze the api or grow without bound', () => {
  let server: TestServer;
  let key: string;
  let otherKey: string;

  before(async () => {
    server = await startServer({
      SVC_BUNDLES_MAX_SIZE: String(LIMIT),
      SVC_AGENTS_MAX_SIZE: String(LIMIT),
      SVC_RATE_LIMIT_WRITES: '0',
      SVC_RATE_LIMIT_READS: '0',
    });
    key = (await createTenantKey(server, 'acme')).key;
    otherKey = (await createTenantKey(server, 'globex')).key;
  });
  after(async () => server?.cleanup());

  /** One GET's latency in ms (10 s when it does not answer by then), asserting a 200. */
  const latency = async (p: string, k: string | null): Promise<number> => {
    const started = performance.now();
    try {
      const res = await fetch(`${server.url}${p}`, { headers: k ? { authorization: `Bearer ${k}` } : {}, signal: AbortSignal.timeout(10_000) });
      await res.arrayBuffer();
      assert.equal(res.status, 200, `GET ${p}`);
    } catch (err) {
      if ((err as Error).name !== 'TimeoutError') throw err;
    }
    return performance.now() - started;
  };

  /**
   * Runs `uploads`, polling /health and another tenant's bundle list meanwhile; resolves with their
   * answers and the largest latency seen. The uploads must answer within 60 s.
   */
  async function whilePolling<T>(uploads: Array<Promise<T>>): Promise<{ results: T[]; worstMs: number }> {
    let done = false;
    let worstMs = 0;
    const poll = (async () => {
      while (!done) {
        const [health, other] = await Promise.all([latency('/health', null), latency('/v1/bundles', otherKey)]);
        worstMs = Math.max(worstMs, health, other);
        await new Promise((r) => setTimeout(r, 50));
      }
    })();
    let timer: NodeJS.Timeout | undefined;
    const deadline = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error('the uploads did not answer within 60 s')), 60_000)));
    try {
      const results = await Promise.race([Promise.all(uploads), deadline]);
      return { results, worstMs };
    } finally {
      clearTimeout(timer);
      done = true;
      await poll;
    }
  }

  const refused = (res: { status: number; body: any; text: string }, status: number, message: RegExp) => {
    assert.equal(res.status, status, res.text);
    assert.equal(res.body.error, status === 413 ? 'payload_too_large' : 'bad_request', res.text);
    assert.match(res.body.message, message);
  };

  test('200 MB of zeros, gzip -1 (under 1 MB), to /v1/bundles and /v1/agents: refused while /health and another tenant answer within 1 s', async () => {
    const bomb = await gzipWithZeros(Buffer.alloc(0), 200e6);
    assert.ok(bomb.length < MiB, `${bomb.length} bytes compressed`);
    const started = performance.now();
    const { results, worstMs } = await whilePolling([
      uploadTaskFiles(server, key, bomb),
      uploadAgent(server, key, { name: 'bomb', entrypoint: ['python3', 'main.py'] }, bomb),
    ]);
    for (const res of results) refused(res, 400, /^bundle: has more than 1048576 bytes after the end of its tar archive/);
    assert.ok(worstMs < RESPONSIVE_MS, `the largest latency of /health and another tenant during the bombs was ${Math.round(worstMs)} ms`);
    assert.ok(performance.now() - started < 20_000, 'refused in seconds');
  });

  test('a bundle whose headers declare a few bytes but that inflates to 200 MB (a pax record of zeros) is a 413 at 10 times the limit', async () => {
    // node-tar skips a pax record over 1 MiB without an entry: only the inflated bytes count it.
    const bomb = await gzipWithZeros(header('PaxHeader/x', 200 * MiB, 'ExtendedHeader'), 200 * MiB, Buffer.concat([header('main.py', 0), Buffer.alloc(1024)]));
    const { results, worstMs } = await whilePolling([
      uploadTaskFiles(server, key, bomb),
      uploadAgent(server, key, { name: 'paxbomb', entrypoint: ['python3', 'main.py'] }, bomb),
    ]);
    for (const res of results)
      refused(res, 413, new RegExp(`^bundle: expands to more than ${10 * LIMIT} bytes unpacked \\(10 times (bundles|agents)\\.max_size\\)`));
    assert.ok(worstMs < RESPONSIVE_MS, `largest latency ${Math.round(worstMs)} ms`);
  });

  test('210,000 empty entries (2 MB compressed, 108 MB unpacked) are a 413 naming the bound on entries', async () => {
    const blocks: Buffer[] = [];
    for (let i = 0; i < 210_000; i++) blocks.push(header(`f${i}`, 0));
    const bomb = gzipSync(Buffer.concat([...blocks, Buffer.alloc(1024)]), { level: 1 });
    assert.ok(bomb.length < LIMIT, `${bomb.length} bytes compressed`);
    const { results, worstMs } = await whilePolling([uploadTaskFiles(server, key, bomb)]);
    refused(results[0]!, 413, /^bundle: holds more than 200000 entries/);
    assert.ok(worstMs < RESPONSIVE_MS, `largest latency ${Math.round(worstMs)} ms`);
  });

  test('truncated, twice-compressed, huge-header and deep archives are a 400 or 413 naming `bundle`, never a 500 or a hang', async () => {
    const good = await makeBundle({ 'main.py': 'print(1)\n' });
    const tar = Buffer.concat([header('main.py', 9), Buffer.from('print(1)\n'.padEnd(512, '\0')), Buffer.alloc(1024)]);
    const cases: Array<[string, Buffer, number, RegExp]> = [
      ['a gzip stream cut in half', good.subarray(0, good.length - 12), 400, /^bundle: is not a valid \.tar\.gz archive \(gzip: unexpected end of file\)/],
      ['a tar cut inside an entry', gzipSync(tar.subarray(0, 600)), 400, /^bundle: is not a valid \.tar\.gz archive/],
      ['a .tar.gz compressed again', gzipSync(good), 400, /^bundle: is compressed twice/],
      ['a header declaring an 8 GiB file and nothing after it', gzipSync(header('huge.bin', 8 * 1024 * MiB)), 413, /^bundle: expands to more than/],
      [
        'a path 3,000 directories deep (a pax record)',
        gzipSync(Buffer.concat([new Pax({ path: `${'d/'.repeat(3000)}f` }).encode(), header('f', 0), Buffer.alloc(1024)])),
        400,
        /^bundle: entry .* over 4096 bytes/,
      ],
      [
        'a pax record declaring a size of 10^15 bytes',
        gzipSync(Buffer.concat([new Pax({ size: 1e15 }).encode(), header('f', 0), Buffer.alloc(1024)])),
        413,
        /^bundle: expands to more than/,
      ],
      ['bytes that are not gzip', Buffer.from('PK\u0003\u0004 a zip file'), 400, /^bundle: is not gzip-compressed/],
    ];
    for (const [what, body, status, message] of cases) {
      const started = performance.now();
      const res = await uploadTaskFiles(server, key, body);
      assert.equal(res.status, status, `${what}: ${res.text}`);
      assert.match(res.body.message, message, what);
      assert.ok(performance.now() - started < 5000, `${what}: answered in ${Math.round(performance.now() - started)} ms`);
    }
    // Concatenated gzip members are one legal gzip stream (what `cat a.gz b.gz` makes).
    const members = Buffer.concat([gzipSync(tar.subarray(0, 512)), gzipSync(tar.subarray(512))]);
    const res = await uploadTaskFiles(server, key, members);
    assert.equal(res.status, 201, res.text);
    assert.equal(res.body.entries, 1);
  });
});

/** The sha256 of `head` + `zeros` zero bytes + `tail` (a layer's diff id). */
function diffIdOf(head: Buffer, zeros: number, tail = Buffer.alloc(0)): string {
  const hash = createHash('sha256').update(head);
  const block = Buffer.alloc(MiB);
  for (let n = 0; n < zeros; n += MiB) hash.update(block.subarray(0, Math.min(MiB, zeros - n)));
  return `sha256:${hash.update(tail).digest('hex')}`;
}

/** An OCI image of one layer blob (gzip or zstd), whose inflated bytes hash to `diffId`. */
function imageOf(layer: Buffer, diffId: string, compression: 'gzip' | 'zstd' = 'gzip'): { blobs: Map<string, Buffer>; manifest: Buffer } {
  const config = Buffer.from(JSON.stringify({ architecture: 'amd64', os: 'linux', config: {}, rootfs: { type: 'layers', diff_ids: [diffId] } }));
  const manifest = Buffer.from(
    JSON.stringify({
      schemaVersion: 2,
      mediaType: 'application/vnd.oci.image.manifest.v1+json',
      config: { mediaType: 'application/vnd.oci.image.config.v1+json', digest: sha256(config), size: config.length },
      layers: [{ mediaType: `application/vnd.oci.image.layer.v1.tar+${compression}`, digest: sha256(layer), size: layer.length }],
    }),
  );
  return {
    blobs: new Map([
      [sha256(config), config],
      [sha256(layer), layer],
    ]),
    manifest,
  };
}

const noRegistry = fs.existsSync(REGISTRY_BINARY) ? null : `${REGISTRY_BINARY} is not installed (npm test installs it as root)`;

describe('red team: image layer bombs from a registry', { skip: noRegistry ?? false }, () => {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'svc-layer-bombs-'));
  const MAX_BYTES = 32 * MiB;
  let registry: TestRegistry;
  let settings: PullSettings;

  before(async () => {
    registry = await startRegistry();
    settings = { registryAuth: null, registryInsecure: [registry.host], registryMirror: null, imageMaxBytes: MAX_BYTES };
  });
  after(async () => {
    await registry?.stop();
    fs.rmSync(root, { recursive: true, force: true });
  });

  /** Pulls `reference` into a fresh store (or runs `work` on it), measuring the event loop's largest stall meanwhile (this process is the runner). */
  async function pullTimed(
    reference: string,
    work: (store: ImageStore) => Promise<unknown> = (store) => store.pullImage(reference, settings),
  ): Promise<{ error: Error | null; stallMs: number; tookMs: number }> {
    const store = new ImageStore(path.join(fs.mkdtempSync(path.join(root, 'store-')), 'images'));
    let last = performance.now();
    let stallMs = 0;
    const ticker = setInterval(() => {
      stallMs = Math.max(stallMs, performance.now() - last);
      last = performance.now();
    }, 20);
    const started = performance.now();
    let timer: NodeJS.Timeout | undefined;
    const deadline = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error('the pull did not end within 60 s')), 60_000)));
    try {
      const error = await Promise.race([
        work(store).then(
          () => null,
          (err: Error) => err,
        ),
        deadline,
      ]);
      return { error, stallMs, tookMs: performance.now() - started };
    } finally {
      clearTimeout(timer);
      clearInterval(ticker);
    }
  }

  test('a layer of a small tar and 200 MB of zeros after its end is refused at twice SVC_IMAGE_MAX_BYTES, the event loop never stalled', async () => {
    const tar = tarOf([
      { path: 'bin/', type: 'dir' },
      { path: 'bin/sh', body: '#!fake\n', mode: 0o755 },
    ]);
    const layer = await gzipWithZeros(tar, 200e6);
    await push(registry, 'bomb', 'trailing', imageOf(layer, diffIdOf(tar, 200e6)));
    const { error, stallMs, tookMs } = await pullTimed(`${registry.host}/bomb:trailing`);
    assert.match(String(error?.message), new RegExp(`inflate to more than ${2 * MAX_BYTES} bytes \\(2 times SVC_IMAGE_MAX_BYTES\\)`));
    assert.ok(stallMs < RESPONSIVE_MS, `the event loop stalled ${Math.round(stallMs)} ms`);
    assert.ok(tookMs < 20_000, `refused in ${Math.round(tookMs)} ms`);
  });

  test('the same as zstd (the `zstd` command inflates it): refused at the same bound, the event loop never stalled', async () => {
    const tar = tarOf([
      { path: 'bin/', type: 'dir' },
      { path: 'bin/sh', body: '#!fake\n', mode: 0o755 },
    ]);
    const head = path.join(root, 'head.tar');
    fs.writeFileSync(head, tar);
    const layer = execFileSync('sh', ['-c', `{ cat "$0"; head -c 200000000 /dev/zero; } | zstd -q -c`, head], { maxBuffer: 64 * MiB });
    await push(registry, 'bomb', 'zstd', imageOf(layer, diffIdOf(tar, 200e6), 'zstd'));
    const { error, stallMs, tookMs } = await pullTimed(`${registry.host}/bomb:zstd`);
    assert.match(String(error?.message), new RegExp(`inflate to more than ${2 * MAX_BYTES} bytes`));
    assert.ok(stallMs < RESPONSIVE_MS, `the event loop stalled ${Math.round(stallMs)} ms`);
    assert.ok(tookMs < 20_000, `refused in ${Math.round(tookMs)} ms`);
  });

  test('a layer whose tar is itself gzip (a bomb inside) is refused, not inflated on the event loop', async () => {
    const inner = await gzipWithZeros(Buffer.alloc(0), 200e6);
    const layer = gzipSync(inner);
    await push(registry, 'bomb', 'twice', imageOf(layer, sha256(inner)));
    const { error, stallMs, tookMs } = await pullTimed(`${registry.host}/bomb:twice`);
    assert.match(String(error?.message), /layer sha256:[0-9a-f]{64}: compressed twice/);
    assert.ok(stallMs < RESPONSIVE_MS, `the event loop stalled ${Math.round(stallMs)} ms`);
    assert.ok(tookMs < 20_000, `refused in ${Math.round(tookMs)} ms`);
  });

  test('svc images import of a gzip tarball that starts as an OCI layout and goes on with 200 MB of zeros: refused in seconds, the event loop never stalled', async () => {
    const head = tarOf([
      { path: 'oci-layout', body: '{"imageLayoutVersion":"1.0.0"}' },
      { path: 'index.json', body: '{"schemaVersion":2,"manifests":[]}' },
      { path: 'blobs/', type: 'dir' },
    ]);
    const archive = path.join(root, 'bomb.tar.gz');
    fs.writeFileSync(archive, await gzipWithZeros(head, 200e6));
    const { error, stallMs, tookMs } = await pullTimed('', (store) => store.importImage('bomb:import', archive, { maxBytes: MAX_BYTES }));
    assert.match(String(error?.message), new RegExp(`inflates to more than ${2 * MAX_BYTES} bytes \\(2 times SVC_IMAGE_MAX_BYTES\\)`));
    assert.ok(stallMs < RESPONSIVE_MS, `the event loop stalled ${Math.round(stallMs)} ms`);
    assert.ok(tookMs < 20_000, `refused in ${Math.round(tookMs)} ms`);
  });
});
