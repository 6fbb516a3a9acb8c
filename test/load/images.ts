/**
 * Images' figures (issue 17), side by side in one run: a pull of a ~100 MB image from a real
 * registry on loopback (test/helpers/oci-registry.ts) in MB/s, again once cached (nothing
 * downloaded), a Dockerfile build over it and its fully cached rebuild, and sandbox create from
 * that pulled image vs the minimal spec (the host's system directories).
 */
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { buildImage as buildFromDockerfile } from '../../services/sandbox-runner/images/image-builder.ts';
import { ImageStore, type PullSettings } from '../../services/sandbox-runner/images/images.ts';
import { LocalRuntime } from '../../services/sandbox-runner/runtimes/local/local-runtime.ts';
import { buildImage, push, shellLayer, startRegistry, tarOf } from '../helpers/oci-registry.ts';
import { startServer, type TestServer } from '../helpers/server.ts';
import { pct } from './queries.ts';
import { interleavedCreates, timedSandboxes } from './sandbox-timing.ts';

const BASE = 'base: BASE\ntask: {prompt: bench}\ninvariants: {ok: {check: {type: command_exit, command: "true"}}}\n';

/** A first build of a small Dockerfile over `from`, then the same build again, every step cached. */
async function dockerfileBuilds(
  imagesDir: string,
  from: string,
  settings: PullSettings,
  stateDir: string,
): Promise<{ firstMs: number; cachedMs: number; cachedSteps: number }> {
  const runtime = new LocalRuntime({ stateDir });
  const reason = await runtime.available();
  if (reason) throw new Error(`the local runtime cannot build images here: ${reason}`);
  const dockerfile = `FROM ${from}\nENV STAGE=bench\nWORKDIR /srv\nRUN echo one > /srv/one\nRUN echo two > /srv/two\nRUN echo three > /etc/three\n`;
  try {
    let started = performance.now();
    await buildFromDockerfile({ imagesDir, runtime, settings, dockerfile, context: null, name: 'bench/built:1' });
    const firstMs = performance.now() - started;
    started = performance.now();
    const again = await buildFromDockerfile({ imagesDir, runtime, settings, dockerfile, context: null, name: 'bench/built:1' });
    return { firstMs, cachedMs: performance.now() - started, cachedSteps: again.steps.filter((step) => step.cached === true).length };
  } finally {
    await runtime.close();
  }
}

export async function benchImages(): Promise<string[]> {
  const registry = await startRegistry();
  const dir = await mkdtemp(path.join(os.tmpdir(), 'svc-bench-images-'));
  let server: TestServer | null = null;
  try {
    // Four layers of 25 MB that do not compress, over the shell.
    const data = Array.from({ length: 4 }, (_, i) =>
      tarOf([
        { path: 'data/', type: 'dir' },
        { path: `data/blob-${i}`, body: randomBytes(25 * 1024 * 1024) },
      ]),
    );
    const parts = buildImage([tarOf(shellLayer()), ...data]);
    await push(registry, 'big', '1', parts);
    const bytes = [...parts.blobs.values()].reduce((sum, b) => sum + b.length, 0);
    const settings: PullSettings = { registryAuth: null, registryInsecure: [registry.host], registryMirror: null, imageMaxBytes: 4 * 1024 ** 3 };
    const store = new ImageStore(path.join(dir, 'images'));
    let started = performance.now();
    await store.pullImage(`${registry.host}/big:1`, settings);
    const pullMs = performance.now() - started;
    started = performance.now();
    const again = await store.pullImage(`${registry.host}/big:1`, settings);
    const againMs = performance.now() - started;

    const build = await dockerfileBuilds(store.dir, `${registry.host}/big:1`, settings, path.join(dir, 'runtime'));

    server = await startServer({
      SVC_SANDBOX_HOST_ROOTFS: 'true',
      SVC_REGISTRY_INSECURE: registry.host,
      SVC_RATE_LIMIT_READS: '0',
      SVC_RATE_LIMIT_WRITES: '0',
    });
    const timed = await timedSandboxes(server, [
      `version: 1\nid: minimal\n${BASE.replace('BASE', 'debian:bookworm')}`,
      `version: 1\nid: pulled\n${BASE.replace('BASE', `${registry.host}/big:1`)}`,
    ]);
    // The first create pulls it into the service's store; the rest find it there.
    await timed.destroy((await timed.create('pulled')).id);
    const creates = await interleavedCreates(timed, ['minimal', 'pulled'] as const, 3, 20);
    const f = (n: number) => n.toFixed(1);
    const mb = bytes / 1024 / 1024;
    return [
      `| pull of a ${f(mb)} MB image (5 layers) from a registry on loopback, layers verified and unpacked | ${f(mb / (pullMs / 1000))} MB/s (${f(pullMs)} ms) | again, cached: ${f(againMs)} ms, ${again.downloaded} layers downloaded | |`,
      `| Dockerfile build FROM that image (3 RUN steps, ENV, WORKDIR): first build vs a rebuild with every step cached | ${f(build.firstMs)} ms | ${f(build.cachedMs)} ms (${build.cachedSteps} steps cached) | target rebuild < 1 s |`,
      `| sandbox create to ready: from the pulled image vs the minimal spec (host's system directories; interleaved, 20 each) | p50 ${f(pct(creates.pulled, 0.5))} ms, p95 ${f(pct(creates.pulled, 0.95))} ms | p50 ${f(pct(creates.minimal, 0.5))} ms, p95 ${f(pct(creates.minimal, 0.95))} ms | |`,
    ];
  } finally {
    await server?.cleanup();
    await registry.stop();
    await rm(dir, { recursive: true, force: true });
  }
}
