/**
 * Per-sandbox cgroups for the local runtime: memory (+swap), pids and CPU, on cgroup v1
 * (one hierarchy per controller) or v2 (the unified hierarchy, when
 * /sys/fs/cgroup/cgroup.controllers exists). A sandbox's group is `<parent>/<id>` in each
 * hierarchy, `parent` being `svc` at the hierarchy root by default.
 *
 * Reads are synchronous on purpose: cgroupfs files are tiny, in-kernel and answer in
 * microseconds, and the exec path reads them around every command (OOM attribution).
 */
import fs from 'node:fs';
import path from 'node:path';
import type { SandboxResources } from '../runtime.ts';

const ROOT = '/sys/fs/cgroup';
const CPU_PERIOD_US = 100_000;

type Layout = { version: 2; root: string } | { version: 1; memory: string; pids: string; cpu: string | null };

let layoutCache: Layout | null | undefined;

/** Where the cgroup hierarchies are mounted, or null when memory and pids cannot be controlled. */
export function cgroupLayout(): Layout | null {
  if (layoutCache !== undefined) return layoutCache;
  layoutCache = detect();
  return layoutCache;
}

function detect(): Layout | null {
  if (fs.existsSync(path.join(ROOT, 'cgroup.controllers'))) return { version: 2, root: ROOT };
  const mounts = new Map<string, string>();
  for (const line of fs.readFileSync('/proc/self/mounts', 'utf8').split('\n')) {
    const [, dir, type, opts] = line.split(' ');
    if (type !== 'cgroup' || !dir || !opts) continue;
    for (const opt of opts.split(',')) if (!mounts.has(opt)) mounts.set(opt, dir.replace(/\\040/g, ' '));
  }
  const memory = mounts.get('memory');
  const pids = mounts.get('pids');
  if (!memory || !pids) return null;
  return { version: 1, memory, pids, cpu: mounts.get('cpu') ?? null };
}

function write(file: string, value: string | number): void {
  fs.writeFileSync(file, String(value));
}

function readNumber(file: string): number {
  try {
    const text = fs.readFileSync(file, 'utf8').trim();
    return text === 'max' ? Infinity : Number(text);
  } catch {
    return 0;
  }
}

/** `key value` lines (memory.events, memory.oom_control, pids.events, memory.stat) */
function readKeyed(file: string, key: string): number {
  try {
    for (const line of fs.readFileSync(file, 'utf8').split('\n')) {
      const [k, v] = line.split(' ');
      if (k === key) return Number(v);
    }
  } catch {
    /* a group that is gone counts nothing */
  }
  return 0;
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

async function rmdirRetry(dir: string): Promise<boolean> {
  for (let i = 0; i < 50; i++) {
    try {
      fs.rmdirSync(dir);
      return true;
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === 'ENOENT') return true;
      if (code !== 'EBUSY') return false;
      await sleep(10);
    }
  }
  return false;
}

/** In a sandbox's state directory, the name its groups were renamed to (a warm sandbox's, claimed). */
export const CGROUP_NAME_FILE = 'cgroup-name';

export class SandboxCgroup {
  readonly warnings: string[] = [];
  private dirs: string[];
  private memoryDir: string;
  private pidsDir: string;
  private cpuDir: string | null;

  private constructor(
    private readonly layout: Layout,
    parent: string,
    id: string,
  ) {
    if (layout.version === 2) {
      const dir = path.join(layout.root, parent, id);
      this.dirs = [dir];
      this.memoryDir = this.pidsDir = dir;
      this.cpuDir = dir;
    } else {
      this.memoryDir = path.join(layout.memory, parent, id);
      this.pidsDir = path.join(layout.pids, parent, id);
      this.cpuDir = layout.cpu ? path.join(layout.cpu, parent, id) : null;
      this.dirs = [...new Set([this.memoryDir, this.pidsDir, ...(this.cpuDir ? [this.cpuDir] : [])])];
    }
  }

  /** The groups of a sandbox made earlier, maybe by an earlier life of this runner; null without cgroups. */
  static existing(parent: string, id: string): SandboxCgroup | null {
    const layout = cgroupLayout();
    return layout ? new SandboxCgroup(layout, parent, id) : null;
  }

  /**
   * Removes the groups once the processes still in them have exited (they may be dying); never
   * kills: a group that stays busy is left alone, in case it is not what the caller thinks.
   */
  async removeIfEmpty(): Promise<void> {
    for (const dir of this.dirs) await rmdirRetry(dir);
  }

  /** Creates the groups and sets the limits; throws with a clear message when it cannot. */
  static create(parent: string, id: string, resources: SandboxResources): SandboxCgroup {
    const layout = cgroupLayout();
    if (!layout) throw new Error('no memory and pids cgroup controllers are mounted under /sys/fs/cgroup');
    const group = new SandboxCgroup(layout, parent, id);
    try {
      if (layout.version === 2) enableV2Controllers(layout.root, parent);
      for (const dir of group.dirs) fs.mkdirSync(dir, { recursive: true });
      group.apply(resources);
    } catch (err) {
      void group.remove();
      throw new Error(`cannot set up the sandbox's cgroups: ${(err as Error).message}`);
    }
    return group;
  }

  private apply(r: SandboxResources): void {
    const memory = Math.max(8 * 1024 * 1024, Math.floor(r.memoryBytes));
    const pids = Math.max(8, Math.floor(r.pids));
    const quota = Math.max(1000, Math.round(r.cpus * CPU_PERIOD_US));
    if (this.layout.version === 2) {
      write(path.join(this.memoryDir, 'memory.max'), memory);
      if (fs.existsSync(path.join(this.memoryDir, 'memory.swap.max'))) write(path.join(this.memoryDir, 'memory.swap.max'), 0);
      write(path.join(this.pidsDir, 'pids.max'), pids);
      if (fs.existsSync(path.join(this.memoryDir, 'cpu.max'))) write(path.join(this.memoryDir, 'cpu.max'), `${quota} ${CPU_PERIOD_US}`);
      else this.warnings.push('the cpu cgroup controller is not available: no CPU limit');
      return;
    }
    write(path.join(this.memoryDir, 'memory.limit_in_bytes'), memory);
    const memsw = path.join(this.memoryDir, 'memory.memsw.limit_in_bytes');
    if (fs.existsSync(memsw)) write(memsw, memory);
    else {
      // without swap accounting, keep the group out of swap so the limit holds
      try {
        write(path.join(this.memoryDir, 'memory.swappiness'), 0);
      } catch {
        /* older kernels refuse it on some groups */
      }
    }
    write(path.join(this.pidsDir, 'pids.max'), pids);
    if (this.cpuDir) {
      write(path.join(this.cpuDir, 'cpu.cfs_period_us'), CPU_PERIOD_US);
      write(path.join(this.cpuDir, 'cpu.cfs_quota_us'), quota);
    } else this.warnings.push('the cpu cgroup controller is not mounted: no CPU limit');
  }

  /** Renames the groups to `id` (its processes stay in them): a warm sandbox's groups take the name of the sandbox it becomes. */
  rename(id: string): void {
    const renamed = (dir: string) => path.join(path.dirname(dir), id);
    for (const dir of this.dirs) fs.renameSync(dir, renamed(dir));
    this.dirs = this.dirs.map(renamed);
    this.memoryDir = renamed(this.memoryDir);
    this.pidsDir = renamed(this.pidsDir);
    this.cpuDir = this.cpuDir && renamed(this.cpuDir);
  }

  /**
   * The files a single-threaded process writes `0` to in order to join every group. On v1,
   * `tasks`: moving the writing thread itself skips the kernel's global threadgroup lock, whose
   * write side waits out an RCU grace period (cgroup.procs took 5-30 ms per create here, `tasks`
   * 0.1 ms); the one thread is the whole process, so nothing is left outside.
   */
  joinFiles(): string[] {
    return this.dirs.map((dir) => path.join(dir, this.layout.version === 2 ? 'cgroup.procs' : 'tasks'));
  }

  oomKills(): number {
    return this.layout.version === 2
      ? readKeyed(path.join(this.memoryDir, 'memory.events'), 'oom_kill')
      : readKeyed(path.join(this.memoryDir, 'memory.oom_control'), 'oom_kill');
  }

  /** how often a fork was refused at pids.max */
  pidsLimitHits(): number {
    return readKeyed(path.join(this.pidsDir, 'pids.events'), 'max');
  }

  memoryBytes(): number {
    return readNumber(path.join(this.memoryDir, this.layout.version === 2 ? 'memory.current' : 'memory.usage_in_bytes'));
  }

  pids(): number {
    return readNumber(path.join(this.pidsDir, 'pids.current'));
  }

  /** host pids of the group's processes */
  members(): number[] {
    try {
      return fs.readFileSync(path.join(this.pidsDir, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean).map(Number);
    } catch {
      return [];
    }
  }

  /** SIGKILLs every process in the group until it is empty (or the attempts run out) */
  async killAll(): Promise<void> {
    const kill = path.join(this.pidsDir, 'cgroup.kill');
    if (this.layout.version === 2 && fs.existsSync(kill)) {
      try {
        write(kill, 1);
      } catch {
        /* fall back to signalling each process */
      }
    }
    for (let round = 0; round < 200; round++) {
      let procs: number[];
      try {
        procs = fs.readFileSync(path.join(this.pidsDir, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean).map(Number);
      } catch {
        return;
      }
      if (procs.length === 0) return;
      for (const pid of procs) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          /* already gone */
        }
      }
      await sleep(round < 10 ? 1 : 10);
    }
  }

  /** Removes the groups (kills what is left in them first). Returns false if one could not be removed. */
  async remove(): Promise<boolean> {
    let ok = true;
    for (const dir of this.dirs) {
      if (!fs.existsSync(dir)) continue;
      if (!(await rmdirRetry(dir))) {
        await this.killAll();
        ok = (await rmdirRetry(dir)) && ok;
      }
    }
    return ok;
  }
}

/**
 * Removes the groups of sandboxes whose owner died without destroying them (a crashed runner):
 * every group under `parent` with no process left that is older than `minAgeMs` (a group that
 * is being set up right now is young). The kernel refuses to remove a group with processes.
 */
export function sweepStaleCgroups(parent: string, minAgeMs = 60_000): number {
  const layout = cgroupLayout();
  if (!layout) return 0;
  const roots = layout.version === 2 ? [layout.root] : [layout.memory, layout.pids, ...(layout.cpu ? [layout.cpu] : [])];
  let removed = 0;
  for (const root of new Set(roots)) {
    const dir = path.join(root, parent);
    let entries: fs.Dirent[];
    try {
      entries = fs.readdirSync(dir, { withFileTypes: true });
    } catch {
      continue;
    }
    for (const entry of entries) {
      if (!entry.isDirectory()) continue;
      const group = path.join(dir, entry.name);
      try {
        if (Date.now() - fs.statSync(group).mtimeMs < minAgeMs) continue;
        if (fs.readFileSync(path.join(group, 'cgroup.procs'), 'utf8').trim()) continue;
        fs.rmdirSync(group);
        removed++;
      } catch {
        /* in use, or gone already */
      }
    }
  }
  return removed;
}

function enableV2Controllers(root: string, parent: string): void {
  // v2 only hands controllers to children whose parent enabled them in cgroup.subtree_control
  const wanted = ['memory', 'pids', 'cpu'];
  let dir = root;
  for (const part of ['', ...parent.split('/').filter(Boolean)]) {
    dir = part ? path.join(dir, part) : dir;
    fs.mkdirSync(dir, { recursive: true });
    const available = fs.readFileSync(path.join(dir, 'cgroup.controllers'), 'utf8').split(/\s+/);
    const enabled = fs.readFileSync(path.join(dir, 'cgroup.subtree_control'), 'utf8').split(/\s+/);
    const missing = wanted.filter((c) => available.includes(c) && !enabled.includes(c));
    if (missing.length) write(path.join(dir, 'cgroup.subtree_control'), missing.map((c) => `+${c}`).join(' '));
  }
}
