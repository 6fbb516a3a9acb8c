/**
 * The sandbox contract between the api and a runner: every operation the api asks of a runner
 * on svc.sandbox-requests (domain/sandbox-requests.ts seals and carries them), each with the
 * payload it sends and the body the runner answers with. One map, `SandboxOps`, read by both
 * sides: the api's requester takes `op` and its payload from it (`request<'command'>(...)`), and
 * the runner's dispatcher switches on `SandboxOperation['op']` with an exhaustive check, so a
 * new operation, or a changed payload, fails to compile until both ends handle it.
 *
 * The types say what a well-behaved api sends; the runner still reads the log, so it keeps the
 * checks it makes of a payload (a path is resolved beneath the workspace, a terminal request is
 * checked again, a timeout change against the maximum lifetime, an unknown operation refused).
 * Input from clients is validated by the api's handlers (api/sandboxes/sandbox-input.ts).
 */
import { AppError } from '../kernel/errors.ts';
import type { ResolvedAgent } from './agent-auth.ts';
import type { SandboxChanged } from './events/sandbox-events.ts';
import type { MockRoute, SpecDocument } from './spec.ts';
import type { TerminalOpen, TerminalOpened } from './terminal-sessions.ts';

/** What the api sends to create a sandbox (the spec travels with it, already stored and valid). */
export interface CreateRequest {
  spec_id: string;
  spec_version: number;
  yaml: string;
  timeout_ms: number | null;
  metadata: Record<string, string>;
  secrets: Record<string, string>;
  scenario_id?: string;
  run_id?: string;
  /** The agent snapshot the spec names, resolved by the api; absent for other agent types. */
  agent?: ResolvedAgent | null;
  /** More environment for every command (a run's params, seed and ids), over the spec's. */
  extra_env?: Record<string, string>;
  /** The parsed spec, when the caller has it (a run's, with its params applied); else `yaml` is parsed. */
  spec?: SpecDocument;
  /** HOME is AGENT_HOME, outside the workspace, instead of /workspace (a run's: the agent's dotfiles stay out of its diff). */
  private_home?: boolean;
}

/** The Sandbox object of the spec, as the runner sees it (the api renders its own from svc.sandboxes). */
export interface RunnerSandboxView {
  id: string;
  spec_id: string;
  state: SandboxChanged['state'];
  path: string;
  url: string;
  created_at: string;
  expires_at: string;
  metadata: Record<string, string>;
  services: Record<string, { host: string; port: number; ready: boolean }>;
  network: object | null;
}

export interface CommandPayload {
  command: string;
  timeout_ms: number | null;
  background: boolean;
}

/** A command's answer once it ended: its output redacted. */
export interface CommandDone {
  command: string;
  stdout: string;
  stderr: string;
  exit_code: number;
  duration_ms: number;
  timed_out?: true;
  oom_killed?: true;
}

/** A background command's answer (a 202): it runs on. */
export interface CommandStarted {
  command: string;
  background: true;
}

/** `content` is text, or base64 with `encoding: base64`. */
export interface FileWritePayload {
  path: string;
  content: string;
  encoding?: 'utf8' | 'base64';
  /** permission bits, e.g. 0o644 */
  mode?: number;
}

/** One file of a workspace as captured. */
export interface WorkspaceFileEntry {
  size: number;
  /** Permission bits in octal, e.g. "0644" (setuid/setgid/sticky included, e.g. "4755"). */
  mode: string;
  /** sha256 hex; absent for files over `checksumMaxBytes` (and unreadable files). */
  checksum?: string;
  /** Present for symlinks: the link text (never followed). */
  symlink?: string;
  /** An overlay's whiteout (CaptureOptions.whiteouts): the name is gone from the merged view. */
  whiteout?: true;
}

/** The workspace's files as captured (sandbox-runner/workspace/state.ts). */
export interface WorkspaceState {
  captured_at: string;
  files: Record<string, WorkspaceFileEntry>;
}

/** Paths added, modified and removed since the sandbox was ready (workspace/state.ts `Diff`). */
export interface WorkspaceDiff {
  added: string[];
  modified: string[];
  removed: string[];
}

/** `{timeout_ms}` resets the timer to that long from now; `{extend_ms}` adds to what is left. */
export interface TimeoutChange {
  timeout_ms?: number;
  extend_ms?: number;
}

/** An http_mock's journal (backing/http-mock.ts). */
export interface ServiceRequests {
  service: string;
  entries: object[];
  dropped: number;
  uncounted: number;
}

type Nothing = Record<string, never>;

/** Every operation: what the api sends with it, and the body the runner answers with. */
export interface SandboxOps {
  create: { payload: CreateRequest; reply: RunnerSandboxView };
  command: { payload: CommandPayload; reply: CommandDone | CommandStarted };
  file_read: { payload: { path: string }; reply: Buffer };
  file_write: { payload: FileWritePayload; reply: { path: string; bytes: number } };
  file_delete: { payload: { path: string }; reply: { path: string; deleted: true } };
  state: { payload: Nothing; reply: WorkspaceState };
  diff: { payload: Nothing; reply: WorkspaceDiff };
  timeout: { payload: TimeoutChange; reply: RunnerSandboxView };
  service_requests: { payload: { service: string }; reply: ServiceRequests };
  service_recording: { payload: { service: string }; reply: { service: string; routes: MockRoute[] } };
  /** Opens a shell; its bytes then go over svc.terminal-input and -output (domain/terminal-sessions.ts). */
  terminal: { payload: TerminalOpen; reply: TerminalOpened };
  destroy: { payload: Nothing; reply: { id: string; state: 'stopped' } };
}

export type SandboxOp = keyof SandboxOps;
export type SandboxPayload<K extends SandboxOp> = SandboxOps[K]['payload'];
export type SandboxReply<K extends SandboxOp> = SandboxOps[K]['reply'];

/** One operation as a discriminated union: `{op: 'command', payload: CommandPayload} | ...`. */
export type SandboxOperation = { [K in SandboxOp]: { op: K; payload: SandboxPayload<K> } }[SandboxOp];

/** The runner's answer to an operation: its body, and a status and content type when not 200 and JSON. */
export interface OpAnswer<K extends SandboxOp> {
  status?: number;
  body: SandboxReply<K>;
  contentType?: string;
}

/** The error of an operation the runner does not know (a record on the log no api of this version wrote). */
export function unknownOperation(operation: never): never {
  throw new AppError('bad_request', `unknown sandbox operation ${(operation as { op: unknown }).op}`);
}
