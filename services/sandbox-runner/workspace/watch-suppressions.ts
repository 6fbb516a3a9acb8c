/**
 * The service's own file operations kept out of the agent's audit while the watch runs
 * (FsWatcher.suppress and suppressDuring, whose header says when to use which), and the barriers
 * that end a suppression exactly: a file created in `.svc/watch/` (the agent cannot write there)
 * whose CREATE, coming through the one inotify queue, follows every event queued before it.
 */
import { lstat, mkdir, unlink, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { SERVICE_DIR, workspaceSegments } from './paths.ts';
import type { OpKind } from './watch-spec.ts';

/** Under `.svc/`: where the watcher creates its barrier files (the agent cannot write there). */
const BARRIER_DIR = 'watch';

interface Suppression {
  paths?: Set<string>;
  kinds?: Set<OpKind>;
  until: number;
}

/** What the barriers need to know of the watch (FsWatcher). */
export interface WatchState {
  /** inotifywait has established its watches */
  started(): boolean;
  /** started, and inotifywait has neither exited nor been killed */
  alive(): boolean;
  /** alive, and the watch is not stopping */
  running(): boolean;
}

export class Suppressions {
  private active: Suppression[] = [];
  private readonly barriers = new Map<string, () => void>();
  private barrierSeq = 0;
  /** `.svc/watch/` once made (makeDir); without it barriers fall back to timers */
  private barrierDir: string | undefined;

  constructor(
    private readonly watch: WatchState,
    /** fallback length of a suppression when no barrier can be used, and default of `add` */
    readonly graceMs: number,
    /** longest wait for a barrier before going on without it */
    private readonly barrierTimeoutMs: number,
  ) {}

  /** Makes `.svc/watch/` in the workspace `root` (makeBarrierDir); undefined when it cannot be. */
  async makeDir(root: string): Promise<string | undefined> {
    this.barrierDir = await makeBarrierDir(root);
    return this.barrierDir;
  }

  /** The barrier a host path names (a file in `.svc/watch/`), or null when it is no barrier's. */
  barrierOf(hostPath: string): string | null {
    return this.barrierDir && hostPath.startsWith(`${this.barrierDir}/`) ? hostPath.slice(this.barrierDir.length + 1) : null;
  }

  /** The CREATE of the barrier file `name` came through: every event before it has been handled. */
  arrived(name: string): void {
    this.barriers.get(name)?.();
  }

  /** Drops matching events for `ms` from now (paths as the caller names them, or workspace-relative). */
  add(paths: string | string[], ms = this.graceMs, kinds?: OpKind[]): void {
    const list = typeof paths === 'string' ? [paths] : paths;
    this.active.push({ paths: new Set(list.map(normalize)), kinds: kinds && new Set(kinds), until: Date.now() + ms });
  }

  /** Drops matching events while `fn` runs and for the grace period after. No scope fields: everything. */
  async during<T>(scope: { paths?: string[]; kinds?: OpKind[] }, fn: () => Promise<T>): Promise<T> {
    // What the agent did before now is still queued: it is handled before the suppression begins.
    if (this.watch.running()) await new Promise<void>((resolve) => void this.barrier(resolve));
    const s: Suppression = {
      paths: scope.paths && new Set(scope.paths.map(normalize)),
      kinds: scope.kinds && new Set(scope.kinds),
      until: Infinity,
    };
    this.active.push(s);
    try {
      return await fn();
    } finally {
      // Ends when the events `fn` caused have all arrived: a barrier file created now comes after them.
      // Awaiting its creation means whatever the agent does after this returns is not suppressed.
      // Ended outright, not at a time: events after the barrier's may arrive in the same millisecond.
      await this.barrier(() => {
        s.until = -Infinity;
      });
    }
  }

  /** Whether an event of `kind` on the file named `rel` is dropped now. */
  covers(rel: string, kind: OpKind): boolean {
    if (this.active.length === 0) return false;
    const now = Date.now();
    this.active = this.active.filter((s) => s.until >= now);
    return this.active.some((s) => (!s.kinds || s.kinds.has(kind)) && (!s.paths || s.paths.has(rel)));
  }

  /**
   * Calls `done` once every event queued before now has been handled: creates a file in
   * `.svc/watch/` and waits for its CREATE (one inotify queue, so it comes after everything earlier).
   * Without a running watcher, or after `barrierTimeoutMs`, falls back to a timer. Resolves once the
   * barrier file exists.
   */
  async barrier(done: () => void): Promise<void> {
    if (!this.watch.alive() || !this.barrierDir) {
      setTimeout(done, this.watch.started() ? this.graceMs : 0).unref();
      return;
    }
    const name = `b-${process.pid}-${++this.barrierSeq}`;
    const file = path.join(this.barrierDir, name);
    const finish = () => {
      if (!this.barriers.delete(name)) return;
      clearTimeout(fallback);
      done();
    };
    const fallback = setTimeout(finish, this.barrierTimeoutMs);
    fallback.unref();
    this.barriers.set(name, finish);
    try {
      await writeFile(file, '');
      await unlink(file);
    } catch {
      // The fallback timer ends it.
    }
  }
}

function normalize(p: string): string {
  try {
    return workspaceSegments(p).join('/');
  } catch {
    return p;
  }
}

/** `.svc/watch/`, created if needed; undefined when `.svc` is not a plain directory (barriers then fall back to timers). */
async function makeBarrierDir(root: string): Promise<string | undefined> {
  const svc = path.join(root, SERVICE_DIR);
  try {
    await mkdir(svc, { mode: 0o755 }).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== 'EEXIST') throw err;
    });
    if (!(await lstat(svc)).isDirectory()) return undefined;
    const dir = path.join(svc, BARRIER_DIR);
    await mkdir(dir, { mode: 0o755 }).catch((err: NodeJS.ErrnoException) => {
      if (err.code !== 'EEXIST') throw err;
    });
    return (await lstat(dir)).isDirectory() ? dir : undefined;
  } catch {
    return undefined;
  }
}
