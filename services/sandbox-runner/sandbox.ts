/**
 * One live sandbox on this runner: its boot pipeline (`BOOT_STEPS`, each step a `status` event),
 * its operations (commands, files, state, diff, timeout) and its teardown. Every change of
 * state is an event: svc.sandboxes (the entity), svc.sandbox-events (its stream), svc.audit.
 * Its own file work in the workspace (setup and config files, files API, state, exports) goes
 * through the path-safe layer (workspace/files.ts and beneath.ts): the agent may be racing it.
 */
import { shellQuote } from '../kernel/shell.ts';
import { randomBytes } from 'node:crypto';
import { mkdir, writeFile as writeHostFile } from 'node:fs/promises';
import path from 'node:path';
import { stringify as stringifyYaml } from 'yaml';
import { publish, type Kernel } from '../kernel/actor.ts';
import { renderConfigTemplate } from '../domain/agent-auth.ts';
import type { CommandDone, CommandPayload, CreateRequest, RunnerSandboxView, FileWritePayload, OpAnswer, TimeoutChange } from '../domain/sandbox-ops.ts';
import type { ExtractedBundles } from '../kernel/bundles.ts';
import { AppError, type ErrorCode } from '../kernel/errors.ts';
import type { AuditRecorded, SandboxChanged, SandboxEvent } from '../domain/events/sandbox-events.ts';
import type { CheckOutput } from '../domain/events/run-events.ts';
import { newEventId, newSandboxToken, sha256Hex } from '../kernel/ids.ts';
import { resolveHostSecret } from '../kernel/secret-sources.ts';
import { parseSpec, type SpecBundleCopy, type SpecDocument } from '../domain/spec.ts';
import { changedExpiry } from '../domain/sandbox-lifetime.ts';
import { redactSecrets, type Sealer, type TenantSecrets } from '../kernel/tenant-secrets.ts';
import { TOPICS } from '../kernel/topics.ts';
import { refusedInStep, runBoot, StepFailed, type BootStep, type StepDone } from './boot/pipeline.ts';
import { ensureImage, normalizeReference, type ImageInfo } from './images/images.ts';
import { buildImage } from './images/image-builder.ts';
import { readContextFile } from './images/build-context.ts';
import type { CreateSandboxOptions, ExecResult, Runtime, SandboxHandle, SandboxTerminal, TerminalOptions } from './runtimes/runtime.ts';
import { TERMINAL } from '../domain/terminal-sessions.ts';
import { frozenClockEnv, LIBFAKETIME, makeCheckClock, makeSandboxClock } from './frozen-clock.ts';
import type { SandboxPool } from './runtimes/sandbox-pool.ts';
import { SERVICE_URL_IN_SANDBOX } from './runtimes/local/service-bridge.ts';
import { AUDIT_FILE, AuditLog } from './workspace/audit-log.ts';
import { removeBeneath } from './workspace/beneath.ts';
import { copyFileOut, copyTreeIn, deleteFile, makeDirectory, readFile, removeTree, writeFile } from './workspace/files.ts';
import { FsWatcher } from './workspace/fs-watcher.ts';
import type { EgressGateway } from './network/gateway.ts';
import { backingRoot, BackingServices } from './backing/backing-services.ts';
import { applyDrift, cloneGit, type FixtureContext } from './boot/fixtures.ts';
import { SandboxNetwork } from './network/sandbox-network.ts';
import { processTracer, type ProcessRun } from './runtimes/local/process-tracer.ts';
import { captureLayer } from './workspace/layer-state.ts';
import { resolveRealPath, resolveWorkspacePath, SERVICE_DIR } from './workspace/paths.ts';
import { childName } from './workspace/places.ts';
import { captureState, ChecksumCache, diffStates, type Diff, type FilesystemState } from './workspace/state.ts';

/** Where the agent bundle is mounted, read-only, in every sandbox of a snapshot agent. */
const AGENT_DIR = '/agent';
/** HOME of a sandbox with `private_home`: a directory of the sandbox user in its private /tmp. */
const AGENT_HOME = '/tmp/home';

type State = SandboxChanged['state'];

/** The read-only image's command directories: nothing the agent can write is on a PATH of ours. */
const IMAGE_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

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

/** A shell of the sandbox (LiveSandbox.openTerminal). */
export interface ShellTerminal {
  readonly terminal: SandboxTerminal;
  /** Hangs it up; the first reason given is the one its end carries. */
  close(reason: string, error: ErrorCode): void;
  /** Nothing of it is left, and its end is recorded: the shell's exit code, and why the service ended it (null: it exited). */
  readonly ended: Promise<{ exitCode: number; error: ErrorCode | null; reason: string | null }>;
}

/** How long a destroy waits for its shells to hang up (and their ends to be recorded) before it tears the sandbox down. */
const TERMINALS_END_MS = 3000;

/** A moment for the exits of a kill to come through the tracer's pipe before the watch ends. */
const PROCESS_EVENTS_DRAIN_MS = 100;
/** The largest answer of a real host a mock in record mode keeps. */
const MOCK_RECORD_MAX_BYTES = 1024 * 1024;

/** A `process_spawn` record of a program a command started (the commands API records the commands themselves). */
function processSpawnDetails(run: ProcessRun): Record<string, unknown> {
  return {
    command: run.command,
    pid: run.pid,
    parent_pid: run.parent_pid,
    exit_code: run.exit_code,
    duration_ms: run.duration_ms,
    ...(run.signal !== null ? { signal: run.signal } : {}),
    ...(run.truncated ? { truncated: true } : {}),
  };
}

export class LiveSandbox {
  state: State = 'creating';
  private readonly spec: SpecDocument;
  /** on the host: `workspaces/<id>`, or where a warm sandbox taken from the pool was made */
  private workspace: string;
  private box: SandboxHandle | null = null;
  /** Boot warnings on their way to the audit log: `ready` waits for them (a failed write fails the boot there). */
  private readonly bootWarnings: Array<Promise<void>> = [];
  private readonly network: SandboxNetwork;
  private readonly backing: BackingServices;
  /** The image the sandbox runs: its reference, digest, and what replaced it when it could not be had. */
  image: { reference: string; digest: string | null; replaced: string | null } | null = null;
  /** The image's own variables (its config's Env: PATH, LANG, a tool's home...), under the spec's. */
  private imageEnv: Record<string, string> = {};
  /** The append of the latest db_write record (appends keep their order). */
  private lastDbWrite: Promise<unknown> = Promise.resolve();
  private audit: AuditLog | null = null;
  private watcher: FsWatcher | null = null;
  /** Ends the kernel's report of the sandbox's processes (audit.process_spawns). */
  private endProcessWatch: (() => void) | null = null;
  private captureEnded: Promise<Diff | null> | null = null;
  /** The workspace's diff as the agent left it, once taken (grader files come after it). */
  private finalDiff: Promise<Diff> | null = null;
  /** The workspace paths the grader's bundles wrote, removed after the checks. */
  private graderPaths: string[] = [];
  /** The host directory of AGENT_HOME, for a sandbox with `private_home`. */
  private homeDir: string | null = null;
  /** The audit records' appends to svc.audit, in the order they were written. */
  private auditChain: Promise<void> = Promise.resolve();
  private readonly queuedAudit: Array<{ ts: string; type: string; details: object }> = [];
  private before: FilesystemState | null = null;
  /** The other writable places (/tmp, /dev/shm) at ready, for the reconciliation; null unless the file watch runs. */
  private beforeElsewhere: FilesystemState | null = null;
  private secretValues: Record<string, string> = {};
  private env: Record<string, string> = {};
  private seq = 0;
  private expiresAt = 0;
  private timer: NodeJS.Timeout | null = null;
  private readonly createdAt = Date.now();
  private readonly tokenHash: string;
  private readonly token: string;
  private destroying: Promise<void> | null = null;
  /** Checksums kept between captures, so a state or diff re-hashes only what changed. */
  private readonly checksums = new ChecksumCache();
  /** Forks refused at pids.max so far, to report each new burst once. */
  private pidsLimitHits = 0;
  private eventChain: Promise<unknown> = Promise.resolve();
  private queuedEvents: SandboxEvent[] = [];
  /** open shells by session id */
  private readonly terminals = new Map<string, ShellTerminal>();

  constructor(
    private readonly kernel: Kernel,
    private readonly runtime: Runtime,
    /** warm sandboxes made ahead (null: none) */
    private readonly pool: SandboxPool | null,
    /** the runner's egress gateway, or why it did not start */
    private readonly gateway: EgressGateway | string,
    private readonly tenantSecrets: TenantSecrets,
    private readonly sealer: Sealer,
    /** agent bundles (mounted at /agent) and task-file bundles (copied in), extracted once per content */
    private readonly bundles: { agents: ExtractedBundles; taskFiles: ExtractedBundles },
    private readonly runnerId: string,
    readonly tenant: string,
    readonly id: string,
    private readonly request: CreateRequest,
    private readonly onGone: () => void,
  ) {
    this.spec = request.spec ?? parseSpec(request.yaml);
    this.network = new SandboxNetwork(id, this.spec, request.agent);
    this.backing = new BackingServices(this.spec.services, {
      sandboxId: id,
      root: backingRoot(kernel.config.dataDir, id),
      cacheDir: path.join(kernel.config.dataDir, 'service-templates'),
      binDir: kernel.config.postgresBinDir,
      auditWrites: this.spec.audit.db_writes,
      onWrite: (service, write) => {
        this.lastDbWrite = this.audit?.record('db_write', { service, ...write }).catch(() => null) ?? this.lastDbWrite;
      },
      forward: (service) => (request) => {
        const address = this.network.address;
        if (address === null || typeof this.gateway === 'string') return Promise.reject(new Error('the sandbox has no way out'));
        return this.gateway.fetchOutside(address, service, request, MOCK_RECORD_MAX_BYTES);
      },
      redact: (text) => this.redact(text),
      // As large as the workspace's (resources.disk, else SVC_SANDBOX_DISK_DEFAULT).
      disk: async (service) => (await this.runtime.disk?.(`${id}-${service}`, this.spec.resources.diskBytes)) ?? `the ${this.runtime.name} runtime makes no disks`,
    });
    this.workspace = path.join(kernel.config.dataDir, 'workspaces', id);
    this.token = newSandboxToken();
    this.tokenHash = sha256Hex(this.token);
  }

  /** The digest of the agent bundle this sandbox mounts, if any. */
  get agentDigest(): string | null {
    return this.request.agent?.digest ?? null;
  }

  /** The workspace directory on the host. */
  get workspaceDir(): string {
    return this.workspace;
  }

  /** Audit records dropped by the limits so far, by type (see AuditLog.dropped). */
  get auditDropped(): Record<string, number> {
    return this.audit?.dropped ?? {};
  }

  /** The environment every command gets (secrets included: for the service's own use, never shown). */
  get environment(): Readonly<Record<string, string>> {
    return this.env;
  }

  /**
   * Kills every process of the sandbox but its supervisor (the agent's whole tree, daemons
   * included), then ends the capture of its activity with everything the agent did recorded:
   * what follows is the service's own work, not the agent's.
   */
  async endAgent(): Promise<void> {
    await this.box!.killAll();
    await this.endCapture();
  }

  /** The workspace's diff since ready as the agent left it: the reconciliation's, when it made one (one capture, not two). */
  agentDiff(): Promise<Diff> {
    this.finalDiff ??= (async () => (await this.endCapture()) ?? diffStates(this.before!, await this.captureState()))();
    return this.finalDiff;
  }

  /**
   * Writes the spec's grader files and bundles into the workspace (as the setup ones are). Only
   * after the agent's end and its diff: no process of the agent is left to see them, and neither
   * its diff nor its audit holds them (the service's own writes, not recorded). Returns why one
   * could not be written (the agent may have left a file where a directory goes), or null.
   */
  async writeGraderFiles(): Promise<string | null> {
    if (!this.finalDiff) throw new Error('grader files are written only once the agent has ended and its diff is taken');
    await this.finalDiff;
    for (const [i, file] of this.spec.grader.files.entries()) {
      const field = `grader.files[${i}].path`;
      try {
        await writeFile(this.workspace, file.path, file.content, { field, mode: file.mode });
      } catch (err) {
        return `the grader's file ${excerpt(file.path)} could not be written: ${(err as Error).message}`;
      }
    }
    for (const [i, bundle] of this.spec.grader.bundles.entries()) {
      try {
        this.graderPaths.push(...(await this.copyBundle(bundle, `grader.bundles[${i}]`)));
      } catch (err) {
        return `the grader's bundle ${bundle.digest.slice(0, 19)} could not be copied to ${excerpt(bundle.to || '/workspace')}: ${(err as Error).message}`;
      }
    }
    return null;
  }

  /** Removes the grader's files and bundles once the checks ran (one a check removed itself is not missed). */
  async removeGraderFiles(): Promise<void> {
    for (const file of this.spec.grader.files) await deleteFile(this.workspace, file.path).catch(() => undefined);
    for (const name of this.graderPaths.splice(0)) await removeTree(this.workspace, name, { field: 'grader.bundles' }).catch(() => undefined);
  }

  /** Copies a task-file bundle into the workspace under its `to`; returns the workspace paths of its top-level names. */
  private async copyBundle(bundle: SpecBundleCopy, field: string): Promise<string[]> {
    const dir = await this.bundles.taskFiles.ensure(bundle.digest);
    return copyTreeIn(this.workspace, dir, bundle.to, { field: `${field}.to` });
  }

  /**
   * Ends the capture of the agent's activity (once): the process capture, then the file watch,
   * then the reconciliation of what the watch saw with what changed since ready, whose diff it
   * returns (null when there was no watch to reconcile).
   */
  private endCapture(): Promise<Diff | null> {
    this.captureEnded ??= (async () => {
      await this.stopWatchingProcesses();
      if (!this.watcher) return null;
      await this.watcher.stop();
      if (!this.before) return null;
      const diff = diffStates(this.before, await this.captureState());
      await this.reconcileFileRecords(this.watcher, diff);
      if (this.beforeElsewhere) await this.reconcileFileRecords(this.watcher, diffStates(this.beforeElsewhere, await this.captureElsewhere()));
      return diff;
    })();
    return this.captureEnded;
  }

  /**
   * A change the watch missed still gets a record: a write through a hard link made outside the
   * watched paths, or through mmap, changes the file without an inotify event the watch can see.
   * Every file added or modified since ready (deleted, when deletes are tracked) under the watched
   * paths without a record of it gets one, marked `found_by: "reconciliation"`.
   */
  private async reconcileFileRecords(watcher: FsWatcher, diff: Diff): Promise<void> {
    const changes: Array<['file_write' | 'file_delete', 'writes' | 'deletes', string[]]> = [
      ['file_write', 'writes', [...diff.added, ...diff.modified]],
      ['file_delete', 'deletes', diff.removed],
    ];
    // One at a time: a workspace of a million new files is a million records, most of them dropped by the log's limits.
    for (const [type, kind, paths] of changes) {
      for (const rel of paths) if (watcher.reports(kind, rel) && !this.audit!.hasFileRecord(type, rel)) await this.audit!.record(type, { path: rel, found_by: 'reconciliation' });
    }
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
    const runner = 'shell' in source ? CHECK_RUNNERS.shell : CHECK_RUNNERS.python;
    const name = `.svc-check-${randomBytes(8).toString('hex')}`;
    const dir = makeDirectory(this.tmpOnHost(), name, { mode: 0o755 });
    const clock = this.spec.determinism.frozenTime ? await makeCheckClock(this.box!) : null;
    try {
      makeDirectory(dir, 'home', { mode: 0o700, owner: this.box!.user });
      await writeFile(dir, runner.file, 'shell' in source ? source.shell : source.python);
      const bytes = { stdout: 0, stderr: 0 };
      const r = await this.box!.exec({
        command: runner.command,
        timeoutMs: options.timeoutMs,
        env: { ...CHECK_ENV, ...clock?.env, SVC_CHECK_DIR: `/tmp/${name}` },
        maxCaptureBytes: options.maxOutputBytes,
        onOutput: (stream, chunk) => (bytes[stream] += chunk.length),
      });
      const kept = (stream: 'stdout' | 'stderr') => ({ text: this.output(r, stream), bytes: bytes[stream], truncated: r.truncated[stream] });
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
    const r = await this.box!.exec({ command: 'cd -- "$SVC_WORKDIR"', env: { SVC_WORKDIR: dir }, timeoutMs: 30_000 });
    return r.exitCode === 0 ? null : this.output(r, 'stderr').trim() || `exit code ${r.exitCode}`;
  }

  /** The sandbox's /tmp on the host (a place the runtime shows the service). */
  private tmpOnHost(): string {
    const tmp = this.box!.writablePlaces.find((place) => place.at === '/tmp');
    if (!tmp) throw new Error(`the ${this.runtime.name} runtime does not show the sandbox's /tmp to the service`);
    return tmp.host;
  }

  /** Runs the agent's command: a command of the sandbox like any other (audited, its output redacted), with `env` (agent.env) for it alone. */
  agentCommand(command: string, options: { timeoutMs: number; env: Record<string, string> }): Promise<OpAnswer<'command'>> {
    this.assertOperable();
    return this.runCommand(command, { timeoutMs: options.timeoutMs, background: false, env: options.env });
  }

  /**
   * A shell on a terminal of the sandbox (docs/sandboxes.md "Shell"): its processes are the
   * sandbox user's, like a command's. Its start and end are `terminal` events of the stream and
   * the shell a `process_spawn` record of the audit, with its exit code and byte counts; what
   * went through it is recorded nowhere.
   */
  async openTerminal(sessionId: string, options: TerminalOptions): Promise<ShellTerminal> {
    this.assertOperable();
    if (this.terminals.size >= TERMINAL.maxPerSandbox) throw new AppError('conflict', `sandbox ${this.id} has ${TERMINAL.maxPerSandbox} shells open, the most at once; exit one first`);
    if (this.state === 'ready') await this.setState('running');
    const started = performance.now();
    const terminal = await this.box!.openTerminal(options).catch((err: Error) => {
      throw new AppError('conflict', `the shell did not start in sandbox ${this.id}: ${err.message}`);
    });
    let ending: { reason: string; error: ErrorCode } | null = null;
    const ended = terminal.exited.then(async ({ exitCode }) => {
      this.terminals.delete(sessionId);
      const end = { session_id: sessionId, exit_code: exitCode, duration_ms: Math.round(performance.now() - started), input_bytes: terminal.inputBytes, output_bytes: terminal.outputBytes, ...(ending ? { reason: ending.reason } : {}) };
      await this.audit?.record('process_spawn', { command: `${terminal.shell} -i`, terminal: sessionId, exit_code: exitCode, duration_ms: end.duration_ms, output_bytes: terminal.outputBytes }).catch(() => undefined);
      await this.event('terminal', { phase: 'closed', ...end });
      return { exitCode, error: ending?.error ?? null, reason: ending?.reason ?? null };
    });
    const shell: ShellTerminal = {
      terminal,
      ended,
      close: (reason, error) => {
        ending ??= { reason, error };
        terminal.close();
      },
    };
    this.terminals.set(sessionId, shell);
    void this.event('terminal', { phase: 'opened', session_id: sessionId, shell: terminal.shell, term: options.term, cols: options.cols, rows: options.rows });
    return shell;
  }

  /** Hangs up every shell with why the sandbox ends, and waits (a while) for their ends to be recorded. */
  private async closeTerminals(reason: string): Promise<void> {
    if (this.terminals.size === 0) return;
    const why = reason === 'destroyed' ? `sandbox ${this.id} was destroyed` : reason === 'timeout' ? `sandbox ${this.id} reached its timeout` : `sandbox ${this.id} ended: ${reason}`;
    const ends = [...this.terminals.values()].map((shell) => {
      shell.close(why, 'not_found');
      return shell.ended;
    });
    await Promise.race([Promise.allSettled(ends), new Promise((resolve) => setTimeout(resolve, TERMINALS_END_MS).unref())]);
  }

  /** The Sandbox object of the spec. */
  view(): RunnerSandboxView {
    return {
      id: this.id,
      spec_id: this.request.spec_id,
      state: this.state,
      path: this.workspace,
      url: `${this.kernel.config.baseUrl}/v1/sandboxes/${this.id}`,
      created_at: new Date(this.createdAt).toISOString(),
      expires_at: new Date(this.expiresAt).toISOString(),
      metadata: this.request.metadata,
      services: this.backing.view(),
      network: this.network.view(),
    };
  }

  // --- boot -------------------------------------------------------------------------------

  /**
   * The boot pipeline, in the spec's order, run by `runBoot` (boot/pipeline.ts). Each step is one
   * method; it reports itself done with a `status` event named as here, and a failure in it names
   * it too. A new step is a new entry at its place in the spec's order.
   */
  private static readonly BOOT_STEPS: readonly BootStep<LiveSandbox>[] = [
    { name: 'secrets_resolved', run: (s, done) => s.resolveSecrets(done) },
    { name: 'container_started', run: (s, done) => s.startRuntime(done) },
    { name: 'services_started', run: (s, done) => s.startServices(done) },
    { name: 'fixtures_applied', run: (s, done) => s.applyFixtures(done) },
    { name: 'setup_applied', run: (s, done) => s.applySetup(done) },
    { name: 'network_configured', run: (s, done) => s.configureNetwork(done) },
    { name: 'audit_started', run: (s, done) => s.startAuditCapture(done) },
    { name: 'snapshot_taken', run: (s, done) => s.takeSnapshot(done) },
    // A failure to mark ready is reported at snapshot_taken, as it always has been.
    { name: 'ready', failsAs: 'snapshot_taken', run: (s, done) => s.markReady(done) },
  ];

  /** Runs the boot pipeline; a failed step is reported (its `status` event with the error), and the sandbox torn down. */
  async boot(): Promise<void> {
    const { config } = this.kernel;
    this.expiresAt = this.createdAt + (this.request.timeout_ms ?? this.spec.resources.timeoutMs ?? config.sandboxTimeout);
    await this.setState('creating');
    void this.event('status', { state: 'creating' });
    await runBoot(this, LiveSandbox.BOOT_STEPS, {
      done: (step, data) => void this.event('status', { step, ...data }),
      failed: async (step, failure) => {
        await this.event('status', { step, error: failure.message });
        await this.setState('error', failure.message).catch(() => {});
        await this.teardown('boot failed').catch(() => {});
      },
    });
  }

  private async resolveSecrets(done: StepDone): Promise<void> {
    this.secretValues = await this.collectSecrets();
    this.checkAgentEnv();
    done({ count: Object.keys(this.secretValues).length });
  }

  /** The isolation runtime, over the workspace, with the image (or the host's system directories) and the audit log. */
  private async startRuntime(done: StepDone): Promise<void> {
    const { config } = this.kernel;
    // From the image store, pulled into it when missing; failing that, the host's system directories where allowed.
    const image = await this.obtainImage().catch((err: Error) => {
      if (config.sandboxHostRootfs && !this.spec.build) return err;
      if (this.spec.build) throw new StepFailed(`image could not be built: "${this.spec.base}": ${err.message}`);
      throw new StepFailed(`image could not be pulled: "${this.spec.base}": ${err.message} (or put it in the image store: svc images pull|import ${this.spec.base})`);
    });
    const rootfs = image instanceof Error ? null : image.rootfs;
    this.imageEnv = image instanceof Error ? {} : imageEnv(image.config?.env ?? []);
    this.image = image instanceof Error ? { reference: this.spec.base, digest: null, replaced: `the host's system directories (SVC_SANDBOX_HOST_ROOTFS): ${image.message}` } : { reference: this.spec.base, digest: image.digest ?? null, replaced: null };
    // Its services start while the runtime does: they need nothing of it, and the databases take longest.
    this.backing.start();
    this.env = this.baseEnv();
    if (this.network.wanted && typeof this.gateway === 'string') throw new StepFailed(`this sandbox needs a network, but the runner's egress gateway did not start: ${this.gateway}`);
    const options: CreateSandboxOptions = {
      id: this.id,
      workspace: this.workspace,
      // The same for every sandbox: a warm one made ahead is named alike.
      hostname: 'sandbox',
      readOnlyMounts: await this.readOnlyMounts(),
      rootfs,
      env: this.env,
      resources: { memoryBytes: this.spec.resources.memoryBytes, cpus: this.spec.resources.cpus, pids: this.spec.resources.pids, diskBytes: this.spec.resources.diskBytes },
      hosts: this.spec.determinism.dns,
      service: serviceAddress(this.kernel.config.baseUrl)?.address,
      network: this.network.wanted && typeof this.gateway === 'object' ? { trust: this.gateway.authority } : undefined,
      user: this.spec.sandbox.user,
      writableRoot: this.spec.sandbox.writableRoot,
    };
    const warm = await this.pool?.take(options);
    if (warm) this.workspace = warm.workspace;
    else await mkdir(path.join(this.workspace, '.svc'), { recursive: true });
    this.box = warm?.box ?? (await this.runtime.create(options));
    this.audit = new AuditLog({
      workspace: this.workspace,
      sandboxId: this.id,
      redact: (text) => this.redact(text),
      onRecord: (r) => {
        this.queuedAudit.push(r);
        this.auditChain = this.auditChain.then(() => this.publishAudit()).catch((err) => this.kernel.logger.error({ err, sandbox_id: this.id }, 'audit records did not reach the log'));
      },
      recordsPerSecond: config.auditRecordsPerSecond,
      maxRecords: config.auditMaxRecords,
    });
    await this.startClock();
    done({ runtime: this.runtime.name, warm: Boolean(warm) });
    if (rootfs === null) this.warnWhileBooting(`image "${this.spec.base}" is not in the image store; running on the host's read-only system directories (SVC_SANDBOX_HOST_ROOTFS)`);
  }

  /** Makes the sandbox's frozen clock (frozen-clock.ts) before anything runs; without it each command's processes keep one of their own. */
  private async startClock(): Promise<void> {
    if (!this.spec.determinism.frozenTime) return;
    const { made, result } = await makeSandboxClock(this.box!);
    if (!made) await this.warnAudited(`the frozen clock is one per command, not one per sandbox: its files could not be made (${this.output(result, 'stderr').trim() || `exit code ${result.exitCode}`}); each command's processes leave two in /dev/shm`);
  }

  /** The spec's image: built from its Dockerfile (every unchanged step cached), else from the store, pulled when missing. */
  private async obtainImage(): Promise<ImageInfo> {
    const { config } = this.kernel;
    const imagesDir = path.join(config.dataDir, 'images');
    if (!this.spec.build) return ensureImage(imagesDir, this.spec.base, config);
    const { build } = this.spec;
    const context = build.context ? await this.bundles.taskFiles.ensure(build.context) : null;
    const dockerfile = build.dockerfile ?? readContextFile(context!, build.file);
    // RUN steps go out under the spec's own egress policy (a package install needs its mirror allowed).
    const network = typeof this.gateway === 'object' ? this.network.forBuild(this.gateway, (line) => this.kernel.logger.info({ sandbox_id: this.id }, `image build: ${line}`)) : null;
    const built = await buildImage({ imagesDir, runtime: this.runtime, settings: config, dockerfile, context, network, name: normalizeReference(this.spec.base) });
    return built.image;
  }

  /** The service's `.svc`, libfaketime for a frozen clock, and the agent's bundle (extracted now) for a snapshot agent. */
  private async readOnlyMounts(): Promise<{ host: string; sandbox: string }[]> {
    const mounts = [{ host: path.join(this.workspace, '.svc'), sandbox: '/workspace/.svc' }];
    if (this.spec.determinism.frozenTime) mounts.push({ host: LIBFAKETIME, sandbox: LIBFAKETIME });
    const agent = this.request.agent;
    if (agent) {
      const bundle = await this.bundles.agents.ensure(agent.digest).catch((err: Error) => {
        throw new StepFailed(`agent snapshot ${agent.name} v${agent.version} (${agent.snapshot_id}) could not be extracted: ${err.message}`);
      });
      mounts.push({ host: bundle, sandbox: AGENT_DIR });
    }
    return mounts;
  }

  /**
   * Backing services (backing/), started with the runtime: waited for as their `wait_for` says;
   * then the gateway serves the sandbox, its services included, under its policy.
   */
  private async startServices(done: StepDone): Promise<void> {
    await this.backing.waitReady().catch((err: Error) => {
      throw new StepFailed(err.message);
    });
    for (const warning of this.backing.warnings) this.warnWhileBooting(warning);
    if (this.network.wanted) {
      await this.network.attach(this.box!, this.gateway as EgressGateway, this.secretValues, await this.backing.endpoints(), (type, details) => void this.audit!.record(type, details).catch(() => undefined));
    }
    done({ count: this.backing.count, services: this.backing.view() });
  }

  /** What the fixtures of boot/fixtures.ts use of the sandbox. */
  private fixtureContext(): FixtureContext {
    return {
      workspace: this.workspace,
      exec: async (command, env, timeoutMs) => {
        const r = await this.box!.exec({ command, env, timeoutMs });
        return { exitCode: r.exitCode, output: this.output(r, r.stderr ? 'stderr' : 'stdout') };
      },
      backing: this.backing,
      gitFixtureDirs: this.kernel.config.gitFixtureDirs,
      seed: Number(this.request.extra_env?.SVC_RANDOM_SEED ?? this.spec.determinism.seed ?? 0),
    };
  }

  /** The fixtures in order, but drift (applied after setup). */
  private async applyFixtures(done: StepDone): Promise<void> {
    for (const [i, fixture] of this.spec.fixtures.entries()) {
      if (fixture.type === 'drift') continue;
      if (fixture.type === 'sql') {
        await (await this.backing.database(fixture.service)).runSql(fixture.sql).catch((err: Error) => {
          throw new StepFailed(`fixture ${i} (sql on ${fixture.service}) failed: ${this.redact(err.message)}`);
        });
        void this.event('fixture', { index: i, type: fixture.type, service: fixture.service });
        continue;
      }
      if (fixture.type === 'git') {
        void this.event('fixture', { index: i, type: fixture.type, to: await cloneGit(this.fixtureContext(), i, fixture) });
        continue;
      }
      // A copy fixture copies a directory of the image into the workspace, inside the sandbox (as its
      // user: links it brings are the sandbox's view). Never into `.svc`, also not through a link.
      const to = resolveWorkspacePath(this.workspace, fixture.to, `fixtures[${i}].to`);
      await resolveRealPath(this.workspace, to, `fixtures[${i}].to`, { forWrite: true }).catch(refusedInStep);
      const result = await this.box!.exec({ command: `mkdir -p '/workspace/${to.relative}' && cp -a -- ${shellQuote(`${fixture.from}/.`)} '/workspace/${to.relative}/'`, timeoutMs: 60_000 });
      if (result.exitCode !== 0) throw new StepFailed(`fixture ${i} (copy ${fixture.from} -> ${fixture.to}) failed: ${this.output(result, 'stderr').trim().slice(-500)}`);
      void this.event('fixture', { index: i, type: fixture.type, to: to.relative });
    }
    done({ count: this.spec.fixtures.length });
  }

  /** The private HOME (when asked for), the agent's config files, the spec's setup files, then its setup commands. */
  private async applySetup(done: StepDone): Promise<void> {
    // Made before any process of the sandbox's user runs: nothing can be in the way, or swap it while the config files go in.
    if (this.request.private_home) this.homeDir = makeDirectory(this.tmpOnHost(), path.posix.basename(AGENT_HOME), { mode: 0o700, owner: this.box!.user });
    await this.writeAgentConfigFiles();
    for (const [i, bundle] of this.spec.setup.bundles.entries()) {
      await this.copyBundle(bundle, `setup.bundles[${i}]`).catch((err: Error) => {
        throw new StepFailed(`setup.bundles[${i}] (${bundle.digest.slice(0, 19)}) could not be copied: ${err.message}`);
      });
    }
    for (const [i, file] of this.spec.setup.files.entries()) {
      // Through the files API's own write: never through a link out of the workspace (a fixture may
      // have brought one), never into `.svc`.
      await writeFile(this.workspace, file.path, file.content, { field: `setup.files[${i}].path`, mode: file.mode }).catch(refusedInStep);
    }
    for (const command of this.spec.setup.commands) {
      const result = await this.box!.exec({ command, timeoutMs: 5 * 60_000 });
      if (result.exitCode !== 0) {
        throw new StepFailed(`setup command "${excerpt(this.redact(command))}" exited with ${result.exitCode}: ${this.output(result, result.stderr ? 'stderr' : 'stdout').trim().slice(-500)}`);
      }
    }
    let drift = 0;
    for (const [i, fixture] of this.spec.fixtures.entries()) {
      if (fixture.type !== 'drift') continue;
      const applied = await applyDrift(this.fixtureContext(), i, fixture);
      drift += applied.length;
      void this.event('fixture', { index: i, type: fixture.type, applied });
    }
    done({ files: this.spec.setup.files.length, bundles: this.spec.setup.bundles.length, commands: this.spec.setup.commands.length, drift });
  }

  /**
   * The sandbox's network (network/sandbox-network.ts), its link made while the runtime started:
   * from now on the gateway lets out what the policy allows. Determinism was applied as the
   * runtime started. Waits for the sandbox's bridge to the service too.
   */
  private async configureNetwork(done: StepDone): Promise<void> {
    await this.box!.serviceReachable;
    const view = this.network.wanted ? await this.network.openIngress(this.box!) : null;
    done({
      egress: this.spec.network.egress.default,
      egress_allow: this.network.allow,
      ...(view ? { address: view.address, ingress: view.ingress } : {}),
      determinism: { frozen_time: this.spec.determinism.frozenTime, seed: this.spec.determinism.seed, dns: Object.keys(this.spec.determinism.dns).length },
    });
  }

  /** The audit log runs since the runtime started; this starts the file watch, when the spec asks for one. */
  private async startAuditCapture(done: StepDone): Promise<void> {
    const { watch, track } = this.spec.audit.file_system;
    if (watch.length > 0) {
      this.watcher = new FsWatcher({ workspace: this.workspace, places: this.box!.writablePlaces, watch, track, audit: this.audit! });
      await this.watcher.start();
    }
    if (this.spec.audit.process_spawns) await this.watchProcesses();
    // always: the databases also note what their names resolve to, which the `sql` invariant holds its query to
    await this.backing.startAudit();
    done({ file_system: watch.length > 0, process_spawns: this.endProcessWatch !== null, db_writes: this.spec.audit.db_writes });
  }

  /**
   * audit.process_spawns: every program a command starts, at any depth, as the kernel saw it
   * (runtimes/local/process-tracer.ts). Where that capture cannot run, a warning says so.
   */
  private async watchProcesses(): Promise<void> {
    const tracer = processTracer(this.kernel.config.processTracer);
    const where = this.box!.processes();
    if (typeof tracer === 'string' || where === null) {
      return this.warnAudited(`process capture is off: ${typeof tracer === 'string' ? tracer : 'the runtime cannot name the sandbox\'s processes'}; only the commands themselves are recorded`);
    }
    try {
      this.endProcessWatch = await tracer.watch({
        ...where,
        onRun: (run) => void this.audit!.record('process_spawn', processSpawnDetails(run), { ts: run.started_at }).catch(() => undefined),
        onLost: (lost) => void this.warnAudited(`the kernel dropped ${lost} process events: the process record is incomplete`),
        onStopped: (reason) => {
          this.endProcessWatch = null;
          void this.warnAudited(`process capture stopped (${reason}); later processes are not recorded`);
        },
      });
    } catch (err) {
      await this.warnAudited(`process capture is off: ${(err as Error).message}; only the commands themselves are recorded`);
    }
  }

  /** Ends the process capture; the kernel's last events (the kill's exits) reach the tracer a moment later. */
  private async stopWatchingProcesses(): Promise<void> {
    if (!this.endProcessWatch) return;
    await new Promise((r) => setTimeout(r, PROCESS_EVENTS_DRAIN_MS));
    this.endProcessWatch();
    this.endProcessWatch = null;
  }

  /** The before-run snapshot, which diffs compare against. */
  private async takeSnapshot(done: StepDone): Promise<void> {
    this.before = await this.captureState();
    if (this.watcher) this.beforeElsewhere = await this.captureElsewhere();
    done({ files: Object.keys(this.before.files).length });
  }

  private async markReady(done: StepDone): Promise<void> {
    await Promise.all(this.bootWarnings.splice(0));
    await this.setState('ready');
    done();
    await this.event('status', { state: 'ready' });
    this.armTimer();
    void this.box!.exited.then(() => this.lost());
  }

  /** A `warning` event, and the same warning in the audit log. */
  private async warnAudited(message: string): Promise<void> {
    void this.event('warning', { message });
    await this.audit!.record('warning', { message });
  }

  /** warnAudited, written while the boot goes on (the write is a file's open and append in the workspace, milliseconds on a busy disk). */
  private warnWhileBooting(message: string): void {
    const written = this.warnAudited(message);
    written.catch(() => {});
    this.bootWarnings.push(written);
  }

  /** Dashboard-stored plus spec-declared secrets (the spec's win on collision), and the request's over both. */
  private async collectSecrets(): Promise<Record<string, string>> {
    const values = this.tenantSecrets.values(this.tenant);
    for (const [name, source] of Object.entries(this.spec.secrets)) {
      if (name in this.request.secrets) continue;
      if (source === 'dashboard') {
        if (!(name in values)) throw new StepFailed(`required secret ${name} is missing: it is declared with source dashboard but not stored for this tenant (PUT /v1/secrets/${name})`);
        continue;
      }
      try {
        values[name] = await resolveHostSecret(name, source, this.kernel.config);
      } catch (err) {
        throw new StepFailed(`required secret ${name} is missing: ${(err as Error).message}`);
      }
    }
    return { ...values, ...this.request.secrets };
  }

  /** A snapshot's `auth.required_env` must be set by the sandbox's secrets or the spec's env. */
  private checkAgentEnv(): void {
    const agent = this.request.agent;
    const set = new Set([...Object.keys(this.secretValues), ...Object.keys(this.spec.setup.env), ...Object.keys(this.spec.agent?.env ?? {})]);
    const missing = (agent?.auth?.required_env ?? []).filter((name) => !set.has(name));
    if (agent && missing.length > 0) {
      throw new StepFailed(
        `required env var ${missing.join(', ')} of agent snapshot ${agent.name} v${agent.version} is missing: set it as a secret (the spec's secrets, PUT /v1/secrets/${missing[0]} or the request's secrets) or in setup.env`,
      );
    }
  }

  /** The snapshot's `auth.config_files`, with their secrets filled in; written by the service, not the agent. `~/` is HOME. */
  private async writeAgentConfigFiles(): Promise<void> {
    for (const [i, file] of (this.request.agent?.auth?.config_files ?? []).entries()) {
      const root = file.path.startsWith('~/') && this.homeDir !== null ? this.homeDir : this.workspace;
      const relative = file.path.replace(/^~\//, '').replace(/^\/workspace(\/|$)/, '');
      let content: string;
      try {
        content = renderConfigTemplate(file.template, { ...this.secretValues, ...this.network.placeholders() });
      } catch (err) {
        throw new StepFailed(`agent config file ${file.path}: ${(err as Error).message} (declare it under the spec's secrets or store it with PUT /v1/secrets)`);
      }
      await writeFile(root, relative, content, { field: `agent.auth.config_files[${i}].path` }).catch(refusedInStep);
    }
  }

  private baseEnv(): Record<string, string> {
    const { determinism } = this.spec;
    const env: Record<string, string> = {
      HOME: this.request.private_home ? AGENT_HOME : '/workspace',
      PATH: IMAGE_PATH,
      LANG: 'C.UTF-8',
      ...this.imageEnv,
      ...this.secretValues,
      // The trust store's paths; a brokered secret's placeholder over its value.
      ...this.network.env(),
      // Where its backing services are, and the databases' credentials.
      ...this.backing.env(),
      ...this.spec.setup.env,
      // Inside, the service is reached through the sandbox's bridge (runtimes/local/service-bridge.ts).
      SVC_BASE_URL: serviceAddress(this.kernel.config.baseUrl)?.urlInside ?? this.kernel.config.baseUrl,
      SVC_API_KEY: this.token,
      SVC_SANDBOX_ID: this.id,
      ...this.request.extra_env,
    };
    if (determinism.frozenTime) {
      Object.assign(env, frozenClockEnv(determinism.frozenTime));
    }
    if (determinism.seed !== null) {
      env.SVC_RANDOM_SEED = String(determinism.seed);
      env.PYTHONHASHSEED = String(determinism.seed);
    }
    return env;
  }

  /** The workspace's state; the service's own reads of it are not the agent's (the watcher ignores them). */
  private captureState(): Promise<FilesystemState> {
    return this.unwatched({ kinds: ['read'] }, () => captureState(this.workspace, { checksumMaxBytes: this.kernel.config.stateChecksumMaxBytes, cache: this.checksums }));
  }

  /** The files of the sandbox's other writable places (/tmp, /dev/shm, a writable root's layer), named as the audit names them (`/tmp/x`, `/etc/x`). */
  private async captureElsewhere(): Promise<FilesystemState> {
    const files: FilesystemState['files'] = {};
    const merged = this.box!.processes();
    for (const place of this.box!.writablePlaces) {
      // Every directory: the names the workspace's diff skips (node_modules, .git) hide no write here.
      const options = { checksumMaxBytes: this.kernel.config.stateChecksumMaxBytes, everyDirectory: true };
      // A writable root over an image: its overlay's upper directory, read with the image below it.
      const layer = place.lower ? { upper: place.host, lower: place.lower, merged: merged && `/proc/${merged.supervisorPid}/root` } : null;
      const state = await this.unwatched({ kinds: ['read'] }, () => (layer ? captureLayer(layer, options) : captureState(place.host, options)));
      for (const [rel, entry] of Object.entries(state.files)) files[childName(place.at, rel)] = entry;
    }
    return { captured_at: new Date().toISOString(), files };
  }

  /** Runs the service's own file work with the file watch (when there is one) ignoring what `scope` names of it. */
  private unwatched<T>(scope: Parameters<FsWatcher['suppressDuring']>[0], run: () => Promise<T>): Promise<T> {
    return this.watcher ? this.watcher.suppressDuring(scope, run) : run();
  }

  // --- operations -------------------------------------------------------------------------

  /**
   * A sandbox being destroyed takes nothing but destroy (`whileDestroying`); one not yet ready,
   * nothing. The dispatcher (sandbox-dispatcher.ts) asks before every operation but a shell's.
   */
  assertOperable(whileDestroying = false): void {
    if (this.destroying && !whileDestroying) throw new AppError('not_found', `sandbox ${this.id} not found`);
    if (!this.destroying && this.state !== 'ready' && this.state !== 'running') throw new AppError('conflict', `sandbox ${this.id} is ${this.state}`);
  }

  /** The workspace's files now. */
  async workspaceState(): Promise<OpAnswer<'state'>> {
    return { body: await this.captureState() };
  }

  /** What changed in the workspace since ready. */
  async diff(): Promise<OpAnswer<'diff'>> {
    return { body: diffStates(this.before!, await this.captureState()) };
  }

  /** An http_mock's journal of the requests it received. */
  serviceRequests(service: string): OpAnswer<'service_requests'> {
    return { body: { service, ...this.mockOf(service).journal() } };
  }

  /** What an http_mock in record mode saw, as routes. */
  serviceRecording(service: string): OpAnswer<'service_recording'> {
    return { body: { service, routes: this.mockOf(service).recording() } };
  }

  /** An http_mock of the sandbox by name; 404 naming the mocks it has. */
  private mockOf(name: unknown): NonNullable<ReturnType<BackingServices['mock']>> {
    const mock = typeof name === 'string' ? this.backing.mock(name) : null;
    if (mock) return mock;
    const mocks = this.spec.services.filter((s) => s.type === 'http_mock').map((s) => s.name);
    throw new AppError('not_found', `sandbox ${this.id} has no http_mock service ${JSON.stringify(name)}${mocks.length > 0 ? ` (it has ${mocks.join(', ')})` : ''}`);
  }

  /** The `sql` invariant: the first column of the first row of `query`, as the database's grader role sees it. */
  async sqlFirst(service: string, query: string): Promise<string | null> {
    return (await this.backing.database(service)).queryFirst(query);
  }

  /** The `http_mock_assertions` invariant's `request_count`: requests the mock received for `method` and `path`. */
  mockRequestCount(service: string, method: string, pathPattern: string): number {
    return this.mockOf(service).requestCount(method, pathPattern);
  }

  /** Every database write committed until now is in the audit log (before the outcome reads it). */
  async recordDatabaseWrites(): Promise<void> {
    await this.backing.flushWrites();
    await this.lastDbWrite;
  }

  /** A command of the API. */
  command(payload: CommandPayload): Promise<OpAnswer<'command'>> {
    return this.runCommand(payload.command, { timeoutMs: payload.timeout_ms ?? undefined, background: payload.background === true });
  }

  /** A command of the sandbox (the API's, the agent's): audited, answered with its redacted output. `env` goes over the sandbox's. */
  private async runCommand(command: string, options: { timeoutMs?: number; background: boolean; env?: Record<string, string> }): Promise<OpAnswer<'command'>> {
    const { timeoutMs, background, env } = options;
    if (this.state === 'ready') await this.setState('running');
    const run = this.box!.exec({ command, timeoutMs, env, maxCaptureBytes: 1024 * 1024 })
      // exec rejects only when the sandbox is gone (destroyed, or ended on its own meanwhile).
      .catch((err: Error) => {
        throw new AppError('conflict', `sandbox ${this.id} ended while the command ran: ${err.message}`);
      })
      .then((r) => this.afterCommand(command, r));
    if (background) {
      run.catch((err) => this.kernel.logger.warn({ err, sandbox_id: this.id }, 'background command failed'));
      return { status: 202, body: { command: this.redact(command), background: true as const } };
    }
    return { body: await run };
  }

  private async afterCommand(command: string, r: ExecResult): Promise<CommandDone> {
    const shown = this.redact(command);
    // Redacted whole, before the audit cuts stdout into chunks.
    const stdout = this.output(r, 'stdout');
    const stderr = this.output(r, 'stderr');
    const chunk = this.kernel.config.stdoutChunkBytes;
    await this.audit!.record('process_spawn', { command: shown, exit_code: r.exitCode, duration_ms: r.durationMs, output_bytes: r.outputBytes, ...(this.spec.audit.stdout_capture ? { stdout: stdout.slice(0, chunk) } : {}) });
    if (this.spec.audit.stdout_capture) {
      for (let i = 0; i < stdout.length; i += chunk) await this.audit!.record('stdout', { command: shown, chunk: stdout.slice(i, i + chunk), index: i / chunk });
      // A secret's value in captured stdout is a finding naming the secret (never its value): secrets_in_logs.
      for (const [name, value] of Object.entries(this.secretValues)) {
        if (value !== '' && r.stdout.includes(value)) await this.audit!.record('secret_finding', { name, command: shown });
      }
    }
    await this.event('command', { command: shown, exit_code: r.exitCode, duration_ms: r.durationMs, ...(r.timedOut ? { timed_out: true } : {}), ...(r.oomKilled ? { oom_killed: true } : {}) });
    if (r.oomKilled) await this.event('warning', { message: `command "${shown}" was killed: the sandbox ran out of memory (limit ${this.spec.resources.memoryBytes} bytes)` });
    const { pidsLimitHits } = await this.box!.usage();
    if (pidsLimitHits > this.pidsLimitHits) {
      this.pidsLimitHits = pidsLimitHits;
      await this.event('warning', { message: `command "${shown}" hit the sandbox's process limit (pids ${this.spec.resources.pids}): ${pidsLimitHits} forks refused so far` });
    }
    if (this.spec.snapshots.checkpoints === 'per_action') {
      const state = await this.captureState();
      await this.event('checkpoint', { after: shown, files: Object.keys(state.files).length, diff: diffStates(this.before!, state) });
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

  /** A file of the workspace, as bytes. */
  async fileRead(payload: { path: string }): Promise<OpAnswer<'file_read'>> {
    const { path: relative, content, bytes } = await readFile(this.workspace, payload.path);
    await this.audit!.record('file_read', { path: relative, bytes });
    return { body: content, contentType: 'application/octet-stream' };
  }

  /**
   * API writes are audited here, not as the agent's own activity: the watcher is told to ignore
   * them. `content` is text, or base64 with `encoding: base64` (the api checked both, and `mode`).
   */
  async fileWrite(payload: FileWritePayload): Promise<OpAnswer<'file_write'>> {
    const { relative } = resolveWorkspacePath(this.workspace, payload.path);
    const content = payload.encoding === 'base64' ? Buffer.from(String(payload.content), 'base64') : payload.content;
    const mode = typeof payload.mode === 'number' ? payload.mode : undefined;
    const { bytes } = await this.unwatched({ paths: [relative] }, () => writeFile(this.workspace, payload.path, content, { mode }));
    await this.audit!.record('file_write', { path: relative, bytes });
    return { status: 201, body: { path: relative, bytes } };
  }

  async fileDelete(payload: { path: string }): Promise<OpAnswer<'file_delete'>> {
    const { relative } = resolveWorkspacePath(this.workspace, payload.path);
    const { bytes } = await this.unwatched({ paths: [relative] }, () => deleteFile(this.workspace, payload.path));
    await this.audit!.record('file_delete', { path: relative, bytes });
    return { body: { path: relative, deleted: true as const } };
  }

  /**
   * `{timeout_ms}` resets the timer to that long from now; `{extend_ms}` adds to what is left.
   * Checked against the maximum lifetime before anything changes; applied once the entity has it.
   */
  async changeTimeout(payload: TimeoutChange): Promise<OpAnswer<'timeout'>> {
    const previous = this.expiresAt;
    this.expiresAt = changedExpiry({ createdAt: this.createdAt, expiresAt: previous }, payload, this.kernel.config.sandboxMaxLifetime);
    try {
      await this.setState(this.state);
    } catch (err) {
      this.expiresAt = previous;
      throw err;
    }
    this.armTimer();
    void this.event('status', { step: 'timeout_changed', expires_at: new Date(this.expiresAt).toISOString() });
    return { body: this.view() };
  }

  private armTimer(): void {
    if (this.timer) clearTimeout(this.timer);
    // setTimeout overflows past 2^31 ms; re-arm in steps for long lifetimes.
    const wait = Math.min(Math.max(0, this.expiresAt - Date.now()), 2 ** 31 - 1);
    this.timer = setTimeout(() => {
      if (Date.now() >= this.expiresAt) void this.destroy('timeout').catch((err) => this.kernel.logger.error({ err, sandbox_id: this.id }, 'timeout teardown failed'));
      else this.armTimer();
    }, wait);
    this.timer.unref();
  }

  // --- teardown ---------------------------------------------------------------------------

  /**
   * Idempotent: exports, kills, removes the workspace; the stream ends with {state: destroyed}.
   * A step that fails does not stop the others, and the sandbox ends `stopped` whatever failed
   * (the failures are its `error` and a `warning` event), so its quota slot and token go with it.
   */
  destroy(reason: string, end: 'stopped' | 'error' = 'stopped'): Promise<void> {
    this.destroying ??= (async () => {
      if (this.timer) clearTimeout(this.timer);
      await this.closeTerminals(reason);
      const failures = await this.teardown(reason);
      const error = [...(reason === 'destroyed' ? [] : [reason]), ...failures].join('; ') || null;
      // A runner that cannot write this retries it on the next DELETE (service.ts).
      await this.setState(end, error);
      if (failures.length > 0) void this.event('warning', { message: `teardown: ${failures.join('; ')}` });
      await this.event('status', { state: 'destroyed', reason });
    })();
    return this.destroying;
  }

  /**
   * The sandbox ended on its own, not by destroy (its supervisor died: every process of it is
   * gone): torn down, and `error` with why, instead of `running` with every command failing.
   */
  private lost(): void {
    if (this.destroying) return;
    const reason = 'the sandbox ended on its own: its supervisor exited, and every process of the sandbox with it';
    void this.destroy(reason, 'error').catch((err) => this.kernel.logger.error({ err, sandbox_id: this.id }, 'teardown of a lost sandbox failed'));
  }

  /** Tries every step even when one before failed; returns what failed. */
  private async teardown(reason: string): Promise<string[]> {
    const failures: string[] = [];
    const step = async (what: string, run: () => Promise<unknown> | undefined) => {
      try {
        await run();
      } catch (err) {
        failures.push(`${what} failed: ${(err as Error).message}`);
        this.kernel.logger.warn({ err, sandbox_id: this.id, step: what }, 'sandbox teardown step failed');
      }
    };
    await step('ending the capture of the agent\'s activity', () => this.endCapture());
    await step('recording the last database writes', () => this.backing.flushWrites());
    await step('closing the network', () => this.network.close());
    await step('closing the audit log', () => this.audit?.close());
    if (this.state !== 'error' || this.spec.teardown.always_run) await step('exporting', () => this.runExports());
    await step('stopping the backing services', () => this.backing.stop());
    await step('destroying the sandbox', () => this.box?.destroy());
    await step('removing the workspace', async () => {
      // Never by path: should a process of the sandbox have survived, it may be swapping links.
      const left = removeBeneath(this.workspace);
      if (left > 0) throw new Error(`${left} entries could not be removed`);
    });
    this.onGone();
    this.kernel.logger.info({ sandbox_id: this.id, tenant: this.tenant, reason, failures }, 'sandbox torn down');
    return failures;
  }

  private async runExports(): Promise<void> {
    const root = this.kernel.config.artifactsDir ?? path.join(this.kernel.config.dataDir, 'artifacts');
    for (const exp of this.spec.teardown.export) {
      const to = exp.to.replace(/\{\{\s*run_id\s*\}\}/g, this.request.run_id ?? this.id).replace(/\{\{\s*scenario_id\s*\}\}/g, this.request.scenario_id ?? 'adhoc');
      const target = path.join(root, this.tenant, to);
      if (!target.startsWith(path.join(root, this.tenant) + path.sep)) continue;
      await mkdir(path.dirname(target), { recursive: true });
      if (exp.type === 'audit_log') await copyFileOut(this.workspace, `${SERVICE_DIR}/${AUDIT_FILE}`, target).catch(() => writeHostFile(target, ''));
      else if (exp.type === 'snapshot') await writeHostFile(target, JSON.stringify(await this.captureState()));
      else if (exp.type === 'db_dump') await writeHostFile(target, await (await this.backing.database(exp.service!)).dump());
      await this.event('export', { type: exp.type, to });
    }
    // What each mock in record mode saw, as routes a later spec replays.
    for (const service of this.spec.services) {
      const routes = service.type === 'http_mock' && service.record ? this.backing.mock(service.name)!.recording() : [];
      if (routes.length === 0) continue;
      const to = path.join('recordings', this.request.run_id ?? this.id, `${service.name}.yaml`);
      await mkdir(path.join(root, this.tenant, path.dirname(to)), { recursive: true });
      await writeHostFile(path.join(root, this.tenant, to), stringifyYaml({ routes }));
      await this.event('export', { type: 'recording', service: service.name, to });
    }
  }

  // --- events -----------------------------------------------------------------------------

  /** Replaces every secret value in text with [REDACTED:<NAME>]. */
  redact(text: string): string {
    return redactSecrets(text, this.secretValues);
  }

  /** A command's captured stream, redacted; one cut at the capture limit also loses a secret's beginning at its end. */
  private output(r: ExecResult, stream: 'stdout' | 'stderr'): string {
    return redactSecrets(r[stream], this.secretValues, { cut: r.truncated[stream] });
  }

  private async setState(state: State, error: string | null = null): Promise<void> {
    this.state = state;
    const value: SandboxChanged = {
      tenant: this.tenant,
      event_id: newEventId(),
      ts: Date.now(),
      sandbox_id: this.id,
      spec_id: this.request.spec_id,
      spec_version: this.request.spec_version,
      state,
      path: this.workspace,
      created_at: this.createdAt,
      expires_at: this.expiresAt,
      metadata: this.request.metadata,
      services: JSON.stringify(this.backing.view()),
      network: JSON.stringify(this.network.view()),
      runner_id: this.runnerId,
      token_hash: this.tokenHash,
      error,
      // Sealed so the api can redact them from the traces this sandbox ingests.
      secrets_sealed: Object.keys(this.secretValues).length > 0 ? this.sealer.seal(JSON.stringify(this.secretValues), `sandbox/${this.id}`) : null,
    };
    await publish(this.kernel, TOPICS.sandboxes, [{ key: this.id, tenant: this.tenant, value }]);
  }

  /**
   * Appends one event of the sandbox's stream. Events keep their order (seq); the ones queued
   * while an append runs go together in the next one, so the boot's steps need not wait for
   * each other's fsync. Resolves once this event is on the log.
   */
  private event(eventType: string, data: object): Promise<void> {
    this.queuedEvents.push({ tenant: this.tenant, event_id: newEventId(), ts: Date.now(), sandbox_id: this.id, seq: ++this.seq, event_type: eventType, data: this.redact(JSON.stringify(data)) });
    const next = this.eventChain.then(async () => {
      const batch = this.queuedEvents.splice(0);
      if (batch.length > 0) await publish(this.kernel, TOPICS.sandboxEvents, batch.map((value) => ({ key: this.id, tenant: this.tenant, value })));
    });
    // A failed append is logged once here; callers (many do not await) never see a rejection.
    this.eventChain = next.catch((err) => this.kernel.logger.error({ err, sandbox_id: this.id }, 'sandbox events lost'));
    return this.eventChain.then(() => undefined);
  }

  /** Resolves once every audit record written so far is on the log (svc.audit). */
  auditPublished(): Promise<void> {
    return this.auditChain;
  }

  /** Appends the audit records written since the last append, in one batch (a burst is one append, not one per record). */
  private async publishAudit(): Promise<void> {
    const batch = this.queuedAudit.splice(0);
    if (batch.length === 0) return;
    const values = batch.map((record): AuditRecorded => ({ tenant: this.tenant, event_id: newEventId(), ts: Date.now(), sandbox_id: this.id, record_ts: Date.parse(record.ts), type: record.type, details: JSON.stringify(record.details) }));
    await publish(this.kernel, TOPICS.audit, values.map((value) => ({ key: this.id, tenant: this.tenant, value })));
    await Promise.all(batch.map((record) => this.event('audit', record)));
  }
}

/**
 * The host and port a sandbox's bridge forwards to, and the base URL it gives the sandbox (the
 * base URL's path kept): only for a plain-HTTP base URL (TLS names would not match 127.0.0.1).
 */
function serviceAddress(baseUrl: string): { address: { host: string; port: number }; urlInside: string } | null {
  const url = new URL(baseUrl);
  if (url.protocol !== 'http:') return null;
  return { address: { host: url.hostname.replace(/^\[|\]$/g, ''), port: Number(url.port || 80) }, urlInside: `${SERVICE_URL_IN_SANDBOX}${url.pathname.replace(/\/+$/, '')}` };
}

/** An image config's `Env` (`NAME=value` strings) as variables; malformed entries and HOME (the sandbox's own) are left out. */
function imageEnv(entries: string[]): Record<string, string> {
  return Object.fromEntries(entries.flatMap((entry) => {
    const at = entry.indexOf('=');
    return at > 0 && entry.slice(0, at) !== 'HOME' ? [[entry.slice(0, at), entry.slice(at + 1)]] : [];
  }));
}
