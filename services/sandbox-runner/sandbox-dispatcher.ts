/**
 * The runner's end of the sandbox contract (domain/sandbox-ops.ts): an operation on a live
 * sandbox, routed to the LiveSandbox method or part that does it (a shell's, to the runner's
 * terminal sessions). The switch is exhaustive: an operation added to the contract fails to
 * compile here until it is routed, and one the log brings that the contract does not have is
 * refused. `create` is the runner's (service.ts), not a live sandbox's.
 */
import { unknownOperation, type OpAnswer, type SandboxOperation } from '../domain/sandbox-ops.ts';
import type { LiveSandbox } from './sandbox.ts';
import type { TerminalSessions } from './terminal-sessions.ts';

/** Every operation on a sandbox that is live on this runner. */
export type LiveOperation = Exclude<SandboxOperation, { op: 'create' }>;

/** What a live sandbox answers an operation with. */
export type LiveAnswer = OpAnswer<LiveOperation['op']>;

/** The part of the runner that opens shells (terminal-sessions.ts). */
export type ShellOpener = Pick<TerminalSessions, 'open'>;

/** Does `operation` on `live`: checks that the sandbox takes it, then calls the method for it. */
export async function dispatch(live: LiveSandbox, terminals: ShellOpener, operation: LiveOperation): Promise<LiveAnswer> {
  // A shell's request is checked first, then the sandbox (LiveSandbox.openTerminal).
  if (operation.op === 'terminal') return terminals.open(live, operation.payload);
  live.assertOperable(operation.op === 'destroy');
  switch (operation.op) {
    case 'command':
      return live.command(operation.payload);
    case 'file_read':
      return live.files.read(operation.payload);
    case 'file_write':
      return live.files.write(operation.payload);
    case 'file_delete':
      return live.files.delete(operation.payload);
    case 'state':
      return live.workspaceState();
    case 'diff':
      return live.diff();
    case 'timeout':
      return live.changeTimeout(operation.payload);
    case 'service_requests':
      return live.serviceRequests(operation.payload.service);
    case 'service_recording':
      return live.serviceRecording(operation.payload.service);
    case 'destroy':
      await live.destroy('destroyed');
      return { body: { id: live.id, state: 'stopped' } };
    default:
      return unknownOperation(operation);
  }
}
