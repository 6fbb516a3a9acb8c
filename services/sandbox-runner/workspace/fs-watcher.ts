/**
 * The agent's own file activity (`audit.file_system`): `watch` paths and `track: [writes, reads,
 * deletes]`, turned into audit records `file_write {path, bytes?}`, `file_read {path}` and
 * `file_delete {path}`, wherever the agent can write: the workspace (paths workspace-relative) and
 * the runtime's other writable places, /tmp, /dev/shm and a writable root's `/` (paths absolute:
 * `/tmp/x`, `/etc/x`; places.ts).
 *
 * How: one `inotifywait -m -r` child per sandbox, watching the host directories that are bound into
 * the sandbox (the workspace, the tmpfs of /tmp and /dev/shm) or take its writes to / (the
 * directory of a writable root, or its overlay's upper directory over an image). Node's fs.watch
 * is not used: it reports neither reads nor which operation happened. In an overlay's upper
 * directory a whiteout made or moved in is a delete, and a directory moved in (copied up, or made
 * opaque, through overlayfs' work directory) is scanned like a new one, not a write of its own.
 * The agent may swap a directory for a symlink to anywhere on the host at any moment, so nothing
 * here follows one: inotifywait (which does, when it adds the watch of a new directory) runs under
 * bubblewrap in a mount namespace holding only those directories (confined-inotifywait.ts), and the watcher's
 * own looks (new-directory scans, sizes) go through beneath.ts, by descriptor. No record ever
 * names a host file or another sandbox's.
 * inotify sees every process that touches the files, whoever it is, so:
 *  - start the watcher after setup and fixtures (the boot pipeline does: "apply setup ... start audit
 *    capture"), so those writes are never the agent's;
 *  - wrap the service's own operations while the agent runs (files API, state captures, exports) in
 *    `suppressDuring({paths?, kinds?}, fn)`: matching events are dropped from the call until every
 *    event `fn` caused has arrived. The end is exact: after `fn` the watcher creates a barrier file
 *    in `.svc/watch/` (the agent cannot write there) and the suppression ends when its CREATE comes
 *    through (one inotify queue, so it follows everything `fn` did); whatever the agent does after
 *    `suppressDuring` returns is recorded. Agent operations on the same paths *during* `fn` are
 *    dropped too, so scope it: `{paths: [path]}` for a files-API call, `{kinds: ['read']}` around
 *    `captureState` (it reads every file it hashes). `suppress(paths, ms)` is the plain timed form.
 *    The files API audits its own operations.
 *  - `.svc/` is never watched or reported (the service writes the audit log there), apart from the
 *    barrier directory `.svc/watch/`.
 *
 * Paths in `watch` are workspace-relative unless absolute; `/` means every writable place, `/workspace`
 * and `.` the whole workspace, `/tmp/x` a path in /tmp; an absolute path where the agent cannot write
 * is a 400 naming `audit.file_system.watch[i]`. A path that does not exist yet is watched through its
 * nearest existing ancestor and events are filtered to it.
 *
 * Which inotify events make which record:
 *  - writes: a file created or modified (CREATE/MODIFY), recorded once when the writer closes it
 *    (CLOSE_WRITE) — an open for writing that changes nothing is not a write; a file renamed into
 *    place (MOVED_TO; `{directory: true}` for a directory); a symlink or hard link created (no close
 *    follows those: the next flush, within `coalesceMs`, looks at the files created and not yet
 *    closed, one directory walk per directory); a file's attributes changed (ATTRIB: chmod, chown,
 *    its times). A file still open for writing when the watcher stops is recorded at `stop()`. A
 *    new directory too deep to watch (its path over PATH_MAX) is a write of it (`{directory: true}`).
 *  - deletes: DELETE of a file, MOVED_FROM (a rename is a delete of the old name plus a write of the
 *    new one). Removing a directory records its files, not the directory.
 *  - reads: CLOSE_NOWRITE of a file, i.e. one read per open-for-reading (IN_ACCESS would fire per
 *    read() call, not for mmap or empty files). Opening a file read-write and only reading it is not
 *    seen as a read.
 *  Bursts are coalesced: repeated records of the same type for the same path within `coalesceMs`
 *  (100 ms) are one record (per-path order is kept: write, delete, write stays three records); at
 *  most MAX_PENDING wait for that window, more flush at once (a flood of events never queues up
 *  here, and the audit log's limits drop what is too much).
 *  Directories created faster than inotifywait can add a watch (`mkdir -p a/b && echo x > a/b/f`) are
 *  scanned when their CREATE arrives, so files written in them are not missed (they may, rarely, be
 *  recorded twice). An overflowing inotify queue, watch errors and an unexpected exit of the child
 *  are recorded as `warning` records. Where the host's inotify limits (watches, instances) are reached
 *  at the start, a `warning` says so and the watch is left to the end-of-run reconciliation.
 *
 * Here: the child's life and its events turned into records. Beside it: watch-spec.ts (what
 * `track` and `watch` ask for), confined-inotifywait.ts, watch-suppressions.ts (suppressions and
 * their barriers), new-dir-scan.ts (a new directory's scan).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import type { Stats } from 'node:fs';
import path from 'node:path';
import type { AuditType } from './audit-log.ts';
import { lstatBeneath, lstatManyBeneath } from './beneath.ts';
import { confined } from './confined-inotifywait.ts';
import { isServicePath, SERVICE_DIR } from './paths.ts';
import { underPrefix, WritablePlaces, type Place } from './places.ts';
import { parseTrack, resolveWatchPrefixes, watchRoots, type OpKind, type TrackKind } from './watch-spec.ts';
import { Suppressions } from './watch-suppressions.ts';
import { scanNewDir } from './new-dir-scan.ts';

export type { OpKind, TrackKind } from './watch-spec.ts';

/**
 * inotifywait's complaints about a directory the agent (or overlayfs, moving directories through
 * its work directory) removed or swapped as it watched: gone before its watch was added (its scan
 * covers it), or moved out before its watch was removed. Not lost events, and they name host paths.
 */
const GONE_BEFORE_WATCHED =
  /^((Stat failed on|Couldn't watch new directory) .*: (No such file or directory|Not a directory)|(Failed to remove|Error removing) watch on .*)$/;
/** Records waiting to be coalesced, at most. */
const MAX_PENDING = 1000;

export interface AuditSink {
  record(type: AuditType, details: Record<string, unknown>, options?: { ts?: Date }): Promise<unknown>;
}

export interface FsWatcherOptions {
  workspace: string;
  /** The sandbox's other writable places (/tmp, /dev/shm) as host directories; their files are named `/tmp/x`. */
  places?: readonly Place[];
  /** `audit.file_system.watch`. */
  watch: unknown;
  /** `audit.file_system.track`. */
  track: unknown;
  /** Where records go: an AuditLog (or anything with its `record`), or `onEvent`; one is needed. */
  audit?: AuditSink;
  onEvent?: (type: AuditType, details: Record<string, unknown>, ts: Date) => unknown;
  /** Same-type records for one path within this window are one record (default 100 ms). */
  coalesceMs?: number;
  /** Fallback length of a suppression when no barrier can be used, and default of `suppress` (500 ms). */
  suppressGraceMs?: number;
  startTimeoutMs?: number;
  /** Longest wait for a barrier (end of a suppression, `stop()`) before going on without it (default 2000 ms). */
  barrierTimeoutMs?: number;
  /** The inotifywait binary (default `inotifywait` on PATH). */
  command?: string;
  /** Field prefix in error messages (default `audit.file_system`). */
  field?: string;
}

interface Pending {
  type: AuditType;
  rel: string;
  details: Record<string, unknown>;
  ts: Date;
}

export class FsWatcher {
  private readonly opts: FsWatcherOptions;
  private readonly coalesceMs: number;
  private view!: WritablePlaces;
  private prefixes: string[] = [];
  private track = new Set<TrackKind>();
  private child: ChildProcess | undefined;
  private closed: Promise<void> | undefined;
  private stopping = false;
  private started = false;
  private stdoutRest = '';
  private readonly dirty = new Set<string>();
  /** Files created since the last flush and not closed yet: a symlink or hard link among them gets no close. */
  private readonly created = new Set<string>();
  private pending: Pending[] = [];
  private lastByPath = new Map<string, Pending>();
  private timer: NodeJS.Timeout | undefined;
  private readonly inflight = new Set<Promise<unknown>>();
  private readonly scans = new Set<Promise<void>>();
  private readonly suppressions: Suppressions;
  /** The last event was a file's MOVED_FROM: a MOVED_TO now is the other half of a rename (inotify queues the two together). */
  private afterFileMovedFrom = false;
  /** Records handed to the audit sink. */
  recorded = 0;

  constructor(options: FsWatcherOptions) {
    this.opts = options;
    this.coalesceMs = options.coalesceMs ?? 100;
    const alive = () => this.started && this.child !== undefined && this.child.exitCode === null && this.child.signalCode === null;
    this.suppressions = new Suppressions(
      { started: () => this.started, alive, running: () => this.running },
      options.suppressGraceMs ?? 500,
      options.barrierTimeoutMs ?? 2000,
    );
  }

  get running(): boolean {
    return this.started && !this.stopping && this.child?.exitCode === null;
  }

  /** Resolves once inotifywait reports its watches established. Rejects on bad config or a failed start. */
  async start(): Promise<void> {
    if (this.child) throw new Error('watcher already started');
    if (!this.opts.audit && !this.opts.onEvent) throw new Error('FsWatcher needs `audit` or `onEvent`');
    const field = this.opts.field ?? 'audit.file_system';
    this.track = parseTrack(this.opts.track, `${field}.track`);
    this.view = await WritablePlaces.of(this.opts.workspace, this.opts.places);
    const root = this.view.workspace;
    this.prefixes = resolveWatchPrefixes(this.view, this.opts.watch, `${field}.watch`);
    if (this.prefixes.length === 0 || this.track.size === 0) return; // nothing to watch
    const roots = await watchRoots(this.view, this.prefixes);
    const barrierDir = await this.suppressions.makeDir(root);
    const events = ['create', 'moved_to', 'moved_from'];
    if (this.track.has('writes')) events.push('modify', 'close_write', 'attrib');
    if (this.track.has('deletes')) events.push('delete');
    if (this.track.has('reads')) events.push('close_nowrite');
    const args = ['-m', '-r', '--format', '%e%0%w%f%0', '--no-newline'];
    for (const e of events) args.push('-e', e);
    // `.svc` is not watched (the audit log is written there), except the barrier directory.
    args.push('--', ...roots, `@${path.join(root, SERVICE_DIR)}`);
    if (barrierDir) args.push(barrierDir);
    const [command, argv] = await confined(this.opts.command ?? 'inotifywait', this.view.roots, args).catch((err: Error) => {
      throw new Error(`cannot run inotifywait (install inotify-tools): ${err.message}`);
    });
    const child = spawn(command, argv, { stdio: ['ignore', 'pipe', 'pipe'] });
    this.child = child;
    child.stdout!.setEncoding('utf8');
    child.stdout!.on('data', (chunk: string) => this.onStdout(chunk));
    this.closed = new Promise((resolve) => child.on('close', () => resolve()));

    await new Promise<void>((resolve, reject) => {
      const errors: string[] = [];
      let stderrRest = '';
      const timeout = setTimeout(() => {
        fail(new Error(`inotifywait did not establish its watches within ${this.opts.startTimeoutMs ?? 30_000} ms`));
        child.kill('SIGKILL');
      }, this.opts.startTimeoutMs ?? 30_000);
      const fail = (err: Error) => {
        clearTimeout(timeout);
        reject(err);
      };
      child.on('error', (err) => {
        const hint = (err as NodeJS.ErrnoException).code === 'ENOENT' ? ' (install bubblewrap)' : '';
        fail(new Error(`cannot run inotifywait under bwrap${hint}: ${err.message}`));
      });
      child.stderr!.setEncoding('utf8');
      child.stderr!.on('data', (chunk: string) => {
        const lines = (stderrRest + chunk).split('\n');
        stderrRest = lines.pop()!;
        for (const line of lines.map((l) => l.trim()).filter(Boolean)) {
          if (line.startsWith('Setting up watches')) continue;
          if (line === 'Watches established.') {
            clearTimeout(timeout);
            this.started = true;
            resolve();
          } else if (this.started) {
            // A new directory gone or swapped for a file before its watch was added is the agent's race, not a lost watch (its scan covers it).
            if (!line.startsWith('Beware') && !GONE_BEFORE_WATCHED.test(line) && !this.tooDeep(line)) this.warn(`file watcher: ${line}`);
          } else {
            errors.push(line);
          }
        }
      });
      child.on('exit', (code, signal) => {
        const limit = errors.find((e) => /upper limit on inotify|Too many open files|Failed to watch/i.test(e));
        if (!this.started && limit) {
          // The host's inotify limits are reached: the run goes on, watched by the reconciliation alone.
          clearTimeout(timeout);
          this.warn(
            `the file watch could not start (${limit}): the agent's file changes are found only when it ends, by the reconciliation (no reads, one record per changed file)`,
          );
          resolve();
        } else if (!this.started) fail(new Error(`inotifywait exited (${signal ?? code}) before watching: ${errors.join('; ') || 'no message'}`));
        else if (!this.stopping) this.warn(`file watcher stopped unexpectedly (${signal ?? `exit code ${code}`}); later file activity is not audited`);
      });
    });
  }

  /** Lets queued events arrive, ends the child, records what is pending. Idempotent. */
  async stop(): Promise<void> {
    if (this.stopping) {
      await this.closed;
      await this.settle();
      return;
    }
    this.stopping = true;
    const child = this.child;
    if (child && child.exitCode === null && child.signalCode === null) {
      // Everything the (already stopped) agent did is queued before the barrier.
      await new Promise<void>((resolve) => void this.suppressions.barrier(resolve));
      child.kill('SIGTERM');
    }
    await this.closed;
    if (this.stdoutRest) this.onStdout('');
    await this.settle();
    // Files still open for writing (their CLOSE_WRITE never came).
    for (const rel of [...this.dirty].sort()) this.enqueue('file_write', rel, { path: rel });
    this.dirty.clear();
    this.flush();
    await Promise.allSettled([...this.inflight]);
  }

  /** Drops matching events for `ms` from now (paths as the caller names them, or workspace-relative). */
  suppress(paths: string | string[], ms = this.suppressions.graceMs, kinds?: OpKind[]): void {
    this.suppressions.add(paths, ms, kinds);
  }

  /** Drops matching events while `fn` runs and for the grace period after. No scope fields: everything. */
  suppressDuring<T>(scope: { paths?: string[]; kinds?: OpKind[] }, fn: () => Promise<T>): Promise<T> {
    return this.suppressions.during(scope, fn);
  }

  // --- events ---------------------------------------------------------------------------------

  private onStdout(chunk: string): void {
    const parts = (this.stdoutRest + chunk).split('\0');
    // Records are "<events>\0<path>\0"; the last part is incomplete (or '' after a final NUL).
    const tail = parts.pop()!;
    let i = 0;
    for (; i + 1 < parts.length; i += 2) this.onEvent(parts[i]!.split(','), parts[i + 1]!);
    this.stdoutRest = (i < parts.length ? `${parts[i]}\0` : '') + tail;
  }

  private onEvent(flags: string[], abs: string): void {
    const renamed = this.afterFileMovedFrom && flags.includes('MOVED_TO');
    this.afterFileMovedFrom = flags.includes('MOVED_FROM') && !flags.includes('ISDIR');
    if (flags.includes('Q_OVERFLOW')) {
      this.warn('file events were lost: the inotify queue overflowed');
      return;
    }
    const clean = abs.endsWith('/') ? abs.slice(0, -1) : abs;
    const barrier = this.suppressions.barrierOf(clean);
    if (barrier !== null) {
      if (flags.includes('CREATE')) this.suppressions.arrived(barrier);
      return;
    }
    const rel = this.view.nameOf(clean);
    if (rel === null) {
      if ((flags.includes('DELETE_SELF') || flags.includes('UNMOUNT')) && !this.stopping) this.warn(`file watcher: watched directory ${clean} went away`);
      return;
    }
    if (isServicePath(rel) || !this.inScope(rel)) return;
    const isDir = flags.includes('ISDIR');
    const writes = this.track.has('writes');
    const deletes = this.track.has('deletes');
    if (!isDir && !renamed && flags.includes('MOVED_TO') && this.whiteout(rel)) {
      // overlayfs deleting a name of the image: a whiteout moved in from its work directory (no MOVED_FROM
      // here; it never makes one in place, so a CREATE is the agent's). A rename's MOVED_TO is a write even
      // when a whiteout is there by now.
      this.dirty.delete(rel);
      this.created.delete(rel);
      if (deletes && !this.suppressed(rel, 'delete')) this.enqueue('file_delete', rel, { path: rel });
      return;
    }
    for (const flag of flags) {
      switch (flag) {
        case 'CREATE':
          if (!writes || this.suppressed(rel, 'write')) break;
          if (isDir) {
            this.scanNewDir(rel);
          } else {
            this.dirty.add(rel);
            // No CLOSE_WRITE follows a symlink or a hard link: the next flush looks at what was created and not closed.
            this.created.add(rel);
            this.armFlush();
          }
          break;
        case 'MODIFY':
          if (writes && !isDir && !this.suppressed(rel, 'write')) this.dirty.add(rel);
          break;
        case 'ATTRIB':
          // chmod, chown, times: the file's metadata written (no close follows them).
          if (writes && !isDir && !this.suppressed(rel, 'write')) this.enqueue('file_write', rel, { path: rel });
          break;
        case 'CLOSE_WRITE':
          this.created.delete(rel);
          if (writes && !isDir && this.dirty.delete(rel) && !this.suppressed(rel, 'write')) this.enqueue('file_write', rel, { path: rel });
          break;
        case 'MOVED_TO':
          if (!writes || this.suppressed(rel, 'write')) break;
          // In an overlay a directory comes in through its work directory (copied up, made opaque): its files are what was written.
          if (isDir && this.view.placeOf(rel)?.lower) this.scanNewDir(rel);
          else this.enqueue('file_write', rel, isDir ? { path: rel, directory: true } : { path: rel });
          break;
        case 'MOVED_FROM':
          this.dirty.delete(rel);
          this.created.delete(rel);
          if (deletes && !this.suppressed(rel, 'delete')) this.enqueue('file_delete', rel, isDir ? { path: rel, directory: true } : { path: rel });
          break;
        case 'DELETE':
          if (isDir) break;
          this.dirty.delete(rel);
          this.created.delete(rel);
          if (deletes && !this.suppressed(rel, 'delete')) this.enqueue('file_delete', rel, { path: rel });
          break;
        case 'CLOSE_NOWRITE':
          if (this.track.has('reads') && !isDir && !this.suppressed(rel, 'read')) this.enqueue('file_read', rel, { path: rel });
          break;
        default:
          break;
      }
    }
  }

  /**
   * Whether `line` says a new directory could not be watched, its tree being deeper than a path
   * can name (PATH_MAX): then nothing written in it is seen, nor reconciled (state.ts lists paths
   * up to 4096 bytes), so the directory itself is recorded as written, not a warning naming a host path.
   */
  private tooDeep(line: string): boolean {
    const hostPath = /^Couldn't watch new directory (.+): File name too long$/.exec(line)?.[1];
    const rel = hostPath === undefined ? null : this.view.nameOf(hostPath.replace(/\/+$/, ''));
    if (rel === null) return false;
    if (this.track.has('writes') && !isServicePath(rel) && this.inScope(rel) && !this.suppressed(rel, 'write'))
      this.enqueue('file_write', rel, { path: rel, directory: true });
    return true;
  }

  /**
   * Whether `rel` is now a whiteout (a character device 0/0) in an overlay's upper directory, or
   * is gone under one: `rm -r` whites out a file, then its directory, and the directory's whiteout
   * may be all that is left by the time the watch looks.
   */
  private whiteout(rel: string): boolean {
    if (!this.view.placeOf(rel)?.lower) return false;
    const { root, rel: inside } = this.view.locate(rel);
    const isWhiteout = (at: string) => {
      const st = lstatBeneath(root, at);
      return st === undefined ? undefined : st.isCharacterDevice() && st.rdev === 0;
    };
    const parts = inside.split('/');
    for (let depth = parts.length; depth > 0; depth--) {
      const found = isWhiteout(parts.slice(0, depth).join('/'));
      if (found !== undefined) return found;
    }
    return false;
  }

  /** Whether the watch reports `kind` for the file named `rel` (places.ts). */
  reports(kind: TrackKind, rel: string): boolean {
    return this.track.has(kind) && this.inScope(rel);
  }

  private inScope(rel: string): boolean {
    return this.prefixes.some((p) => underPrefix(rel, p));
  }

  private suppressed(rel: string, kind: OpKind): boolean {
    return this.suppressions.covers(rel, kind);
  }

  /** Files already in a directory when its CREATE arrives were perhaps written before its watch (new-dir-scan.ts). */
  private scanNewDir(rel: string): void {
    const scan = scanNewDir(this.view, rel, (child) => {
      // Still open for writing: its CLOSE_WRITE will record it.
      if (this.inScope(child) && !this.suppressed(child, 'write') && !this.dirty.has(child)) this.enqueue('file_write', child, { path: child });
    });
    this.scans.add(scan);
    void scan.finally(() => this.scans.delete(scan));
  }

  private async settle(): Promise<void> {
    while (this.scans.size > 0) await Promise.allSettled([...this.scans]);
  }

  // --- records --------------------------------------------------------------------------------

  private warn(message: string): void {
    this.enqueue('warning', `\0warning${Math.random()}`, { message });
  }

  private enqueue(type: AuditType, rel: string, details: Record<string, unknown>): void {
    const last = this.lastByPath.get(rel);
    if (last && last.type === type) return; // coalesced with the pending one
    const item: Pending = { type, rel, details, ts: new Date() };
    this.pending.push(item);
    this.lastByPath.set(rel, item);
    if (this.pending.length >= MAX_PENDING) this.flush();
    else this.armFlush();
  }

  private armFlush(): void {
    if (this.timer) return;
    this.timer = setTimeout(() => this.flush(), this.coalesceMs);
    this.timer.unref();
  }

  private flush(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    this.recordLinks();
    const items = this.pending;
    this.pending = [];
    this.lastByPath = new Map();
    const writes = items.filter((item) => item.type === 'file_write' && !item.details.directory);
    const stats = this.lstatNames(writes.map((item) => item.rel));
    for (const item of writes) {
      // Gone since (or reached only through a symlink now): no byte count.
      const st = stats.get(item.rel);
      if (st?.isFile()) item.details.bytes = st.size;
      else if (st?.isSymbolicLink()) item.details.symlink = true;
    }
    for (const item of items) {
      const p = this.opts.audit
        ? this.opts.audit.record(item.type, item.details, { ts: item.ts })
        : Promise.resolve().then(() => this.opts.onEvent?.(item.type, item.details, item.ts));
      this.recorded++;
      this.inflight.add(p);
      void p.catch(() => undefined).finally(() => this.inflight.delete(p));
    }
  }

  /** lstatManyBeneath of names, place by place. */
  private lstatNames(names: string[]): Map<string, Stats> {
    const byRoot = new Map<string, Map<string, string>>();
    for (const name of names) {
      const { root, rel } = this.view.locate(name);
      if (!byRoot.has(root)) byRoot.set(root, new Map());
      byRoot.get(root)!.set(rel, name);
    }
    const found = new Map<string, Stats>();
    for (const [root, rels] of byRoot) for (const [rel, st] of lstatManyBeneath(root, rels.keys())) found.set(rels.get(rel)!, st);
    return found;
  }

  /** Files created and not closed since the last flush that are symlinks or hard links: written, with no close to come. */
  private recordLinks(): void {
    if (this.created.size === 0) return;
    const created = [...this.created];
    this.created.clear();
    const stats = this.lstatNames(created);
    for (const rel of created) {
      const st = stats.get(rel);
      if (st && (st.isSymbolicLink() || (st.isFile() && st.nlink > 1)) && this.dirty.delete(rel)) this.enqueue('file_write', rel, { path: rel });
    }
  }
}
