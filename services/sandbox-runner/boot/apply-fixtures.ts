/**
 * Boot step `fixtures_applied`: the spec's fixtures in order, but drift (applied after setup,
 * boot/setup.ts): SQL run on a database, a git repository cloned, a directory of the image
 * copied into the workspace. Each is a `fixture` event.
 */
import { shellQuote } from '../../kernel/shell.ts';
import { resolveRealPath, resolveWorkspacePath } from '../workspace/paths.ts';
import type { BootContext } from './context.ts';
import { cloneGit, type FixtureContext } from './fixtures.ts';
import { refusedInStep, StepFailed, type StepDone } from './pipeline.ts';

/** What the fixtures of boot/fixtures.ts use of the sandbox. */
export function fixtureContext(ctx: BootContext): FixtureContext {
  return {
    workspace: ctx.box.workspace,
    exec: async (command, env, timeoutMs) => {
      const r = await ctx.box.handle.exec({ command, env, timeoutMs });
      return { exitCode: r.exitCode, output: ctx.env.output(r, r.stderr ? 'stderr' : 'stdout') };
    },
    backing: ctx.backing,
    gitFixtureDirs: ctx.kernel.config.gitFixtureDirs,
    seed: Number(ctx.request.extra_env?.SVC_RANDOM_SEED ?? ctx.spec.determinism.seed ?? 0),
  };
}

export async function applyFixtures(ctx: BootContext, done: StepDone): Promise<void> {
  const { spec, event } = ctx;
  for (const [i, fixture] of spec.fixtures.entries()) {
    if (fixture.type === 'drift') continue;
    if (fixture.type === 'sql') {
      await (await ctx.backing.database(fixture.service)).runSql(fixture.sql).catch((err: Error) => {
        throw new StepFailed(`fixture ${i} (sql on ${fixture.service}) failed: ${ctx.env.redact(err.message)}`);
      });
      void event('fixture', { index: i, type: fixture.type, service: fixture.service });
      continue;
    }
    if (fixture.type === 'git') {
      void event('fixture', { index: i, type: fixture.type, to: await cloneGit(fixtureContext(ctx), i, fixture) });
      continue;
    }
    // A copy fixture copies a directory of the image into the workspace, inside the sandbox (as its
    // user: links it brings are the sandbox's view). Never into `.svc`, also not through a link.
    const workspace = ctx.box.workspace;
    const to = resolveWorkspacePath(workspace, fixture.to, `fixtures[${i}].to`);
    await resolveRealPath(workspace, to, `fixtures[${i}].to`, { forWrite: true }).catch(refusedInStep);
    const result = await ctx.box.handle.exec({
      command: `mkdir -p '/workspace/${to.relative}' && cp -a -- ${shellQuote(`${fixture.from}/.`)} '/workspace/${to.relative}/'`,
      timeoutMs: 60_000,
    });
    if (result.exitCode !== 0)
      throw new StepFailed(`fixture ${i} (copy ${fixture.from} -> ${fixture.to}) failed: ${ctx.env.output(result, 'stderr').trim().slice(-500)}`);
    void event('fixture', { index: i, type: fixture.type, to: to.relative });
  }
  done({ count: spec.fixtures.length });
}
