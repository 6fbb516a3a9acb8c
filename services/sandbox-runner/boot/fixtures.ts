/**
 * The fixtures that need more than one line of the boot: `git` clones and `drift`.
 *
 * - `git`: a remote URL is cloned inside the sandbox, by the sandbox's own git, so it goes
 *   through the sandbox's egress policy like anything the sandbox does (no tenant URL is fetched
 *   by the host). `file:///DIR` is a host directory the operator allows (SVC_GIT_FIXTURE_DIRS):
 *   the host bundles it (`git bundle`, everything, read-only) into the sandbox's read-only `.svc`,
 *   and the sandbox clones the bundle. `ref` is checked out after the clone; one that does not
 *   exist fails the boot.
 * - `drift`: files written, paths removed, SQL run, mock routes added, after setup. With `pick`,
 *   only that many of them (in their listed order), chosen by the run's seed (SVC_RANDOM_SEED:
 *   the same seed drifts the same way), so an experiment's replicas meet a world that moved in
 *   known, reproducible ways.
 */
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { promisify } from 'node:util';
import type { SpecFixture } from '../../domain/spec.ts';
import type { BackingServices } from '../backing/backing-services.ts';
import { writeFile } from '../workspace/files.ts';
import { resolveRealPath, resolveWorkspacePath, SERVICE_DIR } from '../workspace/paths.ts';
import { refusedInStep, StepFailed } from './pipeline.ts';

const run = promisify(execFile);
const CLONE_TIMEOUT_MS = 5 * 60_000;

export interface FixtureContext {
  workspace: string;
  /** Runs a command in the sandbox as it; `output` is its stderr (else stdout), redacted. */
  exec(command: string, env: Record<string, string>, timeoutMs: number): Promise<{ exitCode: number; output: string }>;
  backing: BackingServices;
  /** SVC_GIT_FIXTURE_DIRS */
  gitFixtureDirs: string[] | null;
  seed: number;
}

type GitFixture = Extract<SpecFixture, { type: 'git' }>;
type DriftFixture = Extract<SpecFixture, { type: 'drift' }>;

/** Clones a `git` fixture into the workspace; returns the workspace directory. */
export async function cloneGit(ctx: FixtureContext, index: number, fixture: GitFixture): Promise<string> {
  const field = `fixtures[${index}].to`;
  const to = resolveWorkspacePath(ctx.workspace, fixture.to, field);
  await resolveRealPath(ctx.workspace, to, field, { forWrite: true }).catch(refusedInStep);
  const failed = (why: string) => new StepFailed(`fixture ${index} (git ${fixture.url}) failed: ${why}`);
  let url = fixture.url;
  let bundle: string | null = null;
  if (url.startsWith('file://')) {
    bundle = path.join(ctx.workspace, SERVICE_DIR, `git-fixture-${index}.bundle`);
    await bundleAllowed(fixture.url.slice('file://'.length), ctx.gitFixtureDirs, bundle).catch((err: Error) => {
      throw failed(err.message);
    });
    url = `/workspace/${SERVICE_DIR}/${path.basename(bundle)}`;
  }
  try {
    const script =
      'git clone --quiet -- "$SVC_GIT_URL" "$SVC_GIT_TO" && { [ -z "$SVC_GIT_REF" ] || git -C "$SVC_GIT_TO" -c advice.detachedHead=false checkout --quiet "$SVC_GIT_REF" --; }';
    const r = await ctx.exec(script, { SVC_GIT_URL: url, SVC_GIT_TO: `/workspace/${to.relative}`, SVC_GIT_REF: fixture.ref ?? '' }, CLONE_TIMEOUT_MS);
    if (r.exitCode === 127) throw failed("git is not installed in the sandbox's image");
    if (r.exitCode !== 0) throw failed(r.output.trim().slice(-500) || `git exited with ${r.exitCode}`);
  } finally {
    if (bundle) await fs.promises.rm(bundle, { force: true });
  }
  return to.relative;
}

/** Bundles the repository at `dir` into `bundle`, when `dir` is in an operator-allowed directory. */
async function bundleAllowed(dir: string, allowed: string[] | null, bundle: string): Promise<void> {
  const real = await fs.promises.realpath(dir).catch(() => {
    throw new Error(`${dir} does not exist on the runner`);
  });
  const roots = await Promise.all((allowed ?? []).map((root) => fs.promises.realpath(root).catch(() => null)));
  if (!roots.some((root) => root !== null && (real === root || real.startsWith(root + path.sep)))) {
    throw new Error(`${dir} is not in a directory the operator allows for git fixtures (SVC_GIT_FIXTURE_DIRS)`);
  }
  // --all: every branch and tag, so any ref can be checked out.
  await run('git', ['-C', real, 'bundle', 'create', bundle, '--all'], { timeout: CLONE_TIMEOUT_MS, maxBuffer: 1024 * 1024 }).catch(
    (err: { stderr?: string; message: string }) => {
      throw new Error(`cannot read the repository ${dir}: ${(err.stderr || err.message).trim().slice(-300)}`);
    },
  );
}

/** Applies a `drift` fixture (the picked part of it); returns what it changed, each as one line. */
export async function applyDrift(ctx: FixtureContext, index: number, fixture: DriftFixture): Promise<string[]> {
  const changes: Array<{ what: string; apply: () => Promise<unknown> }> = [
    ...fixture.files.map((file, j) => ({
      what: `write ${file.path}`,
      apply: () => writeFile(ctx.workspace, file.path, file.content, { field: `fixtures[${index}].files[${j}].path`, mode: file.mode }).catch(refusedInStep),
    })),
    ...fixture.delete.map((p, j) => ({
      what: `delete ${p}`,
      apply: async () => {
        // Removed inside the sandbox, as it: never a host path, whatever links the workspace holds.
        const rel = resolveWorkspacePath(ctx.workspace, p, `fixtures[${index}].delete[${j}]`).relative;
        const r = await ctx.exec('rm -rf -- "$SVC_DRIFT_PATH"', { SVC_DRIFT_PATH: `/workspace/${rel}` }, 60_000);
        if (r.exitCode !== 0) throw new Error(r.output.trim().slice(-300));
      },
    })),
    ...fixture.sql.map((s) => ({ what: `sql on ${s.service}`, apply: async () => (await ctx.backing.database(s.service)).runSql(s.sql) })),
    ...fixture.routes.map(({ service, ...route }) => ({
      what: `route ${route.method} ${route.path} of ${service}`,
      apply: async () => ctx.backing.mock(service)!.addRoute(route),
    })),
  ];
  const chosen = fixture.pick === null ? changes : seededPick(changes, fixture.pick, ctx.seed + index);
  for (const change of chosen) {
    await change.apply().catch((err: Error) => {
      throw err instanceof StepFailed ? err : new StepFailed(`fixture ${index} (drift: ${change.what}) failed: ${err.message}`);
    });
  }
  return chosen.map((c) => c.what);
}

/** `n` of `items` (all when there are no more), chosen by `seed`, in their order. */
export function seededPick<T>(items: T[], n: number, seed: number): T[] {
  const random = mulberry32(seed);
  const order = items.map((_, i) => i);
  for (let i = order.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [order[i], order[j]] = [order[j]!, order[i]!];
  }
  return order
    .slice(0, n)
    .sort((a, b) => a - b)
    .map((i) => items[i]!);
}

/** A small seeded generator (mulberry32): the same seed, the same numbers, everywhere. */
function mulberry32(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
