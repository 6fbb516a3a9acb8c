/**
 * Commands of the sandbox (the API's, the agent's): run by the runtime, audited, each a
 * `command` event, answered with their redacted output; a warning when one ran out of memory or
 * hit the process limit, and a checkpoint after each with `snapshots.checkpoints: per_action`.
 */
import type { Kernel } from '../../kernel/actor.ts';
import { AppError } from '../../kernel/errors.ts';
import type { CommandDone, OpAnswer } from '../../domain/sandbox-ops.ts';
import type { SpecDocument } from '../../domain/spec.ts';
import type { ExecResult } from '../runtimes/runtime.ts';
import type { ActivityCapture } from './activity-capture.ts';
import type { AuditTrail } from './audit-trail.ts';
import type { SandboxBox } from './sandbox-box.ts';
import type { SandboxEnv } from './sandbox-env.ts';
import type { EmitEvent } from './sandbox-events.ts';

export interface CommandsDeps {
  kernel: Kernel;
  sandboxId: string;
  spec: SpecDocument;
  box: SandboxBox;
  env: SandboxEnv;
  trail: AuditTrail;
  capture: ActivityCapture;
  event: EmitEvent;
  /** A sandbox that is `ready` becomes `running` with its first command or shell. */
  markRunning(): Promise<void>;
}

export class SandboxCommands {
  /** Forks refused at pids.max so far, to report each new burst once. */
  private pidsLimitHits = 0;

  constructor(private readonly deps: CommandsDeps) {}

  /** A command of the sandbox (the API's, the agent's): audited, answered with its redacted output. `env` goes over the sandbox's. */
  async run(command: string, options: { timeoutMs?: number; background: boolean; env?: Record<string, string> }): Promise<OpAnswer<'command'>> {
    const { timeoutMs, background, env } = options;
    const { kernel, sandboxId } = this.deps;
    await this.deps.markRunning();
    const run = this.deps.box.handle
      .exec({ command, timeoutMs, env, maxCaptureBytes: 1024 * 1024 })
      // exec rejects only when the sandbox is gone (destroyed, or ended on its own meanwhile).
      .catch((err: Error) => {
        throw new AppError('conflict', `sandbox ${sandboxId} ended while the command ran: ${err.message}`);
      })
      .then((r) => this.afterCommand(command, r));
    if (background) {
      run.catch((err) => kernel.logger.warn({ err, sandbox_id: sandboxId }, 'background command failed'));
      return { status: 202, body: { command: this.deps.env.redact(command), background: true } };
    }
    return { body: await run };
  }

  private async afterCommand(command: string, r: ExecResult): Promise<CommandDone> {
    const { spec, env, event } = this.deps;
    const audit = this.deps.trail.log!;
    const shown = env.redact(command);
    // Redacted whole, before the audit cuts stdout into chunks.
    const stdout = env.output(r, 'stdout');
    const stderr = env.output(r, 'stderr');
    const chunk = this.deps.kernel.config.stdoutChunkBytes;
    await audit.record('process_spawn', {
      command: shown,
      exit_code: r.exitCode,
      duration_ms: r.durationMs,
      output_bytes: r.outputBytes,
      ...(spec.audit.stdout_capture ? { stdout: stdout.slice(0, chunk) } : {}),
    });
    if (spec.audit.stdout_capture) {
      for (let i = 0; i < stdout.length; i += chunk) await audit.record('stdout', { command: shown, chunk: stdout.slice(i, i + chunk), index: i / chunk });
      // A secret's value in captured stdout is a finding naming the secret (never its value): secrets_in_logs.
      for (const [name, value] of Object.entries(env.secretValues)) {
        if (value !== '' && r.stdout.includes(value)) await audit.record('secret_finding', { name, command: shown });
      }
    }
    await event('command', {
      command: shown,
      exit_code: r.exitCode,
      duration_ms: r.durationMs,
      ...(r.timedOut ? { timed_out: true } : {}),
      ...(r.oomKilled ? { oom_killed: true } : {}),
    });
    if (r.oomKilled)
      await event('warning', { message: `command "${shown}" was killed: the sandbox ran out of memory (limit ${spec.resources.memoryBytes} bytes)` });
    const { pidsLimitHits } = await this.deps.box.handle.usage();
    if (pidsLimitHits > this.pidsLimitHits) {
      this.pidsLimitHits = pidsLimitHits;
      await event('warning', {
        message: `command "${shown}" hit the sandbox's process limit (pids ${spec.resources.pids}): ${pidsLimitHits} forks refused so far`,
      });
    }
    if (spec.snapshots.checkpoints === 'per_action') {
      const { files, diff } = await this.deps.capture.checkpoint();
      await event('checkpoint', { after: shown, files, diff });
    }
    return {
      command: shown,
      stdout,
      stderr,
      exit_code: r.exitCode,
      duration_ms: r.durationMs,
      ...(r.timedOut ? { timed_out: true } : {}),
      ...(r.oomKilled ? { oom_killed: true } : {}),
    };
  }
}
