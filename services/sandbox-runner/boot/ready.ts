/**
 * The boot's last two steps: `snapshot_taken`, the workspace as it is at ready (what diffs
 * compare against), and `ready`, once every boot warning is written: the entity says so, and
 * what runs from then on starts (the timer, shells, the watch for the sandbox's end).
 */
import type { BootContext } from './context.ts';
import type { StepDone } from './pipeline.ts';

/** The before-run snapshot, which diffs compare against. */
export async function takeSnapshot(ctx: BootContext, done: StepDone): Promise<void> {
  done({ files: await ctx.capture.takeSnapshot() });
}

export async function markReady(ctx: BootContext, done: StepDone): Promise<void> {
  await ctx.trail.bootWarningsWritten();
  await ctx.setState('ready');
  done();
  await ctx.event('status', { state: 'ready' });
  ctx.startLife();
}
