/**
 * Boot step `setup_applied`: the private HOME (when asked for), the agent's config files, the
 * spec's setup bundles and files, its setup commands, then the drift fixtures.
 */
import path from 'node:path';
import { renderConfigTemplate } from '../../domain/agent-auth.ts';
import { excerpt } from '../parts/checks.ts';
import { copyBundle } from '../parts/task-files.ts';
import { makeDirectory, writeFile } from '../workspace/files.ts';
import { fixtureContext } from './apply-fixtures.ts';
import type { BootContext } from './context.ts';
import { AGENT_HOME } from './environment.ts';
import { applyDrift } from './fixtures.ts';
import { refusedInStep, StepFailed, type StepDone } from './pipeline.ts';

export async function applySetup(ctx: BootContext, done: StepDone): Promise<void> {
  const { spec, box } = ctx;
  // Made before any process of the sandbox's user runs: nothing can be in the way, or swap it while the config files go in.
  const homeDir = ctx.request.private_home ? makeDirectory(box.tmpOnHost(), path.posix.basename(AGENT_HOME), { mode: 0o700, owner: box.handle.user }) : null;
  await writeAgentConfigFiles(ctx, homeDir);
  for (const [i, bundle] of spec.setup.bundles.entries()) {
    await copyBundle(ctx.bundles.taskFiles, box.workspace, bundle, `setup.bundles[${i}]`).catch((err: Error) => {
      throw new StepFailed(`setup.bundles[${i}] (${bundle.digest.slice(0, 19)}) could not be copied: ${err.message}`);
    });
  }
  for (const [i, file] of spec.setup.files.entries()) {
    // Through the files API's own write: never through a link out of the workspace (a fixture may
    // have brought one), never into `.svc`.
    await writeFile(box.workspace, file.path, file.content, { field: `setup.files[${i}].path`, mode: file.mode }).catch(refusedInStep);
  }
  for (const command of spec.setup.commands) {
    const result = await box.handle.exec({ command, timeoutMs: 5 * 60_000 });
    if (result.exitCode !== 0) {
      throw new StepFailed(
        `setup command "${excerpt(ctx.env.redact(command))}" exited with ${result.exitCode}: ${ctx.env
          .output(result, result.stderr ? 'stderr' : 'stdout')
          .trim()
          .slice(-500)}`,
      );
    }
  }
  let drift = 0;
  for (const [i, fixture] of spec.fixtures.entries()) {
    if (fixture.type !== 'drift') continue;
    const applied = await applyDrift(fixtureContext(ctx), i, fixture);
    drift += applied.length;
    void ctx.event('fixture', { index: i, type: fixture.type, applied });
  }
  done({ files: spec.setup.files.length, bundles: spec.setup.bundles.length, commands: spec.setup.commands.length, drift });
}

/** The snapshot's `auth.config_files`, with their secrets filled in; written by the service, not the agent. `~/` is HOME. */
async function writeAgentConfigFiles(ctx: BootContext, homeDir: string | null): Promise<void> {
  for (const [i, file] of (ctx.request.agent?.auth?.config_files ?? []).entries()) {
    const root = file.path.startsWith('~/') && homeDir !== null ? homeDir : ctx.box.workspace;
    const relative = file.path.replace(/^~\//, '').replace(/^\/workspace(\/|$)/, '');
    let content: string;
    try {
      content = renderConfigTemplate(file.template, { ...ctx.env.secretValues, ...ctx.network.placeholders() });
    } catch (err) {
      throw new StepFailed(`agent config file ${file.path}: ${(err as Error).message} (declare it under the spec's secrets or store it with PUT /v1/secrets)`);
    }
    await writeFile(root, relative, content, { field: `agent.auth.config_files[${i}].path` }).catch(refusedInStep);
  }
}
