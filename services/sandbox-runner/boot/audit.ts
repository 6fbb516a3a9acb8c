/**
 * Boot step `audit_started`: the audit log runs since the runtime started; this starts the file
 * watch and the process capture, when the spec asks for them (parts/activity-capture.ts), and
 * the databases' write audit.
 */
import type { BootContext } from './context.ts';
import type { StepDone } from './pipeline.ts';

export async function startAuditCapture(ctx: BootContext, done: StepDone): Promise<void> {
  const { audit } = ctx.spec;
  await ctx.capture.start(audit);
  // always: the databases also note what their names resolve to, which the `sql` invariant holds its query to
  await ctx.backing.startAudit();
  done({ file_system: audit.file_system.watch.length > 0, process_spawns: ctx.capture.watchingProcesses, db_writes: audit.db_writes });
}
