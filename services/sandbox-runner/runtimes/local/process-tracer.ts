/**
 * Every process the sandboxes' commands start, at any depth, seen by the kernel rather than
 * reported by anything inside the sandbox: one tracer per runner, on the exec and exit
 * tracepoints, for tasks outside the host's pid namespace. The arguments are read when the exec
 * has replaced the program, from the new image's argument area (mm->arg_start..arg_end), before
 * the program runs: nothing else can reach that memory yet, so what is read is what runs, and a
 * process that execs at once, double-forks or kills itself is recorded all the same; its exit
 * code comes from the exit tracepoint. Events are tagged with the task's pid namespace, which
 * names the sandbox (each sandbox has its own, and cannot make another: unshare and clone with
 * namespace flags are refused by its seccomp filter). Only the watched namespaces are reported:
 * the runner adds and removes them in the program's map of watched namespaces, so the sandboxes
 * that do not ask for the audit cost the kernel a map lookup per exec and exit, nothing more.
 *
 * The tracer is a purpose-built BPF program (process-tracer/: tracer.bpf.c for the kernel, tracer.c
 * its loader), built on first use (process-tracer-build.ts, which also chooses the tracer). Its records go through one BPF ring buffer, so they
 * come out in the order they were written whatever the CPU, and without waking the loader for
 * each: it reads the ring every 20 ms (sooner when the ring fills). The loader takes the watched
 * namespaces on its stdin and answers each, and ends when its stdin closes.
 * Where clang, libbpf or the kernel's BTF are missing, or SVC_PROCESS_TRACER names a bpftrace
 * binary instead of the default `builtin`, the same capture runs as a bpftrace program instead,
 * whose `@watched` map the runner fills with bpftool. It costs more: one perf buffer per CPU and
 * a wakeup per event (the bench's build-like command with process and file audit on took 1.3x its
 * time with the audit off under bpftrace, 1.15x with the built tracer).
 *
 * No syscall tracepoint is used: enabling one sends every system call of every task on the host
 * through the slow path, which cost a build-like command more than the tracing itself.
 *
 * Each output line starts with a random nonce only the runner knows, and the arguments are
 * printed as hex, so nothing the agent passes can forge or split a line.
 *
 * bpftrace's events arrive through one buffer per CPU, so out of order when a process moves
 * between CPUs (the kernel moves a process at exec to balance load): its exit may come before its
 * exec. Every event carries its kernel time, and events are handled in time order once
 * REORDER_NS old (or all at once when a watch ends), whichever the tracer.
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import readline from 'node:readline';
import { promisify } from 'node:util';
import { BPFTOOL, builtTracer, chooseTracer } from './process-tracer-build.ts';

/** One program a sandbox ran, from its exec to its exit (or to its next exec, or to the end of the watch). */
export interface ProcessRun {
  /** host pids: stable within one sandbox, enough to rebuild the tree */
  pid: number;
  parent_pid: number;
  /** argv joined by spaces: its first ARGV_BYTES bytes (else `truncated`) */
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

/** bpftrace's buffer size (its largest): there, argv is read in chunks of this many bytes */
const CHUNK = 200;
const CHUNKS = 16;
/** The most of a command line recorded; the rest is cut (`truncated`). Also TRACER_ARGV_BYTES in process-tracer/tracer.h. */
export const ARGV_BYTES = CHUNK * CHUNKS;
/**
 * The bpftrace program. An exec line `e pid parent grandparent namespace ns argv-length hex` has
 * argv's first CHUNK bytes; chunk lines `a pid ns offset hex` from the same probe have the rest.
 * The built tracer prints the same lines, with all of argv (up to ARGV_BYTES) on the exec line.
 */
const program = (nonce: string) => `
BEGIN { @watched[(uint64)0] = (uint64)0; delete(@watched[(uint64)0]); printf("${nonce} B %llu\\n", nsecs); }
tracepoint:sched:sched_process_exec /@watched[(uint64)curtask->nsproxy->pid_ns_for_children->ns.inum]/ {
  $start = curtask->mm->arg_start;
  $length = (int64)(curtask->mm->arg_end - $start);
  $ns = nsecs;
  $size = $length;
  if ($size > ${CHUNK}) { $size = ${CHUNK}; }
  printf("${nonce} e %d %d %d %u %llu %lld %rx\\n", pid, curtask->real_parent->tgid, curtask->real_parent->real_parent->tgid, curtask->nsproxy->pid_ns_for_children->ns.inum, $ns, $length, buf(uptr($start), $size));
  $offset = (int64)${CHUNK};
  unroll(${CHUNKS - 1}) {
    if ($offset < $length) {
      $size = $length - $offset;
      if ($size > ${CHUNK}) { $size = ${CHUNK}; }
      printf("${nonce} a %d %llu %lld %rx\\n", pid, $ns, $offset, buf(uptr($start + (uint64)$offset), $size));
    }
    $offset += ${CHUNK};
  }
}
tracepoint:sched:sched_process_exit /pid == tid && @watched[(uint64)curtask->nsproxy->pid_ns_for_children->ns.inum]/ { printf("${nonce} q %d %d %llu\\n", pid, curtask->exit_code, nsecs); }
`;

/** How long an event waits for earlier ones from other CPUs before it is handled. */
const REORDER_NS = 50_000_000n;
/** How long the tracer may take to load its program, or to answer a watch, before it is given up (killed): capture is then off, never a hung boot. */
const TRACER_ANSWER_MS = 30_000;

/** One kernel event, in the order of its time: an exec (with its arguments), an exit. */
type TracedEvent = { kind: 'e'; pid: number; ns: bigint; exec: Exec } | { kind: 'q'; pid: number; ns: bigint; status: number };

interface Exec {
  parent: number;
  grandparent: number;
  namespace: number;
  /** argv's bytes as far as read (NUL after each argument), filled by the chunk lines */
  argv: Buffer;
  /** argv was longer than ARGV_BYTES */
  truncated: boolean;
}

interface Running extends Exec {
  pid: number;
  startNs: bigint;
}

const run = promisify(execFile);

let shared: ProcessTracer | null = null;
const unavailable = new Map<string, { built: boolean; binary: string } | string>();

/**
 * The runner's tracer, or why there is none (checked once per setting): the built tracer for the
 * default setting where it can be built, else bpftrace (with bpftool and tracefs).
 */
export function processTracer(setting: string): ProcessTracer | string {
  if (!unavailable.has(setting)) unavailable.set(setting, chooseTracer(setting));
  const choice = unavailable.get(setting)!;
  if (typeof choice === 'string') return choice;
  return (shared ??= new ProcessTracer(choice.binary, choice.built));
}

/** Stops the runner's tracer, if it started. */
export function stopProcessTracer(): void {
  shared?.stop();
  shared = null;
}

/** The runner's one tracer, started by the first watch and kept while the runner lives. */
export class ProcessTracer {
  private child: ChildProcess | null = null;
  private starting: Promise<void> | null = null;
  private readonly nonce = randomBytes(12).toString('hex');
  private readonly watches = new Map<number, ProcessWatch>();
  private readonly running = new Map<number, Running>();
  /** wall-clock ms at the kernel's monotonic 0, from the BEGIN line */
  private epochMs = 0;
  /** The watched execs whose argv the chunk lines fill in, by `pid ns` (until the exec is handled). */
  private readonly filling = new Map<string, Exec>();
  /** Events not handled yet, waiting for earlier ones from other CPUs. */
  private queue: TracedEvent[] = [];
  private timer: NodeJS.Timeout | null = null;
  /** bpftrace: the kernel's id of the program's `@watched` map, found once the program runs. */
  private watchedMap: number | null = null;
  /** The built tracer: the watches it has not answered yet, by namespace. */
  private readonly answers = new Map<number, Array<{ resolve: () => void; reject: (err: Error) => void }>>();
  /** Why the running tracer was killed by the runner, told when it closes. */
  private givenUp = '';

  /** `built`: the tracer of services/sandbox-runner/runtimes/local/process-tracer/; else the bpftrace `binary`. */
  constructor(
    private readonly binary: string,
    private readonly built: boolean,
  ) {}

  private get name(): string {
    return this.built ? 'the process tracer' : 'bpftrace';
  }

  /** Starts reporting the programs of one sandbox; the returned function ends the watch, reporting what still runs. */
  async watch(watch: ProcessWatch): Promise<() => void> {
    await this.start();
    this.watches.set(watch.pidNamespace, watch);
    try {
      if (this.built) await this.tell('+', watch.pidNamespace);
      else await this.bpftool('update', watch.pidNamespace, ['value', ...bytes(1n)]);
    } catch (err) {
      this.watches.delete(watch.pidNamespace);
      throw err;
    }
    return () => {
      this.handleQueued(null);
      for (const run of [...this.running.values()]) if (run.namespace === watch.pidNamespace) this.finish(run, null, process.hrtime.bigint());
      this.watches.delete(watch.pidNamespace);
      if (this.built) this.tell('-', watch.pidNamespace).catch(() => undefined);
      else this.bpftool('delete', watch.pidNamespace, []).catch(() => undefined);
    };
  }

  /** Adds a namespace to the built tracer's map (resolving once it is there), or removes it. */
  private tell(operation: '+' | '-', namespace: number): Promise<void> {
    const stdin = this.child?.stdin;
    if (!stdin?.writable) return Promise.reject(new Error('the tracer is not running'));
    stdin.write(`${operation} ${namespace}\n`);
    if (operation === '-') return Promise.resolve();
    return new Promise((resolve, reject) => {
      const waiting = this.answers.get(namespace) ?? [];
      const timer = setTimeout(() => this.giveUp(`the process tracer did not answer a watch within ${TRACER_ANSWER_MS} ms`), TRACER_ANSWER_MS);
      waiting.push({
        resolve: () => {
          clearTimeout(timer);
          resolve();
        },
        reject: (err) => {
          clearTimeout(timer);
          reject(err);
        },
      });
      this.answers.set(namespace, waiting);
    });
  }

  /** `W namespace errno`: the built tracer's answer to a `+`. */
  private answered(namespace: number, errno: number): void {
    const waiting = this.answers.get(namespace)?.shift();
    if (this.answers.get(namespace)?.length === 0) this.answers.delete(namespace);
    if (!waiting) return;
    if (errno === 0) waiting.resolve();
    else {
      const name = Object.entries(os.constants.errno).find(([, n]) => n === errno)?.[0] ?? `errno ${errno}`;
      waiting.reject(new Error(`the process tracer cannot watch pid namespace ${namespace} (${name})`));
    }
  }

  /** Adds a namespace to the `@watched` map, or removes it. */
  private async bpftool(operation: 'update' | 'delete', namespace: number, rest: string[]): Promise<void> {
    if (this.watchedMap === null) throw new Error('the tracer is not running');
    await run(BPFTOOL!, ['map', operation, 'id', String(this.watchedMap), 'key', ...bytes(BigInt(namespace)), ...rest]);
  }

  /** The id of the bpftrace process's `@watched` map: among the maps its descriptors hold, the one of that name. */
  private async findWatchedMap(pid: number): Promise<number> {
    const ids = new Set<number>();
    for (const fd of await fs.promises.readdir(`/proc/${pid}/fdinfo`)) {
      const info = await fs.promises.readFile(`/proc/${pid}/fdinfo/${fd}`, 'utf8').catch(() => '');
      const id = /^map_id:\s+(\d+)$/m.exec(info);
      if (id) ids.add(Number(id[1]));
    }
    const { stdout } = await run(BPFTOOL!, ['map', 'show', '--json'], { maxBuffer: 64 * 1024 * 1024 });
    const found = (JSON.parse(stdout) as Array<{ id: number; name?: string }>).find((map) => ids.has(map.id) && map.name === 'AT_watched');
    if (!found) throw new Error('bpftrace started without its @watched map');
    return found.id;
  }

  /** A tracer that stopped answering is killed: its close fails what waits on it, and a later watch starts another. */
  private giveUp(reason: string): void {
    this.givenUp = reason;
    this.child?.kill('SIGKILL');
  }

  stop(): void {
    const child = this.child;
    this.watches.clear();
    this.child = null;
    this.starting = null;
    child?.kill('SIGTERM');
  }

  private start(): Promise<void> {
    this.starting ??= (this.built ? builtTracer() : Promise.resolve(null)).then(
      (built) => this.spawn(built),
      (err: unknown) => {
        this.starting = null; // a later watch tries again
        throw err;
      },
    );
    return this.starting;
  }

  private spawn(built: { loader: string; object: string } | null): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const child = built
        ? // Its stdin is the runner's: the tracer ends when it closes, should the runner end without stopping it.
          spawn(built.loader, [built.object, this.nonce], { stdio: ['pipe', 'pipe', 'pipe'] })
        : spawn(this.binary, ['-e', program(this.nonce)], { env: { ...process.env, BPFTRACE_STRLEN: String(CHUNK) }, stdio: ['ignore', 'pipe', 'pipe'] });
      this.child = child;
      child.stdin?.on('error', () => undefined); // EPIPE once it died: its close says why
      let errors = '';
      child.stderr!.on('data', (chunk: Buffer) => {
        const text = chunk.toString('utf8');
        errors = (errors + text).slice(-2000);
        for (const [, lost] of text.matchAll(/Lost (\d+) events/g)) for (const w of this.watches.values()) w.onLost(Number(lost));
      });
      // 'close', not 'exit': its stderr has been read by then.
      const loading = setTimeout(() => this.giveUp(`${this.name} did not load within ${TRACER_ANSWER_MS} ms`), TRACER_ANSWER_MS);
      child.once('close', (code, signal) => {
        clearTimeout(loading);
        const reason = `${this.name} exited (${signal ?? code}): ${[this.givenUp, errors.trim()].filter(Boolean).join('; ') || 'no message'}`;
        this.givenUp = '';
        this.child = null;
        this.starting = null;
        this.watchedMap = null;
        reject(new Error(reason));
        // Watches of a tracer that had started lose their capture: each is told, and a later watch starts a new tracer.
        for (const w of this.watches.values()) w.onStopped(reason);
        this.watches.clear();
        this.running.clear();
        this.filling.clear();
        this.queue = [];
        for (const waiting of this.answers.values()) for (const { reject: fail } of waiting) fail(new Error(reason));
        this.answers.clear();
      });
      readline.createInterface({ input: child.stdout! }).on('line', (line) => {
        if (line.startsWith(`${this.nonce} B `)) {
          clearTimeout(loading);
          this.epochMs = Date.now() - Number(BigInt(line.split(' ')[2]!) / 1_000_000n);
          if (built) return resolve();
          this.findWatchedMap(child.pid!).then(
            (id) => {
              this.watchedMap = id;
              resolve();
            },
            (err: Error) => {
              errors += err.message;
              child.kill('SIGTERM');
            },
          );
        } else this.read(line);
      });
    });
  }

  private read(line: string): void {
    const [nonce, kind, a, b, c, d, e, f, g] = line.split(' ');
    if (nonce !== this.nonce) return;
    const pid = Number(a);
    if (kind === 'e') {
      // Only the watched sandboxes' execs are kept (other containers of the host have pid namespaces too).
      if (!this.watches.has(Number(d))) return;
      const length = Number(f);
      const exec = {
        parent: Number(b),
        grandparent: Number(c),
        namespace: Number(d),
        argv: Buffer.alloc(Math.min(length, ARGV_BYTES)),
        truncated: length > ARGV_BYTES,
      };
      fillArgv(exec, 0, g);
      if (length > CHUNK && !this.built) this.filling.set(`${pid} ${e}`, exec);
      this.enqueue({ kind: 'e', pid, ns: BigInt(e!), exec });
    } else if (kind === 'a') {
      const exec = this.filling.get(`${pid} ${b}`);
      if (exec) fillArgv(exec, Number(c), d);
    } else if (kind === 'q') this.enqueue({ kind: 'q', pid, ns: BigInt(c!), status: Number(b) });
    else if (kind === 'W') this.answered(pid, Number(b));
  }

  private enqueue(event: TracedEvent): void {
    this.queue.push(event);
    this.arm();
  }

  /** Handles what is due in REORDER_NS, then again while events wait. */
  private arm(): void {
    this.timer ??= setTimeout(
      () => {
        this.timer = null;
        this.handleQueued(process.hrtime.bigint() - REORDER_NS);
        if (this.queue.length > 0) this.arm();
      },
      Number(REORDER_NS / 1_000_000n),
    );
  }

  /** Handles the queued events up to `until` (kernel ns; null: all of them), in time order. */
  private handleQueued(until: bigint | null): void {
    this.queue.sort((x, y) => (x.ns < y.ns ? -1 : x.ns > y.ns ? 1 : 0));
    const cut = until === null ? this.queue.length : this.queue.findIndex((event) => event.ns > until);
    const due = cut < 0 ? this.queue : this.queue.slice(0, cut);
    this.queue = cut < 0 ? [] : this.queue.slice(cut);
    for (const event of due) {
      if (event.kind === 'e') this.exec(event.pid, event.ns, event.exec);
      else {
        const run = this.running.get(event.pid);
        if (run) this.finish(run, event.status, event.ns);
      }
    }
  }

  /** An exec: the program replaces whatever the process ran before. */
  private exec(pid: number, ns: bigint, exec: Exec): void {
    this.filling.delete(`${pid} ${ns}`);
    const previous = this.running.get(pid);
    if (previous) this.finish(previous, null, ns);
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
      command: commandLine(run.argv),
      truncated: run.truncated,
      exit_code: status === null || signal !== 0 ? null : (status >> 8) & 0xff,
      signal: signal ? signal : null,
      duration_ms: Math.max(0, Math.round(Number(ns - run.startNs) / 1e6)),
      started_at: new Date(startedMs),
    });
  }
}

/** Copies a chunk of argv (`\\x2f\\x62...` as bpftrace's %rx prints it, `2f62...` as the built tracer does) to its place. */
function fillArgv(exec: Exec, offset: number, hex: string | undefined): void {
  if (hex && offset < exec.argv.length) Buffer.from(hex.replaceAll('\\x', ''), 'hex').copy(exec.argv, offset);
}

/** argv's bytes (each argument followed by a NUL; the last one may be cut) as one line, arguments joined by spaces. */
function commandLine(argv: Buffer): string {
  const args = argv.toString('utf8').split('\0');
  if (args.at(-1) === '') args.pop();
  return args.join(' ');
}

/** A number as the 8 bytes of a map's uint64 key or value, in the machine's order, for bpftool. */
function bytes(value: bigint): string[] {
  const buffer = Buffer.alloc(8);
  if (os.endianness() === 'LE') buffer.writeBigUInt64LE(value);
  else buffer.writeBigUInt64BE(value);
  return [...buffer].map(String);
}
