// Images from registries and image archives, against a real registry: Debian's `docker-registry`
// on the loopback, with images this file builds and pushes over the distribution API. No mocks.
// `npm test` installs docker-registry with the sandbox packages (it provisions SVC_TEST_BWRAP
// for this file, which also boots a pulled image in a sandbox); where it cannot be installed the
// tests are skipped with the reason, and under CI=true that is a failure instead.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { gzipSync } from 'node:zlib';
import { ensureImage, imagesCommand, ImageStore, type PullSettings } from '../../services/sandbox-runner/images/images.ts';
import { LocalRuntime } from '../../services/sandbox-runner/runtimes/local/local-runtime.ts';
import { hostPlatform } from '../../services/sandbox-runner/images/oci.ts';
import {
  blobGets,
  buildImage,
  buildIndex,
  push,
  REGISTRY_BINARY,
  sha256,
  shellLayer,
  startRegistry,
  startTokenService,
  storedBlob,
  type TarEntry,
  tarOf,
  type TestRegistry,
} from '../helpers/oci-registry.ts';
import { freePort } from '../helpers/ports.ts';

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'svc-image-pull-'));
const unavailable = fs.existsSync(REGISTRY_BINARY)
  ? null
  : `${REGISTRY_BINARY} is not installed (apt-get install docker-registry; npm test installs it as root)`;
const ARCH = hostPlatform().architecture;
const OTHER_ARCH = ARCH === 's390x' ? 'riscv64' : 's390x';
const SH: TarEntry[] = [
  { path: 'bin/', type: 'dir' },
  { path: 'bin/sh', body: '#!fake shell\n', mode: 0o755 },
];

let registry: TestRegistry;
let settings: PullSettings;
let stores = 0;

/** A fresh store (own data dir, own blob cache). */
function newStore(): { store: ImageStore; dataDir: string } {
  const dataDir = path.join(root, `data-${++stores}`);
  return { store: new ImageStore(path.join(dataDir, 'images')), dataDir };
}

/** Leftovers of a failed pull: staging directories and half-written blobs. */
function leftovers(store: ImageStore): string[] {
  const staged = fs.existsSync(store.dir) ? fs.readdirSync(store.dir).filter((f) => f.startsWith('.')) : [];
  const blobs = path.join(store.dir, 'blobs', 'sha256');
  return [...staged, ...(fs.existsSync(blobs) ? fs.readdirSync(blobs).filter((f) => f.startsWith('.')) : [])];
}

async function pushImage(
  repository: string,
  tag: string,
  layers: TarEntry[][],
  run: Record<string, unknown> = {},
): Promise<{ manifest: string; layers: string[] }> {
  const image = buildImage(layers.map(tarOf), run);
  const manifest = await push(registry, repository, tag, image);
  return { manifest, layers: [...image.blobs.keys()].slice(1) };
}

if (unavailable) {
  if (process.env.CI === 'true') test('image pulls', () => assert.fail(`${unavailable}; under CI=true the registry tests are mandatory`));
  else test('image pulls', { skip: unavailable }, () => {});
} else {
  before(async () => {
    registry = await startRegistry();
    settings = { registryAuth: null, registryInsecure: [registry.host], registryMirror: null, imageMaxBytes: 1024 ** 3 };
  });
  after(async () => {
    await registry?.stop();
    fs.rmSync(root, { recursive: true, force: true });
  });

  describe('pulls from a registry', () => {
    const big = randomBytes(3 * 1024 * 1024);
    const run = { Env: ['PATH=/usr/bin:/bin', 'GREETING=hi'], Entrypoint: ['python3'], Cmd: ['agent.py'], WorkingDir: '/app', User: '1000:1000' };
    const base: TarEntry[] = [
      ...SH,
      { path: 'etc/', type: 'dir' },
      { path: 'etc/msg', body: 'hello\n' },
      { path: 'etc/link', type: 'symlink', linkpath: 'msg' },
      { path: 'app/', type: 'dir', mode: 0o750, uid: 1000, gid: 1000, mtime: 1_500_000_000 },
      { path: 'app/run.py', body: 'print(1)\n', mode: 0o640, uid: 1000, gid: 1000, mtime: 1_600_000_000 },
      { path: 'app/hard', type: 'link', linkpath: 'app/run.py' },
      { path: 'app/setuid', body: 'x', mode: 0o4755 },
      { path: 'app/fifo', type: 'fifo' },
      { path: 'app/big', body: big },
    ];
    const upper: TarEntry[] = [
      { path: 'etc/msg', body: 'hello again\n' },
      { path: 'app/extra', body: 'extra\n' },
    ];
    let index: string;
    let hostManifest: string;
    let layerDigests: string[];
    let otherLayer: string;

    before(async () => {
      // An index of two platforms: this host's (a gzip, a zstd and an empty plain layer) and another.
      const other = buildImage([tarOf([...SH, { path: 'other', body: 'other arch' }])], {}, 'gzip', OTHER_ARCH);
      await push(registry, 'pulled', `${OTHER_ARCH}-only`, other);
      otherLayer = [...other.blobs.keys()][1]!;
      const mine = buildImage([tarOf(base), tarOf(upper), Buffer.alloc(1024)], run, ['gzip', 'zstd', 'none'], ARCH);
      hostManifest = await push(registry, 'pulled', ARCH, mine);
      layerDigests = [...mine.blobs.keys()].slice(1);
      const indexBytes = buildIndex([
        { manifest: other.manifest, arch: OTHER_ARCH },
        { manifest: mine.manifest, arch: ARCH },
      ]);
      index = await push(registry, 'pulled', '1', { blobs: new Map(), manifest: indexBytes });
    });

    test('by tag: the index picks this platform, layers apply in order with modes, owners and times', { timeout: 60_000 }, async () => {
      const { store } = newStore();
      const { image, downloaded, cached, upToDate } = await store.pullImage(`${registry.host}/pulled:1`, settings);
      assert.deepEqual({ downloaded, cached, upToDate }, { downloaded: 3, cached: 0, upToDate: false });
      assert.equal(image.name, `${registry.host}/pulled:1`);
      assert.equal(image.source, `${registry.host}/pulled:1`);
      assert.equal(image.digest, index);
      assert.equal(image.manifestDigest, hostManifest);
      assert.deepEqual(image.layers, layerDigests);
      assert.deepEqual(image.config, { env: run.Env, entrypoint: run.Entrypoint, cmd: run.Cmd, workdir: '/app', user: '1000:1000' });
      assert.deepEqual(image.entrypoint, ['python3', 'agent.py']);
      const stored = JSON.parse(fs.readFileSync(path.join(image.rootfs, '..', 'image.json'), 'utf8'));
      assert.equal(stored.digest, index);
      const at = (p: string): string => path.join(image.rootfs, p);
      assert.equal(fs.readFileSync(at('etc/msg'), 'utf8'), 'hello again\n');
      assert.equal(fs.readFileSync(at('app/extra'), 'utf8'), 'extra\n');
      assert.ok(fs.readFileSync(at('app/big')).equals(big));
      assert.equal(fs.readlinkSync(at('etc/link')), 'msg');
      const py = fs.statSync(at('app/run.py'));
      assert.deepEqual([py.mode & 0o7777, py.uid, py.gid, py.mtimeMs], [0o640, 1000, 1000, 1_600_000_000_000]);
      assert.equal(fs.statSync(at('app/hard')).ino, py.ino);
      assert.equal(fs.statSync(at('app/setuid')).mode & 0o7777, 0o4755);
      const app = fs.statSync(at('app'));
      assert.deepEqual([app.mode & 0o7777, app.uid, app.mtimeMs], [0o750, 1000, 1_500_000_000_000]);
      assert.equal(fs.existsSync(at('app/fifo')), false, 'FIFOs are skipped');
      assert.equal(fs.statSync(at('tmp')).mode & 0o7777, 0o1777);
      assert.equal(blobGets(registry, otherLayer), 0, "the other platform's layer is not downloaded");
    });

    test('by digest, and again: the blob cache serves every layer, an unchanged tag is up to date', { timeout: 60_000 }, async () => {
      const { store } = newStore();
      const before = layerDigests.map((d) => blobGets(registry, d));
      const first = await store.pullImage(`${registry.host}/pulled:1`, settings);
      assert.equal(first.downloaded, 3);
      const byDigest = await store.pullImage(`${registry.host}/pulled@${hostManifest}`, settings);
      assert.deepEqual([byDigest.downloaded, byDigest.cached], [0, 3]);
      assert.equal(byDigest.image.name, `${registry.host}/pulled@${hostManifest}`);
      assert.equal(fs.readFileSync(path.join(byDigest.image.rootfs, 'etc/msg'), 'utf8'), 'hello again\n');
      const byIndexDigest = await store.pullImage(`${registry.host}/pulled@${index}`, settings);
      assert.equal(byIndexDigest.downloaded, 0);
      const again = await store.pullImage(`${registry.host}/pulled:1`, settings);
      assert.equal(again.upToDate, true);
      assert.deepEqual(
        layerDigests.map((d) => blobGets(registry, d)),
        before.map((n) => n + 1),
        'each layer was downloaded once',
      );
      assert.equal(await store.ensureImage(`${registry.host}/pulled:1`, settings).then((i) => i.rootfs), first.image.rootfs);
    });

    test('two pulls of one image at once: the second waits for the first', { timeout: 60_000 }, async () => {
      const { store } = newStore();
      const { layers } = await pushImage('together', '1', [[...SH, { path: 'x', body: 'x' }]]);
      const [a, b] = await Promise.all([
        ensureImage(store.dir, `${registry.host}/together:1`, settings),
        store.pullImage(`${registry.host}/together:1`, settings),
      ]);
      assert.equal(a.rootfs, b.image.rootfs);
      assert.equal(blobGets(registry, layers[0]!), 1);
    });

    test('svc images pull, and Docker Hub names through SVC_REGISTRY_MIRROR', { timeout: 60_000 }, async () => {
      const { dataDir } = newStore();
      await pushImage('library/mirrored', '1', [[...SH, { path: 'hub', body: 'from the mirror' }]]);
      const said: string[] = [];
      const code = await imagesCommand(['pull', 'mirrored:1'], dataDir, (l) => said.push(l), { ...settings, registryMirror: registry.host });
      assert.equal(code, 0, said.join('\n'));
      assert.match(said[0]!, new RegExp(`^pulled ${registry.host}/library/mirrored:1 \\(sha256:[a-f0-9]{64}; 1 layers downloaded, 0 cached`));
      const image = await new ImageStore(path.join(dataDir, 'images')).getImage('docker.io/library/mirrored:1');
      assert.equal(fs.readFileSync(path.join(image!.rootfs, 'hub'), 'utf8'), 'from the mirror');
      said.length = 0;
      assert.equal(await imagesCommand(['pull', 'mirrored:1'], dataDir, (l) => said.push(l), { ...settings, registryMirror: registry.host }), 0);
      assert.match(said[0]!, /^mirrored:1 is up to date/);
    });
  });

  describe('layers', () => {
    test('a whiteout removes a lower entry, an opaque directory hides all of its lower ones', { timeout: 60_000 }, async () => {
      const { store } = newStore();
      const lower: TarEntry[] = [
        ...SH,
        { path: 'a/', type: 'dir' },
        { path: 'a/x', body: 'x' },
        { path: 'a/y', body: 'y' },
        { path: 'f', body: 'f' },
        { path: 'd/', type: 'dir' },
        { path: 'd/sub/', type: 'dir' },
        { path: 'd/sub/deep', body: 'deep' },
        { path: 'o/', type: 'dir' },
        { path: 'o/p', body: 'p' },
        { path: 'o/q/', type: 'dir' },
        { path: 'o/q/r', body: 'r' },
      ];
      const upper: TarEntry[] = [
        { path: 'a/.wh.x', body: '' },
        { path: '.wh.f', body: '' },
        { path: '.wh.d', body: '' },
        { path: 'o/', type: 'dir' },
        { path: 'o/.wh..wh..opq', body: '' },
        { path: 'o/new', body: 'new' },
      ];
      await pushImage('whiteouts', '1', [lower, upper]);
      const { image } = await store.pullImage(`${registry.host}/whiteouts:1`, settings);
      const ls = (p: string): string[] => fs.readdirSync(path.join(image.rootfs, p)).sort();
      assert.deepEqual(ls('a'), ['y']);
      assert.deepEqual(ls('o'), ['new']);
      assert.equal(fs.existsSync(path.join(image.rootfs, 'f')), false);
      assert.equal(fs.existsSync(path.join(image.rootfs, 'd')), false);
      assert.ok(!ls('.').some((f) => f.startsWith('.wh.')), 'whiteout files are not written');
    });

    test('hostile layers write nothing outside the root filesystem', { timeout: 60_000 }, async () => {
      const outside = fs.mkdtempSync(path.join(root, 'outside-'));
      const stray = `stray-${randomBytes(4).toString('hex')}`;
      const cases: Array<{ name: string; layers: TarEntry[][]; error: RegExp }> = [
        {
          name: 'a file through a symlink of the same layer',
          layers: [[...SH, { path: 'evil', type: 'symlink', linkpath: outside }, { path: 'evil/pwned', body: 'pwned' }]],
          error: /goes through the symbolic link "evil"; refused/,
        },
        {
          name: 'a file through a symlink of a lower layer',
          layers: [[...SH, { path: 'evil', type: 'symlink', linkpath: `../../../../../../../..${outside}` }], [{ path: 'evil/pwned', body: 'pwned' }]],
          error: /goes through the symbolic link "evil"/,
        },
        {
          name: 'a directory through a symlink',
          layers: [[...SH, { path: 'evil', type: 'symlink', linkpath: outside }], [{ path: 'evil/sub/', type: 'dir' }]],
          error: /symbolic link "evil"/,
        },
        {
          name: 'a whiteout through a symlink',
          layers: [[...SH, { path: 'evil', type: 'symlink', linkpath: outside }], [{ path: 'evil/.wh.keep', body: '' }]],
          error: /symbolic link "evil"/,
        },
        { name: 'a ../ entry', layers: [[...SH, { path: `../../../${stray}`, body: 'out' }]], error: /has a "\.\." component/ },
        { name: 'a whiteout of ..', layers: [[...SH, { path: 'bin/.wh..', body: '' }]], error: /names no entry/ },
        { name: 'a hard link to ../', layers: [[...SH, { path: 'hl', type: 'link', linkpath: '../../../../../etc/passwd' }]], error: /has a "\.\." component/ },
        {
          name: 'a hard link to an absolute path',
          layers: [[...SH, { path: 'hl', type: 'link', linkpath: '/etc/passwd' }]],
          error: /no such file inside the image/,
        },
      ];
      fs.writeFileSync(path.join(outside, 'keep'), 'kept');
      for (const [i, c] of cases.entries()) {
        const { store } = newStore();
        await pushImage('hostile', `${i}`, c.layers);
        await assert.rejects(store.pullImage(`${registry.host}/hostile:${i}`, settings), c.error, c.name);
        assert.deepEqual(fs.readdirSync(outside), ['keep'], c.name);
        assert.deepEqual(leftovers(store), [], c.name);
        assert.equal(store.resolveImage(`${registry.host}/hostile:${i}`), null, c.name);
      }
      for (const dir of [root, os.tmpdir(), path.dirname(root), '/']) assert.equal(fs.existsSync(path.join(dir, stray)), false);
      // An absolute path is taken inside the root, as GNU tar takes it.
      const { store } = newStore();
      const absolute = `/tmp/${stray}`;
      await pushImage('hostile', 'absolute', [[...SH, { path: absolute, body: 'inside' }]]);
      const { image } = await store.pullImage(`${registry.host}/hostile:absolute`, settings);
      assert.equal(fs.readFileSync(path.join(image.rootfs, absolute), 'utf8'), 'inside');
      assert.equal(fs.existsSync(absolute), false);
    });

    test('an image larger than SVC_IMAGE_MAX_BYTES fails with a message saying so', { timeout: 60_000 }, async () => {
      const { store } = newStore();
      await pushImage('large', '1', [[...SH, { path: 'big', body: Buffer.alloc(600_000) }], [{ path: 'big2', body: Buffer.alloc(600_000) }]]);
      await assert.rejects(
        store.pullImage(`${registry.host}/large:1`, { ...settings, imageMaxBytes: 1_000_000 }),
        /unpacks to more than 1000000 bytes \(SVC_IMAGE_MAX_BYTES\), past it at "big2"/,
      );
      assert.deepEqual(leftovers(store), []);
    });
  });

  describe('errors', () => {
    test('a blob whose content does not match its digest is refused, and nothing of it kept', { timeout: 60_000 }, async () => {
      const { store } = newStore();
      const { layers } = await pushImage('corrupt', '1', [[...SH, { path: 'data', body: 'good data' }]]);
      const file = storedBlob(registry, layers[0]!);
      const bytes = fs.readFileSync(file);
      bytes[bytes.length - 5] ^= 0xff;
      fs.writeFileSync(file, bytes);
      await assert.rejects(store.pullImage(`${registry.host}/corrupt:1`, settings), (err: Error) =>
        err.message.includes(`wrong digest: expected ${layers[0]}`),
      );
      assert.equal(store.blobs.has(layers[0]!), false);
      assert.deepEqual(leftovers(store), []);
    });

    test('a manifest whose content does not match the digest asked for is refused', { timeout: 60_000 }, async () => {
      const { store } = newStore();
      const { manifest } = await pushImage('badmanifest', '1', [[...SH]]);
      const file = storedBlob(registry, manifest);
      fs.writeFileSync(file, fs.readFileSync(file, 'utf8').replace('"schemaVersion":2', '"schemaVersion": 2'));
      await assert.rejects(store.pullImage(`${registry.host}/badmanifest@${manifest}`, settings), new RegExp(`wrong digest: asked for ${manifest}`));
      await assert.rejects(store.pullImage(`${registry.host}/badmanifest:1`, settings), /wrong digest/);
    });

    test('an unknown image, an unknown tag, an unreachable or a plain-HTTP registry not allowed', { timeout: 60_000 }, async () => {
      const { store } = newStore();
      await assert.rejects(
        store.pullImage(`${registry.host}/nothing-here:1`, settings),
        new RegExp(`${registry.host}/nothing-here:1: no such image in ${registry.host} \\((NAME|MANIFEST)_UNKNOWN`),
      );
      await assert.rejects(store.pullImage(`${registry.host}/pulled:nope`, settings), /pulled:nope: no such image .*MANIFEST_UNKNOWN/);
      const closed = `127.0.0.1:${await freePort()}`;
      await assert.rejects(
        store.pullImage(`${closed}/x:1`, { ...settings, registryInsecure: [closed] }),
        new RegExp(`cannot reach registry ${closed}: .*ECONNREFUSED`),
      );
      await assert.rejects(store.pullImage(`${registry.host}/pulled:1`, { ...settings, registryInsecure: null }), /must be listed in SVC_REGISTRY_INSECURE/);
      // The sandbox's boot path: ensureImage, whose error the boot reports as "image could not be pulled: ...".
      await assert.rejects(ensureImage(store.dir, `${registry.host}/nothing-here:2`, settings), /no such image/);
    });

    test('a registry that wants a login: none, a wrong one, the right one', { timeout: 60_000 }, async () => {
      const locked = await startRegistry({ basic: { name: 'alice', password: 'open sesame' } });
      try {
        const { store } = newStore();
        const login = `Basic ${Buffer.from('alice:open sesame').toString('base64')}`;
        await push(locked, 'private', '1', buildImage([tarOf([...SH, { path: 'secret', body: 'private' }])]), login);
        const base = { ...settings, registryInsecure: [locked.host] };
        await assert.rejects(
          store.pullImage(`${locked.host}/private:1`, base),
          new RegExp(`${locked.host} refused access to private without credentials \\(SVC_REGISTRY_AUTH has none for ${locked.host}`),
        );
        await assert.rejects(
          store.pullImage(`${locked.host}/private:1`, { ...base, registryAuth: { [locked.host]: { username: 'alice', password: 'wrong' } } }),
          new RegExp(`${locked.host} refused the credentials SVC_REGISTRY_AUTH gives for it`),
        );
        const { image } = await store.pullImage(`${locked.host}/private:1`, {
          ...base,
          registryAuth: { [locked.host]: { username: 'alice', password: 'open sesame' } },
        });
        assert.equal(fs.readFileSync(path.join(image.rootfs, 'secret'), 'utf8'), 'private');
      } finally {
        await locked.stop();
      }
    });
  });

  describe('Bearer tokens (as Docker Hub asks)', () => {
    test('a token service: anonymous and a wrong login refused, the right login pulls; its realm must be HTTPS or allowed', { timeout: 60_000 }, async () => {
      const tokens = await startTokenService({ name: 'bob', password: 'hunter22' });
      const locked = await startRegistry({ token: tokens });
      try {
        const { store } = newStore();
        await push(
          locked,
          'team/tool',
          '1',
          buildImage([tarOf([...SH, { path: 'tool', body: 'behind a token' }])]),
          `Bearer ${tokens.token('repository:team/tool:pull,push')}`,
        );
        const tokenHost = new URL(tokens.realm).host;
        const base = { ...settings, registryInsecure: [locked.host, tokenHost] };
        const ref = `${locked.host}/team/tool:1`;
        await assert.rejects(store.pullImage(ref, base), new RegExp(`${locked.host} refused access to team/tool without credentials`));
        await assert.rejects(
          store.pullImage(ref, { ...base, registryAuth: { [locked.host]: { username: 'bob', password: 'nope' } } }),
          new RegExp(`${locked.host} refused the credentials SVC_REGISTRY_AUTH gives for it`),
        );
        const bob = { registryAuth: { [locked.host]: { username: 'bob', password: 'hunter22' } } };
        await assert.rejects(
          store.pullImage(ref, { ...base, ...bob, registryInsecure: [locked.host] }),
          new RegExp(`token service http://${tokenHost} is not HTTPS`),
        );
        const { image } = await store.pullImage(ref, { ...base, ...bob });
        assert.equal(fs.readFileSync(path.join(image.rootfs, 'tool'), 'utf8'), 'behind a token');
      } finally {
        await locked.stop();
        await tokens.stop();
      }
    });
  });

  describe('image archives', () => {
    const layerA = tarOf([...SH, { path: 'etc/', type: 'dir' }, { path: 'etc/msg', body: 'saved\n' }, { path: 'gone', body: 'x' }]);
    const layerB = tarOf([
      { path: '.wh.gone', body: '' },
      { path: 'etc/more', body: 'more\n', mode: 0o600, uid: 7 },
    ]);
    const run = { Entrypoint: ['/bin/sh', '-c'], Cmd: ['echo hi'], WorkingDir: '/srv' };

    /** A `docker save` archive (the format before Docker 25: <id>/layer.tar, <config>.json, manifest.json). */
    function dockerSave(dir: string, tags: string[]): string {
      const config = Buffer.from(
        JSON.stringify({ architecture: ARCH, os: 'linux', config: run, rootfs: { type: 'layers', diff_ids: [sha256(layerA), sha256(layerB)] } }),
      );
      const configName = `${sha256(config).slice(7)}.json`;
      const ids = [layerA, layerB].map((l) => sha256(Buffer.concat([l, Buffer.from('id')])).slice(7));
      fs.mkdirSync(dir, { recursive: true });
      for (const [i, layer] of [layerA, layerB].entries()) {
        fs.mkdirSync(path.join(dir, ids[i]!));
        fs.writeFileSync(path.join(dir, ids[i]!, 'layer.tar'), layer);
        fs.writeFileSync(path.join(dir, ids[i]!, 'VERSION'), '1.0');
      }
      fs.writeFileSync(path.join(dir, configName), config);
      fs.writeFileSync(path.join(dir, 'manifest.json'), JSON.stringify([{ Config: configName, RepoTags: tags, Layers: ids.map((id) => `${id}/layer.tar`) }]));
      fs.writeFileSync(path.join(dir, 'repositories'), '{}');
      const tarball = `${dir}.tar`;
      execFileSync('tar', ['-cf', tarball, '-C', dir, '.']);
      return tarball;
    }

    test('a docker save archive imports, and a tampered one does not', { timeout: 60_000 }, async () => {
      const { store, dataDir } = newStore();
      const tarball = dockerSave(path.join(root, 'saved'), ['saved:1']);
      const said: string[] = [];
      assert.equal(await imagesCommand(['import', 'saved:1', tarball], dataDir, (l) => said.push(l)), 0, said.join('\n'));
      const image = (await store.getImage('saved:1'))!;
      assert.equal(fs.readFileSync(path.join(image.rootfs, 'etc/msg'), 'utf8'), 'saved\n');
      assert.equal(fs.existsSync(path.join(image.rootfs, 'gone')), false);
      const more = fs.statSync(path.join(image.rootfs, 'etc/more'));
      assert.deepEqual([more.mode & 0o777, more.uid], [0o600, 7]);
      assert.deepEqual(image.entrypoint, ['/bin/sh', '-c', 'echo hi']);
      assert.equal(image.config?.workdir, '/srv');
      assert.equal(image.source, tarball);
      assert.deepEqual(image.layers, [sha256(layerA), sha256(layerB)]);
      // --entrypoint overrides the config's command
      assert.equal(await imagesCommand(['import', 'saved:2', tarball, '--entrypoint', 'python3 agent.py'], dataDir, (l) => said.push(l)), 0, said.join('\n'));
      assert.deepEqual((await store.getImage('saved:2'))!.entrypoint, ['python3', 'agent.py']);

      // a layer changed after the config was written: its diff_id no longer matches
      const tampered = path.join(root, 'tampered');
      dockerSave(tampered, ['tampered:1']);
      const layerDir = fs
        .readdirSync(tampered)
        .find((f) => fs.existsSync(path.join(tampered, f, 'layer.tar')) && fs.readFileSync(path.join(tampered, f, 'layer.tar')).equals(layerB))!;
      fs.writeFileSync(path.join(tampered, layerDir, 'layer.tar'), tarOf([{ path: 'etc/more', body: 'evil\n' }]));
      const { store: other } = newStore();
      await assert.rejects(other.importImage('tampered:1', tampered), /wrong digest/);
      // a layer that is a link out of the archive
      fs.rmSync(path.join(tampered, layerDir, 'layer.tar'));
      fs.symlinkSync('/etc/passwd', path.join(tampered, layerDir, 'layer.tar'));
      await assert.rejects(other.importImage('tampered:1', tampered), /layer\.tar is missing from the archive/);
      assert.deepEqual(leftovers(other), []);
    });

    test('an OCI image layout imports, as a directory and as a tarball', { timeout: 60_000 }, async () => {
      const { store } = newStore();
      const image = buildImage([layerA, layerB], run, ['gzip', 'none'], ARCH);
      const layout = path.join(root, 'oci-layout');
      fs.mkdirSync(path.join(layout, 'blobs', 'sha256'), { recursive: true });
      for (const [digest, bytes] of [...image.blobs, [sha256(image.manifest), image.manifest] as const])
        fs.writeFileSync(path.join(layout, 'blobs', 'sha256', digest.slice(7)), bytes);
      fs.writeFileSync(path.join(layout, 'oci-layout'), '{"imageLayoutVersion": "1.0.0"}');
      const descriptor = { mediaType: 'application/vnd.oci.image.manifest.v1+json', digest: sha256(image.manifest), size: image.manifest.length };
      const other = { ...descriptor, annotations: { 'org.opencontainers.image.ref.name': 'other' } };
      fs.writeFileSync(
        path.join(layout, 'index.json'),
        JSON.stringify({ schemaVersion: 2, manifests: [other, { ...descriptor, annotations: { 'org.opencontainers.image.ref.name': '1' } }] }),
      );
      const fromDir = await store.importImage('oci:1', layout);
      assert.equal(fromDir.digest, sha256(image.manifest));
      assert.equal(fs.readFileSync(path.join(fromDir.rootfs, 'etc/more'), 'utf8'), 'more\n');
      assert.equal(fs.existsSync(path.join(fromDir.rootfs, 'gone')), false);
      await assert.rejects(store.importImage('oci:2', layout), /holds 2 images and none is named so: other, 1/);
      const tarball = path.join(root, 'oci-layout.tar.gz');
      fs.writeFileSync(tarball, gzipSync(execFileSync('tar', ['-cf', '-', '-C', layout, '.'])));
      const fromTarball = await store.importImage('registry.example/acme/oci:1', tarball);
      assert.equal(fromTarball.digest, sha256(image.manifest));
      assert.deepEqual(fromTarball.config, { env: [], entrypoint: run.Entrypoint, cmd: run.Cmd, workdir: '/srv', user: null });
      // a root filesystem tarball still imports as one
      const rootfsTarball = path.join(root, 'rootfs.tar');
      execFileSync('tar', ['-cf', rootfsTarball, '-C', fromDir.rootfs, '.']);
      const plain = await store.importImage('plain:1', rootfsTarball);
      assert.equal(plain.digest, undefined);
      assert.equal(fs.readFileSync(path.join(plain.rootfs, 'etc/msg'), 'utf8'), 'saved\n');
    });
  });

  describe('a pulled image in a sandbox', () => {
    test('boots as the sandbox root', { timeout: 60_000 }, async (t) => {
      const runtime = new LocalRuntime({ stateDir: path.join(root, 'runtime') });
      const reason = await runtime.available();
      if (reason) return t.skip(reason);
      const layer = [...shellLayer(), { path: 'etc/msg', body: 'from the registry\n' }];
      await pushImage('bootable', '1', [layer]);
      const image = await ensureImage(path.join(root, 'boot', 'images'), `${registry.host}/bootable:1`, settings);
      const workspace = fs.mkdtempSync(path.join(root, 'ws-'));
      const sb = await runtime.create({
        id: `sb-${randomBytes(4).toString('hex')}`,
        workspace,
        rootfs: image.rootfs,
        env: {},
        resources: { memoryBytes: 256 * 1024 * 1024, cpus: 1, pids: 64, diskBytes: null },
      });
      try {
        const r = await sb.exec({ command: 'read line < /etc/msg; echo $line' });
        assert.equal(r.stdout, 'from the registry\n', r.stderr);
      } finally {
        await sb.destroy();
        await runtime.close();
      }
    });
  });
}
