/**
 * Every process the sandboxes' commands start, at any depth, seen by the kernel rather than
 * reported by anything inside the sandbox: one bpftrace per runner, on the exec and exit
 * tracepoints, for tasks outside the host's pid namespace. The arguments are read at the execve
 * call itself, so a process that execs at once, double-forks or kills itself is recorded all the
 * same; its exit code comes from the exit tracepoint. Events are tagged with the task's pid
 * namespace, which names the sandbox (each sandbox has its own, and cannot make another:
 * unshare and clone with namespace flags are refused by its seccomp filter).
 *
 * Each output line starts with a random nonce only the runner knows: an argument holding a
 * newline cannot forge an event, its next line is read as the rest of the argument.
 *
 * The kernel's events reach bpftrace through one buffer per CPU, so they arrive out of order when
 * a process moves between CPUs (the kernel moves a process at exec to balance load): its exit may
 * come before its exec. Every event carries its kernel time, and events are handled in time order
 * once REORDER_NS old (or all at once when a watch ends).
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import readline from 'node:readline';

/** One program a sandbox ran, from its exec to its exit (or to its next exec, or to the end of the watch). */
export interface ProcessRun {
  /** host pids: stable within one sandbox, enough to rebuild the tree */
  pid: number;
  parent_pid: number;
  /** argv joined by spaces: at most MAX_ARGS arguments of at most STRLEN - 1 characters (else `truncated`) */
  command: string;
  truncated: boolean;
  /** null when the program did not exit by itself while watched (it exec'd again, or was still running) */
  exit_code: number | null;
  /** the signal that ended it, when one did */
  signal: number | null;
  duration_ms: number;
  started_at: Date;
}

export interface ProcessWatch {
  /** the sandbox's pid namespace (the inode number of /proc/<pid>/ns/pid) */
  pidNamespace: number;
  /** host pid of the sandbox's supervisor: the programs its shepherds start are the commands themselves, recorded by the commands API */
  supervisorPid: number;
  onRun(run: ProcessRun): void;
  /** the kernel's buffer overflowed: `lost` events of some sandbox are missing */
  onLost(lost: number): void;
  /** the tracer ended (it died): nothing after this is captured */
  onStopped(reason: string): void;
}

const MAX_ARGS = 16;
/** bpftrace's string size (its largest): an argument is cut at STRLEN - 1 characters */
const STRLEN = 200;
const TRACEFS = '/sys/kernel/tracing';

/** The bpftrace program; `N` is the nonce. Arguments stop at argv's NULL (envp follows it in memory). */
const program = (nonce: string) => `
BEGIN { printf("${nonce} B %llu\\n", nsecs); }
tracepoint:syscalls:sys_enter_execve,tracepoint:syscalls:sys_enter_execveat /curtask->nsproxy->pid_ns_for_children->level > 0/ {
  printf("${nonce} x %d %d %d %u %llu\\n", tid, curtask->real_parent->tgid, curtask->real_parent->real_parent->tgid, curtask->nsproxy->pid_ns_for_children->ns.inum, nsecs);
  $i = 0; $end = 0;
  unroll(${MAX_ARGS + 1}) {
    if ($end == 0) {
      $p = *(args->argv + $i);
      if ($p == 0) { $end = 1; } else { printf("${nonce} a %d %d %s\\n", tid, $i, str($p)); }
    }
    $i++;
  }
}
tracepoint:sched:sched_process_exec /curtask->nsproxy->pid_ns_for_children->level > 0/ { printf("${nonce} e %d %llu\\n", pid, nsecs); }
tracepoint:sched:sched_process_exit /pid == tid && curtask->nsproxy->pid_ns_for_children->level > 0/ { printf("${nonce} q %d %d %llu\\n", pid, curtask->exit_code, nsecs); }
`;

/** How long an event waits for earlier ones from other CPUs before it is handled. */
const REORDER_NS = 50_000_000n;

/** One kernel event, in the order of its time: an exec's start (with its arguments), an exec done, an exit. */
type TracedEvent =
  | { kind: 'x'; pid: number; ns: bigint; exec: PendingExec | null }
  | { kind: 'e'; pid: number; ns: bigint }
  | { kind: 'q'; pid: number; ns: bigint; status: number };

interface PendingExec {
  parent: number;
  grandparent: number;
  namespace: number;
  args: string[];
  /** an argument past MAX_ARGS, or one cut at bpftrace's string size */
  truncated: boolean;
}

interface Running extends PendingExec {
  pid: number;
  startNs: bigint;
}

let shared: ProcessTracer | null = null;
const unavailable = new Map<string, string | null>();

/** The runner's tracer, or why there is none (checked once per binary: bpftrace, tracefs). */
export function processTracer(binary: string): ProcessTracer | string {
  if (!unavailable.has(binary)) unavailable.set(binary, tracerUnavailable(binary));
  const why = unavailable.get(binary);
  if (why) return why;
  return (shared ??= new ProcessTracer(binary));
}

/** Stops the runner's tracer, if it started. */
export function stopProcessTracer(): void {
  shared?.stop();
  shared = null;
}

/** Why the tracer cannot run here, or null when it can (mounting tracefs if it is not). */
function tracerUnavailable(binary: string): string | null {
  if (spawnSync(binary, ['--version'], { stdio: 'ignore' }).status !== 0) return `${binary} does not run (apt-get install bpftrace, or set SVC_PROCESS_TRACER)`;
  if (!fs.existsSync(`${TRACEFS}/events/sched`)) {
    const mounted = spawnSync('mount', ['-t', 'tracefs', 'nodev', TRACEFS], { stdio: 'ignore' });
    if (mounted.status !== 0 || !fs.existsSync(`${TRACEFS}/events/sched`)) return `tracefs is not mounted at ${TRACEFS} and could not be`;
  }
  return null;
}

/** The runner's one tracer, started by the first watch and kept while the runner lives. */
export class ProcessTracer {
  private child: ChildProcess | null = null;
  private starting: Promise<void> | null = null;
  private readonly nonce = randomBytes(12).toString('hex');
  private readonly watches = new Map<number, ProcessWatch>();
  private readonly pending = new Map<number, PendingExec>();
  private readonly running = new Map<number, Running>();
  /** wall-clock ms at the kernel's monotonic 0, from the BEGIN line */
  private epochMs = 0;
  private lastArg: { list: string[]; index: number } | null = null;
  /** Each thread's latest exec start, which its argument lines fill in. */
  private readonly filling = new Map<number, PendingExec>();
  /** Events not handled yet, waiting for earlier ones from other CPUs. */
  private queue: TracedEvent[] = [];
  private timer: NodeJS.Timeout | null = null;

  constructor(private readonly binary: string) {}

  /** Starts reporting the programs of one sandbox; the returned function ends the watch, reporting what still runs. */
  async watch(watch: ProcessWatch): Promise<() => void> {
    await this.start();
    this.watches.set(watch.pidNamespace, watch);
    return () => {
      this.handleQueued(null);
      for (const run of [...this.running.values()]) if (run.namespace === watch.pidNamespace) this.finish(run, null, process.hrtime.bigint());
      this.watches.delete(watch.pidNamespace);
    };
  }

  stop(): void {
    const child = this.child;
    this.watches.clear();
    this.child = null;
    this.starting = null;
    child?.kill('SIGTERM');
  }

  private start(): Promise<void> {
    this.starting ??= new Promise<void>((resolve, reject) => {
      const child = spawn(this.binary, ['-e', program(this.nonce)], { env: { ...process.env, BPFTRACE_STRLEN: String(STRLEN) }, stdio: ['ignore', 'pipe', 'pipe'] });
      this.child = child;
      let errors = '';
      child.stderr!.on('data', (chunk: Buffer) => {
        const text = chunk.toString('utf8');
        errors = (errors + text).slice(-2000);
        for (const [, lost] of text.matchAll(/Lost (\d+) events/g)) for (const w of this.watches.values()) w.onLost(Number(lost));
      });
      // 'close', not 'exit': its stderr has been read by then.
      child.once('close', (code, signal) => {
        const reason = `bpftrace exited (${signal ?? code}): ${errors.trim() || 'no message'}`;
        this.child = null;
        this.starting = null;
        reject(new Error(reason));
        // Watches of a tracer that had started lose their capture: each is told, and a later watch starts a new tracer.
        for (const w of this.watches.values()) w.onStopped(reason);
        this.watches.clear();
        this.running.clear();
        this.pending.clear();
        this.filling.clear();
        this.queue = [];
      });
      readline.createInterface({ input: child.stdout! }).on('line', (line) => {
        if (line.startsWith(`${this.nonce} B `)) {
          this.epochMs = Date.now() - Number(BigInt(line.split(' ')[2]!) / 1_000_000n);
          resolve();
        } else this.read(line);
      });
    });
    return this.starting;
  }

  private read(line: string): void {
    if (!line.startsWith(`${this.nonce} `)) {
      // The rest of an argument that held a newline.
      if (this.lastArg) this.lastArg.list[this.lastArg.index] += `\n${line}`;
      return;
    }
    const [, kind, a, b, c, d, e] = line.split(' ');
    const pid = Number(a);
    if (kind === 'x') {
      this.lastArg = null;
      // Only the watched sandboxes' execs are kept (other containers of the host have pid namespaces too).
      const exec = this.watches.has(Number(d)) ? { parent: Number(b), grandparent: Number(c), namespace: Number(d), args: [], truncated: false } : null;
      if (exec) this.filling.set(pid, exec);
      else this.filling.delete(pid);
      this.enqueue({ kind: 'x', pid, ns: BigInt(e!), exec });
    } else if (kind === 'a') {
      // Right after its exec's start, from the same CPU.
      const exec = this.filling.get(pid);
      const index = Number(b);
      const text = line.slice(`${this.nonce} a ${a} ${b} `.length);
      if (!exec) return;
      if (index >= MAX_ARGS || text.length >= STRLEN - 1) exec.truncated = true;
      if (index < MAX_ARGS) {
        exec.args[index] = text;
        this.lastArg = { list: exec.args, index };
      }
    } else if (kind === 'e') this.enqueue({ kind: 'e', pid, ns: BigInt(b!) });
    else if (kind === 'q') {
      this.filling.delete(pid);
      this.enqueue({ kind: 'q', pid, ns: BigInt(c!), status: Number(b) });
    }
  }

  private enqueue(event: TracedEvent): void {
    this.queue.push(event);
    this.arm();
  }

  /** Handles what is due in REORDER_NS, then again while events wait. */
  private arm(): void {
    this.timer ??= setTimeout(() => {
      this.timer = null;
      this.handleQueued(process.hrtime.bigint() - REORDER_NS);
      if (this.queue.length > 0) this.arm();
    }, Number(REORDER_NS / 1_000_000n));
  }

  /** Handles the queued events up to `until` (kernel ns; null: all of them), in time order. */
  private handleQueued(until: bigint | null): void {
    this.queue.sort((x, y) => (x.ns < y.ns ? -1 : x.ns > y.ns ? 1 : 0));
    const cut = until === null ? this.queue.length : this.queue.findIndex((event) => event.ns > until);
    const due = cut < 0 ? this.queue : this.queue.slice(0, cut);
    this.queue = cut < 0 ? [] : this.queue.slice(cut);
    for (const event of due) {
      if (event.kind === 'x') {
        if (event.exec) this.pending.set(event.pid, event.exec);
        else this.pending.delete(event.pid);
      } else if (event.kind === 'e') this.exec(event.pid, event.ns);
      else {
        // A failed exec leaves a pending one that no exec event ends: its process's exit does.
        this.pending.delete(event.pid);
        const run = this.running.get(event.pid);
        if (run) this.finish(run, event.status, event.ns);
      }
    }
  }

  /** A successful exec: the program replaces whatever the process ran before. */
  private exec(pid: number, ns: bigint): void {
    const exec = this.pending.get(pid);
    this.pending.delete(pid);
    const previous = this.running.get(pid);
    if (previous) this.finish(previous, null, ns);
    if (!exec) return;
    const watch = this.watches.get(exec.namespace);
    // The commands themselves (their parent a shepherd of the supervisor) are the commands API's records.
    if (!watch || exec.grandparent === watch.supervisorPid) return;
    this.running.set(pid, { ...exec, pid, startNs: ns });
  }

  private finish(run: Running, status: number | null, ns: bigint): void {
    this.running.delete(run.pid);
    const watch = this.watches.get(run.namespace);
    if (!watch) return;
    const signal = status === null ? null : status & 0x7f;
    const startedMs = this.epochMs + Number(run.startNs / 1_000_000n);
    watch.onRun({
      pid: run.pid,
      parent_pid: run.parent,
      command: run.args.filter((arg) => arg !== undefined).join(' '),
      truncated: run.truncated,
      exit_code: status === null || signal !== 0 ? null : (status >> 8) & 0xff,
      signal: signal ? signal : null,
      duration_ms: Math.max(0, Math.round(Number(ns - run.startNs) / 1e6)),
      started_at: new Date(startedMs),
    });
  }
}
