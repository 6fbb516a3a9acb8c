/**
 * What a run's grading does in the sandbox once the agent has ended (run-executor.ts): the
 * spec's grader files and bundles, written after the agent's diff is taken and removed after the
 * checks, and the checks themselves, run as the service's, out of the agent's reach.
 */
import { randomBytes } from 'node:crypto';
import type { ExtractedBundles } from '../../kernel/bundles.ts';
import type { CheckOutput } from '../../domain/events/run-events.ts';
import type { SpecDocument } from '../../domain/spec.ts';
import { makeCheckClock } from '../frozen-clock.ts';
import { removeBeneath } from '../workspace/beneath.ts';
import { deleteFile, makeDirectory, removeTree, writeFile } from '../workspace/files.ts';
import type { ActivityCapture } from './activity-capture.ts';
import type { SandboxBox } from './sandbox-box.ts';
import { IMAGE_PATH, type SandboxEnv } from './sandbox-env.ts';
import { copyBundle } from './task-files.ts';

/** A check's environment over the sandbox's: what the agent's files could otherwise change in the checker. */
const CHECK_ENV: Readonly<Record<string, string>> = {
  PATH: IMAGE_PATH,
  // Python: no per-user site (its .pth files run at start-up), no working directory on sys.path.
  PYTHONNOUSERSITE: '1',
  PYTHONSAFEPATH: '1',
};

/**
 * A check runs in the workspace from its own directory, SVC_CHECK_DIR (made by the service in the
 * sandbox's /tmp, see runCheck): a fresh HOME no one else has seen, then its source read from a
 * file there. Never through an argument or a variable, so a check of any size runs (Linux takes
 * at most 128 KiB for one).
 */
const CHECK_PRELUDE = 'HOME="$SVC_CHECK_DIR/home"; export HOME; ';
const CHECK_RUNNERS = {
  shell: { file: 'check.sh', command: `${CHECK_PRELUDE}. "$SVC_CHECK_DIR/check.sh"` },
  python: { file: 'check.py', command: `${CHECK_PRELUDE}exec python3 -I "$SVC_CHECK_DIR/check.py"` },
} as const;

/** What a check in the sandbox did: its exit, and its output as kept. */
export interface CheckRun {
  exitCode: number;
  timedOut: boolean;
  output: CheckOutput;
}

/** The first characters of `text` that an error message quotes, never the whole (a command may be 200 KB). */
export function excerpt(text: string, chars = 200): string {
  return text.length <= chars ? text : `${text.slice(0, chars)}… (${text.length} characters)`;
}

export class SandboxChecks {
  /** The workspace paths the grader's bundles wrote, removed after the checks. */
  private graderPaths: string[] = [];

  constructor(
    private readonly spec: SpecDocument,
    private readonly box: SandboxBox,
    private readonly env: SandboxEnv,
    private readonly capture: ActivityCapture,
    private readonly taskFiles: ExtractedBundles,
  ) {}

  /**
   * Writes the spec's grader files and bundles into the workspace (as the setup ones are). Only
   * after the agent's end and its diff: no process of the agent is left to see them, and neither
   * its diff nor its audit holds them (the service's own writes, not recorded). Returns why one
   * could not be written (the agent may have left a file where a directory goes), or null.
   */
  async writeGraderFiles(): Promise<string | null> {
    const finalDiff = this.capture.agentDiffTaken;
    if (!finalDiff) throw new Error('grader files are written only once the agent has ended and its diff is taken');
    await finalDiff;
    const workspace = this.box.workspace;
    for (const [i, file] of this.spec.grader.files.entries()) {
      const field = `grader.files[${i}].path`;
      try {
        await writeFile(workspace, file.path, file.content, { field, mode: file.mode });
      } catch (err) {
        return `the grader's file ${excerpt(file.path)} could not be written: ${(err as Error).message}`;
      }
    }
    for (const [i, bundle] of this.spec.grader.bundles.entries()) {
      try {
        this.graderPaths.push(...(await copyBundle(this.taskFiles, workspace, bundle, `grader.bundles[${i}]`)));
      } catch (err) {
        return `the grader's bundle ${bundle.digest.slice(0, 19)} could not be copied to ${excerpt(bundle.to || '/workspace')}: ${(err as Error).message}`;
      }
    }
    return null;
  }

  /** Removes the grader's files and bundles once the checks ran (one a check removed itself is not missed). */
  async removeGraderFiles(): Promise<void> {
    for (const file of this.spec.grader.files) await deleteFile(this.box.workspace, file.path).catch(() => undefined);
    for (const name of this.graderPaths.splice(0)) await removeTree(this.box.workspace, name, { field: 'grader.bundles' }).catch(() => undefined);
  }

  /**
   * Runs a check of the service's (an invariant), not the agent's: not audited as a process of
   * the agent, output redacted, in the sandbox as it is now (the agent's processes are gone).
   * The checker is out of the agent's reach: HOME is a fresh private directory (the agent's
   * dotfiles, Python user site and tool configs would otherwise load), PATH holds only the
   * read-only image's directories, and Python neither loads a user site nor puts the working
   * directory (the agent's workspace) first on its import path. Its source goes through a file of
   * a directory the service makes in the sandbox's /tmp: the service's own (mode 0755), so no
   * process of the sandbox can swap or rewrite it, with a HOME of the sandbox user's in it.
   * Each stream keeps its first `maxOutputBytes`, and counts them all.
   */
  async runCheck(source: { shell: string } | { python: string }, options: { timeoutMs: number; maxOutputBytes: number }): Promise<CheckRun> {
    const box = this.box.handle;
    const runner = 'shell' in source ? CHECK_RUNNERS.shell : CHECK_RUNNERS.python;
    const name = `.svc-check-${randomBytes(8).toString('hex')}`;
    const dir = makeDirectory(this.box.tmpOnHost(), name, { mode: 0o755 });
    const clock = this.spec.determinism.frozenTime ? await makeCheckClock(box) : null;
    try {
      makeDirectory(dir, 'home', { mode: 0o700, owner: box.user });
      await writeFile(dir, runner.file, 'shell' in source ? source.shell : source.python);
      const bytes = { stdout: 0, stderr: 0 };
      const r = await box.exec({
        command: runner.command,
        timeoutMs: options.timeoutMs,
        env: { ...CHECK_ENV, ...clock?.env, SVC_CHECK_DIR: `/tmp/${name}` },
        maxCaptureBytes: options.maxOutputBytes,
        onOutput: (stream, chunk) => (bytes[stream] += chunk.length),
      });
      const kept = (stream: 'stdout' | 'stderr') => ({ text: this.env.output(r, stream), bytes: bytes[stream], truncated: r.truncated[stream] });
      return { exitCode: r.exitCode, timedOut: r.timedOut, output: { stdout: kept('stdout'), stderr: kept('stderr') } };
    } finally {
      removeBeneath(dir);
      clock?.remove();
    }
  }

  /**
   * Why the sandbox's user cannot enter `dir`, or null. A shell's builtin `cd` alone, so nothing
   * of it is audited: it writes no file and starts no program.
   */
  async cannotEnter(dir: string): Promise<string | null> {
    const r = await this.box.handle.exec({ command: 'cd -- "$SVC_WORKDIR"', env: { SVC_WORKDIR: dir }, timeoutMs: 30_000 });
    return r.exitCode === 0 ? null : this.env.output(r, 'stderr').trim() || `exit code ${r.exitCode}`;
  }
}
