/**
 * A sandbox of the `local` runtime, as the runner drives it (SandboxHandle): commands, terminals,
 * kills and usage through its supervisor (over supervisor-channel.ts), the runner's adoption of a
 * warm one (its id, env, root, service bridge and network), and its teardown. LocalRuntime.create
 * (local-runtime.ts) makes it once bubblewrap is launched; it is ready at the supervisor's READY.
 */
import fs from 'node:fs';
import path from 'node:path';
import type { Readable, Writable } from 'node:stream';
import type { Logger } from '../../../kernel/logger.ts';
import { commandSizeProblem, envSizeProblem, MAX_COMMANDS_AT_ONCE } from '../../../domain/sandbox-limits.ts';
import { CGROUP_NAME_FILE, type SandboxCgroup } from './cgroups.ts';
import { pidInSandboxNetns, type ServiceBridge } from './service-bridge.ts';
import type { LocalNetworks, NetworkSlot } from './local-network.ts';
import type { LaunchedProcess } from './launcher.ts';
import type { WorkspaceDisk } from './workspace-disk.ts';
import type { Scratch } from './scratch.ts';
import { detachBootMounts, type RootPlan, type SandboxIdentity } from './sandbox-root.ts';
import { LocalTerminal } from './local-terminal.ts';
import { SUPERVISOR_IN_SANDBOX } from './supervisor-binary.ts';
import {
  SupervisorChannel,
  T_ERROR,
  T_EXEC,
  T_EXIT,
  T_KILL,
  T_KILLALL,
  T_KILLED,
  T_READY,
  T_STARTED,
  T_STDERR,
  T_STDOUT,
  T_TERMINAL,
} from './supervisor-channel.ts';
import {
  EXIT_KILLED,
  EXIT_TIMEOUT,
  type CreateSandboxOptions,
  type ExecOptions,
  type ExecResult,
  type RootChanges,
  type SandboxHandle,
  type SandboxTerminal,
  type SandboxUsage,
  type TerminalOptions,
} from '../runtime.ts';

const DEFAULT_CAPTURE = 1024 * 1024;
const DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

/** What a sandbox holds mounted on the host besides its namespaces. */
export interface SandboxMounts {
  disk: WorkspaceDisk | null;
  scratch: Scratch;
  /** the disk of a writable root's layer */
  root: WorkspaceDisk | null;
}

export function releaseMounts(mounts: { disk: WorkspaceDisk | null; scratch: Scratch | null; root: WorkspaceDisk | null }): Promise<unknown> {
  return Promise.all([mounts.disk?.release(), mounts.scratch?.release(), mounts.root?.release()]);
}

interface Pending {
  id: number;
  options: ExecOptions;
  started: number;
  stdout: Buffer[];
  stderr: Buffer[];
  captured: { stdout: number; stderr: number };
  truncated: { stdout: boolean; stderr: boolean };
  outputBytes: number;
  limit: number;
  timedOut: boolean;
  timer: NodeJS.Timeout | null;
  oomBefore: number;
  onStarted: (error: Error | null) => void;
  resolve: (result: ExecResult) => void;
  reject: (error: Error) => void;
}

export class LocalSandbox implements SandboxHandle {
  readonly runtime = 'local';
  id: string;
  readonly exited: Promise<void>;
  private readonly channel: SupervisorChannel;
  private readonly pending = new Map<number, Pending>();
  private readonly terminals = new Map<number, LocalTerminal>();
  private readonly killWaiters = new Map<number, () => void>();
  private env: Record<string, string>;
  private nextId = 1;
  private stderrText = '';
  private gone: Error | null = null;
  private destroying: Promise<void> | null = null;
  private readyResolve: (() => void) | null = null;
  private readyReject: ((err: Error) => void) | null = null;
  private cleaned = false;
  /** The way out to the service, when asked for (service-bridge.ts). */
  private bridge: Promise<ServiceBridge> | null = null;
  serviceReachable: Promise<void> = Promise.resolve();
  address: string | null = null;
  readonly networkReady: Promise<void> = Promise.resolve();
  /** aborted once the sandbox ends (destroyed, or on its own): what waits for it to come up stops waiting */
  private readonly ended = new AbortController();
  private named: Promise<void> = Promise.resolve();
  private network: { networks: LocalNetworks; slot: NetworkSlot } | null = null;
  writablePlaces: SandboxHandle['writablePlaces'];
  readonly user: SandboxHandle['user'];
  /** the overlay's upper layer of a writable image root (rootChanges) */
  upper: string | null = null;

  constructor(
    private readonly options: CreateSandboxOptions,
    identity: SandboxIdentity,
    private readonly child: LaunchedProcess,
    private readonly cgroup: SandboxCgroup,
    private readonly sandboxDir: string,
    private readonly mounts: SandboxMounts,
    readonly warnings: string[],
    private readonly logger: Logger | undefined,
  ) {
    this.id = options.id;
    this.env = this.baseEnv(options.env);
    this.writablePlaces = mounts.scratch.places;
    this.user = { inside: identity.user, uid: identity.uid, gid: identity.gid };
    const stdio = child.stdio as unknown as [null, null, Readable, Writable, Readable];
    this.channel = new SupervisorChannel(stdio[3], stdio[4], (type, id, payload) => this.onFrame(type, id, payload));
    stdio[2].on('data', (chunk: Buffer) => {
      if (this.stderrText.length < 4096) this.stderrText += chunk.toString('utf8');
    });
    this.exited = new Promise<void>((resolve) => {
      child.on('exit', (code, signal) => {
        const why = this.stderrText.trim() || `bwrap exited (${signal ?? code})`;
        this.fail(new Error(this.destroying ? 'sandbox destroyed' : `sandbox exited: ${why}`));
        if (!this.destroying) {
          this.logger?.warn({ sandbox_id: this.id, code, signal, stderr: this.stderrText.trim() }, 'sandbox exited on its own');
          void this.cleanup().finally(resolve);
        } else resolve();
      });
      child.on('error', (err) => this.fail(err));
    });
  }

  ready(timeoutMs: number): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`sandbox did not become ready within ${timeoutMs} ms`)), timeoutMs);
      this.readyResolve = () => {
        clearTimeout(timer);
        resolve();
      };
      this.readyReject = (err) => {
        clearTimeout(timer);
        reject(err);
      };
    });
  }

  private fail(error: Error): void {
    if (this.gone) return;
    this.gone = error;
    this.ended.abort();
    this.readyReject?.(new Error(`sandbox failed to start: ${this.stderrText.trim() || error.message}`));
    this.readyReject = this.readyResolve = null;
    for (const p of this.pending.values()) {
      if (p.timer) clearTimeout(p.timer);
      p.onStarted(error);
      p.reject(error);
    }
    this.pending.clear();
    for (const terminal of this.terminals.values()) terminal.gone(error);
    this.terminals.clear();
    for (const done of this.killWaiters.values()) done();
    this.killWaiters.clear();
  }

  private onFrame(type: number, id: number, payload: Buffer): void {
    if (type === T_READY) {
      this.readyResolve?.();
      this.readyResolve = this.readyReject = null;
      return;
    }
    if (type === T_KILLED) {
      this.killWaiters.get(id)?.();
      this.killWaiters.delete(id);
      return;
    }
    const terminal = this.terminals.get(id);
    if (terminal) return terminal.onFrame(type, payload);
    const p = this.pending.get(id);
    if (!p) return;
    if (type === T_STARTED) p.onStarted(null);
    else if (type === T_STDOUT || type === T_STDERR) {
      const stream = type === T_STDOUT ? 'stdout' : 'stderr';
      const copy = Buffer.from(payload);
      p.outputBytes += copy.length;
      const room = p.limit - p.captured[stream];
      if (room > 0) {
        (stream === 'stdout' ? p.stdout : p.stderr).push(room >= copy.length ? copy : copy.subarray(0, room));
        p.captured[stream] += Math.min(room, copy.length);
      }
      if (room < copy.length) p.truncated[stream] = true;
      try {
        p.options.onOutput?.(stream, copy);
      } catch (err) {
        this.logger?.warn({ sandbox_id: this.id, err }, 'onOutput threw');
      }
    } else if (type === T_EXIT) {
      this.finish(p, payload.readInt32LE(0), '');
    } else if (type === T_ERROR) {
      p.onStarted(null);
      this.finish(p, null, payload.toString('utf8'));
    }
  }

  private finish(p: Pending, status: number | null, error: string): void {
    this.pending.delete(p.id);
    if (p.timer) clearTimeout(p.timer);
    let exitCode: number;
    if (status === null) exitCode = 126;
    else if ((status & 0x7f) === 0) exitCode = (status >> 8) & 0xff;
    else exitCode = 128 + (status & 0x7f);
    const oomKilled = !p.timedOut && exitCode === EXIT_KILLED && this.cgroup.oomKills() > p.oomBefore;
    if (p.timedOut) exitCode = EXIT_TIMEOUT;
    const stderr = Buffer.concat(p.stderr).toString('utf8') + (error ? `sandbox: ${error}\n` : '');
    p.resolve({
      exitCode,
      stdout: Buffer.concat(p.stdout).toString('utf8'),
      stderr,
      durationMs: Math.round(performance.now() - p.started),
      timedOut: p.timedOut,
      oomKilled,
      outputBytes: p.outputBytes,
      truncated: p.truncated,
    });
  }

  private start(options: ExecOptions): { started: Promise<void>; done: Promise<ExecResult> } {
    if (this.gone || this.destroying) {
      const err = this.gone ?? new Error('sandbox destroyed');
      const started = Promise.reject(err);
      started.catch(() => {});
      return { started, done: Promise.reject(err) };
    }
    const env = { ...this.env, ...options.env };
    // Refused here, as exec would refuse it (exit 126), before it is sent to the supervisor. Commands
    // at once are bounded too: each holds up to twice maxCaptureBytes of output here.
    const commandProblem = commandSizeProblem(options.command);
    const envProblem = envSizeProblem(env);
    const busy = this.pending.size >= MAX_COMMANDS_AT_ONCE ? `${MAX_COMMANDS_AT_ONCE} commands are running in this sandbox already, the most at once` : null;
    if (commandProblem || envProblem || busy) {
      const stderr = `sandbox: ${commandProblem ? `the command ${commandProblem}` : envProblem ? `env: ${envProblem}` : busy}\n`;
      return {
        started: Promise.resolve(),
        done: Promise.resolve({
          exitCode: 126,
          stdout: '',
          stderr,
          durationMs: 0,
          timedOut: false,
          oomKilled: false,
          outputBytes: 0,
          truncated: { stdout: false, stderr: false },
        }),
      };
    }
    const id = this.nextId++;
    let onStarted!: (error: Error | null) => void;
    const started = new Promise<void>((resolve, reject) => {
      onStarted = (error) => (error ? reject(error) : resolve());
    });
    const done = new Promise<ExecResult>((resolve, reject) => {
      const p: Pending = {
        id,
        options,
        started: performance.now(),
        stdout: [],
        stderr: [],
        captured: { stdout: 0, stderr: 0 },
        truncated: { stdout: false, stderr: false },
        outputBytes: 0,
        limit: options.maxCaptureBytes ?? DEFAULT_CAPTURE,
        timedOut: false,
        timer: null,
        oomBefore: this.cgroup.oomKills(),
        onStarted,
        resolve,
        reject,
      };
      if (options.timeoutMs != null && options.timeoutMs > 0) {
        p.timer = setTimeout(() => {
          p.timedOut = true;
          this.channel.send(T_KILL, id);
        }, options.timeoutMs);
      }
      this.pending.set(id, p);
    });
    const parts = [options.command.replace(/\0/g, '')];
    for (const [key, value] of Object.entries(env)) {
      if (!key || key.includes('=') || key.includes('\0')) continue;
      parts.push(`${key}=${value.replace(/\0/g, '')}`);
    }
    this.channel.send(T_EXEC, id, Buffer.from(parts.join('\0'), 'utf8'));
    started.catch(() => {});
    return { started, done };
  }

  exec(options: ExecOptions): Promise<ExecResult> {
    return this.start(options).done;
  }

  async spawnBackground(options: ExecOptions): Promise<{ done: Promise<ExecResult> }> {
    const { started, done } = this.start(options);
    done.catch(() => {});
    await started;
    return { done };
  }

  openTerminal(options: TerminalOptions): Promise<SandboxTerminal> {
    if (this.gone || this.destroying) return Promise.reject(this.gone ?? new Error('sandbox destroyed'));
    const env = { ...this.env, ...options.env };
    const problem = envSizeProblem(env);
    if (problem) return Promise.reject(new Error(`env: ${problem}`));
    const id = this.nextId++;
    const terminal = new LocalTerminal((type, payload) => this.channel.send(type, id, payload), options);
    this.terminals.set(id, terminal);
    void terminal.exited.then(() => this.terminals.delete(id));
    this.channel.send(T_TERMINAL, id, LocalTerminal.request(options, env));
    return terminal.started;
  }

  killAll(): Promise<void> {
    if (this.gone) return Promise.resolve();
    const id = this.nextId++;
    return new Promise<void>((resolve) => {
      this.killWaiters.set(id, resolve);
      this.channel.send(T_KILLALL, id);
    });
  }

  processes(): { pidNamespace: number; supervisorPid: number } | null {
    // Read before any command of the agent runs: the supervisor is then the only `serve` in the group.
    for (const pid of this.cgroup.members()) {
      try {
        const [command, mode] = fs.readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
        if (command !== SUPERVISOR_IN_SANDBOX || mode !== 'serve') continue;
        const link = fs.readlinkSync(`/proc/${pid}/ns/pid`);
        return { pidNamespace: Number(/^pid:\[(\d+)\]$/.exec(link)![1]), supervisorPid: pid };
      } catch {
        // gone meanwhile
      }
    }
    return null;
  }

  async usage(): Promise<SandboxUsage> {
    return { memoryBytes: this.cgroup.memoryBytes(), pids: this.cgroup.pids(), oomKills: this.cgroup.oomKills(), pidsLimitHits: this.cgroup.pidsLimitHits() };
  }

  destroy(): Promise<void> {
    this.destroying ??= (async () => {
      this.fail(new Error('sandbox destroyed'));
      this.channel.end();
      await this.cgroup.killAll();
      if (this.child.exitCode === null && this.child.signalCode === null) {
        const timer = setTimeout(() => this.child.kill('SIGKILL'), 2000);
        await this.exited;
        clearTimeout(timer);
      }
      try {
        await this.cleanup();
      } finally {
        // Only at destroy, not when the sandbox ends on its own: the caller may still read the workspace.
        await releaseMounts(this.mounts);
      }
    })();
    return this.destroying;
  }

  private baseEnv(env: Record<string, string>): Record<string, string> {
    return { PATH: DEFAULT_PATH, HOME: '/tmp', LANG: 'C.UTF-8', HOSTNAME: this.options.hostname ?? this.options.id, ...env };
  }

  /** SandboxHandle.adopt: the environment, and the cgroups renamed after the sandbox. */
  async adopt(as: { id: string; env: Record<string, string> }): Promise<void> {
    const problem = envSizeProblem(as.env);
    if (problem) throw new Error(`env: ${problem}`);
    if (!/^[A-Za-z0-9_.-]+$/.test(as.id)) throw new Error(`invalid sandbox id: ${as.id}`);
    // Its directory keeps the warm name: a restart after a crash finds the groups by this file,
    // written first so that no crash leaves groups renamed and unnamed.
    await fs.promises.writeFile(path.join(this.sandboxDir, CGROUP_NAME_FILE), as.id);
    this.cgroup.rename(as.id);
    this.id = as.id;
    this.env = this.baseEnv(as.env);
  }

  /** Takes what the root plan made writable: what the agent writes to / is audited like /tmp (the file watch, the reconciliation). */
  adoptRoot(plan: RootPlan): void {
    this.upper = plan.upper;
    if (plan.layer) this.writablePlaces = [...this.writablePlaces, { at: '/', ...plan.layer }];
  }

  /** Takes the bridge to the service opening beside it (`serviceReachable` says when it listens); `opening` is aborted when this sandbox ends. */
  adoptBridge(bridge: Promise<ServiceBridge>, opening: AbortController): void {
    if (this.ended.signal.aborted) opening.abort();
    else this.ended.signal.addEventListener('abort', () => opening.abort(), { once: true });
    this.bridge = bridge;
    this.serviceReachable = this.bridge.then(() => undefined);
    this.serviceReachable.catch(() => {});
  }

  async rootChanges(): Promise<RootChanges | null> {
    if (!this.upper || !this.options.rootfs) return null;
    await this.killAll();
    const processes = this.processes();
    if (!processes) throw new Error(this.gone ? `sandbox ${this.id} is gone: ${this.gone.message}` : `sandbox ${this.id}: its supervisor is not running`);
    return {
      upper: this.upper,
      lower: this.options.rootfs,
      merged: `/proc/${processes.supervisorPid}/root`,
      idShift: this.user.inside === 'root' ? this.user.uid : 0,
    };
  }

  async openIngress(ports: number[] | 'all'): Promise<void> {
    if (!this.network) throw new Error('this sandbox has no network');
    await this.network.networks.openIngress(this.network.slot, ports);
  }

  /** The sandbox runs in the namespace `slot` made ahead: its network is ready from its start (and named after it a moment later). */
  attachNetwork(networks: LocalNetworks, slot: NetworkSlot, timeoutMs: number): void {
    this.network = { networks, slot };
    this.address = slot.sandboxAddress;
    // Packets flow from the start; the namespace's name goes once the sandbox holds it.
    this.named = pidInSandboxNetns(this.child.pid!, timeoutMs, this.ended.signal).then((pid) => networks.joined(slot, pid, this.id));
    this.named.catch(() => {});
  }

  private async cleanup(): Promise<void> {
    if (this.cleaned) return;
    this.cleaned = true;
    await this.bridge?.then(
      (b) => b.close(),
      () => undefined,
    );
    if (this.network) await this.named.catch(() => undefined).then(() => this.network!.networks.release(this.network!.slot, this.id));
    if (!(await this.cgroup.remove())) this.logger?.warn({ sandbox_id: this.id }, 'could not remove the sandbox cgroups');
    // Never through a mount: a launch killed before the sandbox took its root leaves them here.
    if (detachBootMounts(this.sandboxDir)) this.logger?.warn({ sandbox_id: this.id }, 'detached the boot mounts its launch left');
    await fs.promises.rm(this.sandboxDir, { recursive: true, force: true });
  }
}
