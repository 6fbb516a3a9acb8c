/**
 * The capture of the agent's activity, beside the audit log (audit-trail.ts): the file watch
 * (workspace/fs-watcher.ts) and the kernel's report of the sandbox's processes
 * (runtimes/local/process-tracer.ts), started at boot step audit_started; the workspace's state
 * at ready (boot step snapshot_taken), which diffs compare against; and the end of the capture,
 * once, with what the watch missed reconciled. The service's own reads of the workspace go
 * through `unwatched`, so the watch does not take them for the agent's.
 */
import type { Config } from '../../kernel/config.ts';
import { processTracer, type ProcessRun } from '../runtimes/local/process-tracer.ts';
import { FsWatcher } from '../workspace/fs-watcher.ts';
import { captureLayer } from '../workspace/layer-state.ts';
import { childName } from '../workspace/places.ts';
import { captureState, ChecksumCache, diffStates, type Diff, type FilesystemState } from '../workspace/state.ts';
import type { SpecDocument } from '../../domain/spec.ts';
import type { AuditTrail } from './audit-trail.ts';
import type { SandboxBox } from './sandbox-box.ts';

/** A moment for the exits of a kill to come through the tracer's pipe before the watch ends. */
const PROCESS_EVENTS_DRAIN_MS = 100;

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

export class ActivityCapture {
  private watcher: FsWatcher | null = null;
  /** Ends the kernel's report of the sandbox's processes (audit.process_spawns). */
  private endProcessWatch: (() => void) | null = null;
  private captureEnded: Promise<Diff | null> | null = null;
  /** The workspace's diff as the agent left it, once taken (grader files come after it). */
  private finalDiff: Promise<Diff> | null = null;
  private before: FilesystemState | null = null;
  /** The other writable places (/tmp, /dev/shm) at ready, for the reconciliation; null unless the file watch runs. */
  private beforeElsewhere: FilesystemState | null = null;
  /** Checksums kept between captures, so a state or diff re-hashes only what changed. */
  private readonly checksums = new ChecksumCache();

  constructor(
    private readonly config: Config,
    private readonly box: SandboxBox,
    private readonly trail: AuditTrail,
  ) {}

  /** Whether the kernel reports the sandbox's processes now. */
  get watchingProcesses(): boolean {
    return this.endProcessWatch !== null;
  }

  /** Starts the file watch, when the spec asks for one, then the process capture, when it asks for that. */
  async start(audit: SpecDocument['audit']): Promise<void> {
    const { watch, track } = audit.file_system;
    if (watch.length > 0) {
      this.watcher = new FsWatcher({ workspace: this.box.workspace, places: this.box.handle.writablePlaces, watch, track, audit: this.trail.log! });
      await this.watcher.start();
    }
    if (audit.process_spawns) await this.watchProcesses();
  }

  /**
   * audit.process_spawns: every program a command starts, at any depth, as the kernel saw it
   * (runtimes/local/process-tracer.ts). Where that capture cannot run, a warning says so.
   */
  private async watchProcesses(): Promise<void> {
    const tracer = processTracer(this.config.processTracer);
    const where = this.box.handle.processes();
    if (typeof tracer === 'string' || where === null) {
      return this.trail.warn(
        `process capture is off: ${typeof tracer === 'string' ? tracer : "the runtime cannot name the sandbox's processes"}; only the commands themselves are recorded`,
      );
    }
    try {
      this.endProcessWatch = await tracer.watch({
        ...where,
        onRun: (run) => void this.trail.log!.record('process_spawn', processSpawnDetails(run), { ts: run.started_at }).catch(() => undefined),
        onLost: (lost) => void this.trail.warn(`the kernel dropped ${lost} process events: the process record is incomplete`),
        onStopped: (reason) => {
          this.endProcessWatch = null;
          void this.trail.warn(`process capture stopped (${reason}); later processes are not recorded`);
        },
      });
    } catch (err) {
      await this.trail.warn(`process capture is off: ${(err as Error).message}; only the commands themselves are recorded`);
    }
  }

  /** Ends the process capture; the kernel's last events (the kill's exits) reach the tracer a moment later. */
  private async stopWatchingProcesses(): Promise<void> {
    if (!this.endProcessWatch) return;
    await new Promise((r) => setTimeout(r, PROCESS_EVENTS_DRAIN_MS));
    this.endProcessWatch();
    this.endProcessWatch = null;
  }

  /** The before-run snapshot, which diffs compare against; returns how many files it holds. */
  async takeSnapshot(): Promise<number> {
    this.before = await this.captureState();
    if (this.watcher) this.beforeElsewhere = await this.captureElsewhere();
    return Object.keys(this.before.files).length;
  }

  /** The workspace now, against ready: how many files it holds, and what changed (a `per_action` checkpoint). */
  async checkpoint(): Promise<{ files: number; diff: Diff }> {
    const state = await this.captureState();
    return { files: Object.keys(state.files).length, diff: diffStates(this.before!, state) };
  }

  /** The workspace's diff since ready as the agent left it: the reconciliation's, when it made one (one capture, not two). */
  agentDiff(): Promise<Diff> {
    this.finalDiff ??= (async () => (await this.end()) ?? diffStates(this.before!, await this.captureState()))();
    return this.finalDiff;
  }

  /** Whether the agent's diff has been asked for (grader files are written only after it). */
  get agentDiffTaken(): Promise<Diff> | null {
    return this.finalDiff;
  }

  /**
   * Ends the capture of the agent's activity (once): the process capture, then the file watch,
   * then the reconciliation of what the watch saw with what changed since ready, whose diff it
   * returns (null when there was no watch to reconcile).
   */
  end(): Promise<Diff | null> {
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
    const audit = this.trail.log!;
    const changes: Array<['file_write' | 'file_delete', 'writes' | 'deletes', string[]]> = [
      ['file_write', 'writes', [...diff.added, ...diff.modified]],
      ['file_delete', 'deletes', diff.removed],
    ];
    // One at a time: a workspace of a million new files is a million records, most of them dropped by the log's limits.
    for (const [type, kind, paths] of changes) {
      for (const rel of paths)
        if (watcher.reports(kind, rel) && !audit.hasFileRecord(type, rel)) await audit.record(type, { path: rel, found_by: 'reconciliation' });
    }
  }

  /** The workspace's state; the service's own reads of it are not the agent's (the watcher ignores them). */
  captureState(): Promise<FilesystemState> {
    return this.unwatched({ kinds: ['read'] }, () =>
      captureState(this.box.workspace, { checksumMaxBytes: this.config.stateChecksumMaxBytes, cache: this.checksums }),
    );
  }

  /** The files of the sandbox's other writable places (/tmp, /dev/shm, a writable root's layer), named as the audit names them (`/tmp/x`, `/etc/x`). */
  private async captureElsewhere(): Promise<FilesystemState> {
    const files: FilesystemState['files'] = {};
    const box = this.box.handle;
    const merged = box.processes();
    for (const place of box.writablePlaces) {
      // Every directory: the names the workspace's diff skips (node_modules, .git) hide no write here.
      const options = { checksumMaxBytes: this.config.stateChecksumMaxBytes, everyDirectory: true };
      // A writable root over an image: its overlay's upper directory, read with the image below it.
      const layer = place.lower ? { upper: place.host, lower: place.lower, merged: merged && `/proc/${merged.supervisorPid}/root` } : null;
      const state = await this.unwatched({ kinds: ['read'] }, () => (layer ? captureLayer(layer, options) : captureState(place.host, options)));
      for (const [rel, entry] of Object.entries(state.files)) files[childName(place.at, rel)] = entry;
    }
    return { captured_at: new Date().toISOString(), files };
  }

  /** Runs the service's own file work with the file watch (when there is one) ignoring what `scope` names of it. */
  unwatched<T>(scope: Parameters<FsWatcher['suppressDuring']>[0], run: () => Promise<T>): Promise<T> {
    return this.watcher ? this.watcher.suppressDuring(scope, run) : run();
  }
}
