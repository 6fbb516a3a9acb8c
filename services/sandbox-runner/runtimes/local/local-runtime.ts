/**
 * The `local` runtime: each sandbox is one long-lived bubblewrap process (new mount, pid,
 * network, uts, ipc and cgroup namespaces) with a small supervisor inside
 * (services/sandbox-runner/runtimes/local/supervisor/supervisor.c); commands enter it over a framed protocol on two inherited
 * sockets instead of building a new sandbox each time. A terminal (openTerminal) is a shell on
 * a pseudo-terminal started the same way, with everything below that a command gets, and its
 * pty as its controlling terminal (local-terminal.ts).
 *
 * What a command gets:
 *  - `sh -c COMMAND` in /workspace (the workspace, bind-mounted read-write), as the sandbox uid
 *    (65534 by default: a real, unprivileged host uid, so files it creates in the workspace are
 *    owned by it), no supplementary groups, empty capability sets, no_new_privs, a seccomp
 *    filter (see supervisor.c), its own session and process group;
 *  - a read-only root: the image's root filesystem, or (rootfs null) a tmpfs with read-only
 *    binds of the host's /usr, /etc, /bin, /sbin, /lib* only; private /tmp, /dev/shm and /run;
 *    its own /proc (only the sandbox's processes) with kcore, keys, timer_list, sched_debug and
 *    friends masked; a minimal /dev;
 *  - only a loopback interface: no route out, no way to the host's loopback services;
 *  - cgroup limits on memory (+swap), pids and CPU; the OOM killer and pids.max act inside
 *    the sandbox only, and both are reported (oomKilled, usage()).
 * That is the default user, nobody; as root inside (CreateSandboxOptions.user), a command is uid 0
 * of a user namespace of the sandbox's own, with a few capabilities there and, by default, a
 * writable root (an overlay discarded at destroy): sandbox-root.ts.
 * Disk: /tmp and /dev/shm are a tmpfs mounted on the host (scratch.ts: the file audit sees them),
 * as large as the memory limit and charged to it. The workspace is a filesystem
 * of its own, `diskBytes` large (workspace-disk.ts: a loop-mounted ext4 file), where the host has
 * loop devices; elsewhere its size is not enforced (a warning on the handle says so).
 */
import { spawn, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import type { Readable, Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import type { Logger } from '../../../kernel/logger.ts';
import { commandSizeProblem, envSizeProblem, MAX_COMMANDS_AT_ONCE } from '../../../domain/sandbox-limits.ts';
import { SandboxCgroup, cgroupLayout, sweepStaleCgroups } from './cgroups.ts';
import { ServiceBridge, pidInSandboxNetns } from './service-bridge.ts';
import { LocalNetworks, type GatewayPorts, type NetworkSlot, type RefusedUdp } from './local-network.ts';
import { Launcher, type LaunchedProcess } from './launcher.ts';
import { diskTools, WorkspaceDisks, type WorkspaceDisk } from './workspace-disk.ts';
import { Scratches, type Scratch } from './scratch.ts';
import { hostSystemBinds } from './host-tools.ts';
import { detachBootMounts, ROOT_IDS_DEFAULT, rootIdsProblem, rootPlan, sandboxIdentity, type RootPlan, type SandboxIdentity } from './sandbox-root.ts';
import { LocalTerminal, T_TERMINAL } from './local-terminal.ts';
import {
  EXIT_KILLED,
  EXIT_TIMEOUT,
  TRUST_IN_SANDBOX,
  type CreateSandboxOptions,
  type ExecOptions,
  type ExecResult,
  type RootChanges,
  type Runtime,
  type SandboxHandle,
  type SandboxTerminal,
  type SandboxUsage,
  type TerminalOptions,
} from '../runtime.ts';

export interface LocalRuntimeOptions {
  /** cached supervisor binary, per-sandbox files (hosts) */
  stateDir: string;
  /** host uid the commands run as (default 65534, nobody) */
  sandboxUid?: number;
  /** host gid the commands run as (default 65534, nogroup) */
  sandboxGid?: number;
  /** host ids of root inside (CreateSandboxOptions.user 'root'): ids 0..count-1 of its user namespace are first.. (default sandbox-root.ts ROOT_IDS_DEFAULT) */
  rootIds?: { first: number; count: number };
  /** cgroup directory under each hierarchy's root that holds the sandboxes' groups (default svc) */
  cgroupParent?: string;
  /** the bwrap executable (default: bwrap on PATH) */
  bwrap?: string;
  /** the supervisor's C source (default: services/sandbox-runner/runtimes/local/supervisor/supervisor.c of this repository) */
  supervisorSource?: string;
  /** how long a sandbox may take to come up (default 15 s) */
  bootTimeoutMs?: number;
  /** workspace size when `resources.diskBytes` is null (default 1 GiB) */
  diskDefaultBytes?: number;
  /** largest `resources.diskBytes` a sandbox may ask for (default 16 GiB) */
  diskMaxBytes?: number;
  logger?: Logger;
  /** sandbox networks (CreateSandboxOptions.network): the runner's id (names its links and table), the address range, the egress gateway's ports */
  network?: { runnerId: string; range: string; ports: GatewayPorts; onRefused?: RefusedUdp };
}

/** Where Debian-like roots keep the system's CA bundle (the sandbox's gets the deployment's CA added). */
const SYSTEM_TRUST_BUNDLE = 'etc/ssl/certs/ca-certificates.crt';
/** Where update-ca-certificates finds local authorities: in a writable root, the bundles it makes keep the deployment's CA. */
const LOCAL_TRUST_AUTHORITY = 'usr/local/share/ca-certificates/svc-egress-ca.crt';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const DEFAULT_SOURCE = path.resolve(HERE, './supervisor/supervisor.c');
const DEFAULT_CAPTURE = 1024 * 1024;
const SUPERVISOR_IN_SANDBOX = '/run/svc/supervisor';
/** /proc files hidden behind /dev/null and directories behind an empty tmpfs (as Docker and runc do) */
const PROC_MASKED_FILES = ['kcore', 'keys', 'key-users', 'timer_list', 'sched_debug', 'latency_stats', 'kallsyms', 'kmsg', 'config.gz', 'sysrq-trigger', 'vmallocinfo', 'pagetypeinfo', 'slabinfo'];
const PROC_MASKED_DIRS = ['acpi', 'scsi', 'asound', 'driver', 'fs', 'tty'];
const DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

// frame types, as in supervisor.c
const T_EXEC = 1;
const T_KILL = 2;
const T_KILLALL = 3;
const T_READY = 10;
const T_STARTED = 11;
const T_STDOUT = 12;
const T_STDERR = 13;
const T_EXIT = 14;
const T_ERROR = 15;
const T_KILLED = 16;

export class LocalRuntime implements Runtime {
  readonly name = 'local' as const;
  private readonly stateDir: string;
  private readonly uid: number;
  private readonly gid: number;
  private readonly cgroupParent: string;
  private readonly bwrap: string;
  private readonly launcher = new Launcher();
  private readonly source: string;
  private readonly bootTimeoutMs: number;
  private readonly diskDefaultBytes: number;
  private readonly diskMaxBytes: number;
  /** the workspaces' disks, or why workspaces get no size limit here */
  private disks: WorkspaceDisks | string | null = null;
  /** the disks of writable roots' layers, or why they have none here */
  private rootDisks: WorkspaceDisks | string | null = null;
  private readonly rootIds: { first: number; count: number };
  private scratchMounts: Scratches | null = null;
  private readonly logger: Logger | undefined;
  private supervisor: Promise<string> | null = null;
  private availability: Promise<string | null> | null = null;
  private networks: Promise<LocalNetworks> | null = null;
  private readonly trust = new Map<string, Promise<{ bundle: string; authority: string; overSystem: boolean }>>();

  constructor(private readonly options: LocalRuntimeOptions) {
    this.stateDir = path.resolve(options.stateDir);
    this.uid = options.sandboxUid ?? 65534;
    this.gid = options.sandboxGid ?? 65534;
    this.cgroupParent = options.cgroupParent ?? 'svc';
    this.bwrap = options.bwrap ?? 'bwrap';
    this.source = options.supervisorSource ?? DEFAULT_SOURCE;
    this.bootTimeoutMs = options.bootTimeoutMs ?? 15_000;
    this.diskDefaultBytes = options.diskDefaultBytes ?? 1024 ** 3;
    this.diskMaxBytes = options.diskMaxBytes ?? 16 * 1024 ** 3;
    this.logger = options.logger;
    this.rootIds = options.rootIds ?? ROOT_IDS_DEFAULT;
    const idsProblem = rootIdsProblem(this.rootIds, { uid: this.uid, gid: this.gid });
    if (idsProblem) throw new Error(idsProblem);
  }


  available(): Promise<string | null> {
    this.availability ??= this.check();
    return this.availability;
  }

  private async check(): Promise<string | null> {
    if (process.platform !== 'linux') return 'the local runtime needs Linux';
    if (process.getuid?.() !== 0) return 'the local runtime needs root (cgroups and a dedicated sandbox uid)';
    const version = spawnSync(this.bwrap, ['--version'], { encoding: 'utf8' });
    if (version.error || version.status !== 0) return `bubblewrap is not installed (apt-get install bubblewrap): ${version.error?.message ?? version.stderr.trim()}`;
    const trial = spawnSync(this.bwrap, ['--unshare-ipc', '--unshare-pid', '--unshare-net', '--unshare-uts', '--die-with-parent', ...hostSystemBinds(), '--proc', '/proc', '--dev', '/dev', '--', '/bin/true'], { encoding: 'utf8', timeout: 10_000 });
    if (trial.error || trial.status !== 0) return `bubblewrap cannot create namespaces here: ${(trial.error?.message ?? trial.stderr).trim()}`;
    if (!cgroupLayout()) return 'no memory and pids cgroup controllers are mounted under /sys/fs/cgroup';
    const swept = sweepStaleCgroups(this.cgroupParent);
    if (swept) this.logger?.info({ groups: swept }, 'removed the cgroups of sandboxes left by a previous run');
    const disks = this.workspaceDisks();
    if (typeof disks === 'string') this.logger?.warn({ reason: disks }, 'workspaces get no disk limit on this host');
    const stale = typeof disks === 'string' ? 0 : disks.sweep();
    if (stale) this.logger?.info({ disks: stale }, 'removed the workspace disks of sandboxes left by a previous run');
    // Boot mounts first: an overlay left mounted holds its layer's disk.
    const roots = detachBootMounts(path.join(this.stateDir, 'sandboxes'));
    const rootDisks = this.layerDisks();
    const staleRoots = roots + (typeof rootDisks === 'string' ? 0 : rootDisks.sweep());
    if (staleRoots) this.logger?.info({ roots: staleRoots }, 'removed the writable roots of sandboxes left by a previous run');
    try {
      const scratch = this.scratches().sweep();
      if (scratch) this.logger?.info({ scratch }, 'removed the /tmp of sandboxes left by a previous run');
    } catch (err) {
      return (err as Error).message;
    }
    try {
      await this.supervisorBinary();
    } catch (err) {
      return (err as Error).message;
    }
    this.launcher.warm();
    return null;
  }

  /** The supervisor, compiled from its source on first use and cached by the source's hash. */
  supervisorBinary(): Promise<string> {
    this.supervisor ??= this.buildSupervisor().catch((err: unknown) => {
      this.supervisor = null;
      throw err;
    });
    return this.supervisor;
  }

  private async buildSupervisor(): Promise<string> {
    const source = await fs.promises.readFile(this.source);
    const hash = createHash('sha256').update(source).digest('hex').slice(0, 16);
    const binDir = path.join(this.stateDir, 'bin');
    const binary = path.join(binDir, `supervisor-${hash}`);
    if (fs.existsSync(binary)) return binary;
    await fs.promises.mkdir(binDir, { recursive: true });
    const tmp = `${binary}.${process.pid}.tmp`;
    const result = await run('gcc', ['-O2', '-static', '-o', tmp, this.source]);
    if (result.code !== 0) throw new Error(`cannot build the sandbox supervisor (apt-get install gcc libc6-dev): ${result.stderr.trim() || result.error}`);
    await fs.promises.chmod(tmp, 0o755);
    await fs.promises.rename(tmp, binary);
    this.logger?.info({ binary }, 'built the sandbox supervisor');
    return binary;
  }

  async close(): Promise<void> {
    if (this.disks !== null && typeof this.disks !== 'string') await this.disks.close();
    if (this.rootDisks !== null && typeof this.rootDisks !== 'string') await this.rootDisks.close();
    await this.scratchMounts?.close();
    if (this.networks) await (await this.networks).close();
  }

  /** The runner's sandbox networks, its nftables table installed on first use. */
  private sandboxNetworks(): Promise<LocalNetworks> {
    const options = this.options.network;
    if (!options) return Promise.reject(new Error('this runtime was started without sandbox networks'));
    this.networks ??= (async () => {
      const networks = new LocalNetworks(this.launcher, { ...options, stateDir: path.join(this.stateDir, 'network') });
      await networks.start();
      networks.refill();
      return networks;
    })();
    this.networks.catch(() => (this.networks = null));
    return this.networks;
  }

  private scratches(): Scratches {
    this.scratchMounts ??= new Scratches({ dir: path.join(this.stateDir, 'scratch'), launcher: this.launcher });
    return this.scratchMounts;
  }

  private workspaceDisks(): WorkspaceDisks | string {
    if (this.disks === null) {
      const tools = diskTools();
      this.disks = typeof tools === 'string' ? tools : new WorkspaceDisks({ dir: path.join(this.stateDir, 'disks'), defaultBytes: this.diskDefaultBytes, uid: this.uid, gid: this.gid, tools, launcher: this.launcher });
    }
    return this.disks;
  }

  /** The disks of writable roots' layers (root-owned: the layer's directories get their owners), made like the workspaces'. */
  private layerDisks(): WorkspaceDisks | string {
    if (this.rootDisks === null) {
      const tools = diskTools();
      this.rootDisks = typeof tools === 'string' ? tools : new WorkspaceDisks({ dir: path.join(this.stateDir, 'root-disks'), defaultBytes: this.diskDefaultBytes, uid: 0, gid: 0, tools, launcher: this.launcher });
    }
    return this.rootDisks;
  }

  /** The size of a disk asked for (null: the default), refused past SVC_SANDBOX_DISK_MAX. */
  private diskBytes(asked: number | null | undefined): number {
    const bytes = asked ?? this.diskDefaultBytes;
    if (bytes > this.diskMaxBytes) throw new Error(`resources.disk: ${bytes} bytes is more than this server allows a sandbox (${this.diskMaxBytes} bytes, SVC_SANDBOX_DISK_MAX)`);
    return bytes;
  }

  /** Runtime.disk: one of the root-owned disks (the writable roots' kind), its spare made again after. */
  async disk(name: string, bytes: number | null): Promise<WorkspaceDisk | string> {
    const disks = this.layerDisks();
    if (typeof disks === 'string') return disks;
    try {
      return await disks.take(name.replace(/[^A-Za-z0-9_.-]/g, '_'), this.diskBytes(bytes));
    } finally {
      disks.refill();
    }
  }

  /** The workspace's disk, the sandbox's /tmp and a writable root's disk, side by side (each is usually a spare made ahead). */
  private async takeMounts(options: CreateSandboxOptions, workspace: string, diskBytes: number, identity: SandboxIdentity, warnings: string[]): Promise<SandboxMounts> {
    const disks = this.workspaceDisks();
    if (typeof disks === 'string') warnings.push(`disk limit not enforced on the workspace (${disks}); /tmp is a tmpfs bounded by the memory limit`);
    const rootDisks = identity.writableRoot ? this.layerDisks() : null;
    const taken = await Promise.allSettled([
      typeof disks === 'string' ? null : disks.mount(options.id, workspace, diskBytes),
      this.scratches().take(options.resources.memoryBytes),
      rootDisks === null || typeof rootDisks === 'string' ? null : rootDisks.take(options.id, diskBytes),
    ] as const);
    const mounts = { disk: settled(taken[0]), scratch: settled(taken[1]), root: settled(taken[2]) };
    const failed = taken.find((m) => m.status === 'rejected');
    if (failed || !mounts.scratch) {
      await releaseMounts(mounts);
      throw failed?.reason;
    }
    return { ...mounts, scratch: mounts.scratch };
  }

  /** An empty host directory for a writable root's changes: on a disk of `bytes`, else (no loop devices) in the scratch, with a warning. */
  private async rootLayer(disk: WorkspaceDisk | null, scratch: Scratch, warnings: string[]): Promise<string> {
    if (disk) return disk.at;
    warnings.push(`the writable root's changes are kept in memory (${this.layerDisks()}): bounded by the memory limit, not the disk limit`);
    return scratch.aside('root');
  }

  async create(options: CreateSandboxOptions): Promise<SandboxHandle> {
    if (!/^[A-Za-z0-9_.-]+$/.test(options.id)) throw new Error(`invalid sandbox id: ${options.id}`);
    const envProblem = envSizeProblem(options.env);
    if (envProblem) throw new Error(`env: ${envProblem}`);
    const diskBytes = this.diskBytes(options.resources.diskBytes);
    const supervisor = await this.supervisorBinary();
    const workspace = path.resolve(options.workspace);
    const readOnlyMounts = (options.readOnlyMounts ?? []).map((m) => ({ host: path.resolve(m.host), sandbox: m.sandbox }));
    await fs.promises.mkdir(workspace, { recursive: true });

    const sandboxDir = path.join(this.stateDir, 'sandboxes', options.id);
    await fs.promises.mkdir(sandboxDir, { recursive: true });
    const hostsFile = path.join(sandboxDir, 'hosts');
    await fs.promises.writeFile(hostsFile, hostsText(options.hostname ?? options.id, options.hosts ?? {}));
    const network = options.network ? await this.networkFiles(options) : null;
    const identity = sandboxIdentity(options, { uid: this.uid, gid: this.gid }, this.rootIds);

    const warnings: string[] = [];
    const mounts = await this.takeMounts(options, workspace, diskBytes, identity, warnings);
    let cgroup: SandboxCgroup;
    let plan: RootPlan;
    try {
      // The workspace's tree is on its disk, which may still be aside for the launch to move.
      await chownTree(mounts.disk?.movingTo ? mounts.disk.at : workspace, identity.uid, identity.gid, new Set(readOnlyMounts.map((m) => m.host)));
      const layer = identity.writableRoot ? await this.rootLayer(mounts.root, mounts.scratch, warnings) : null;
      const systemTrust = network?.systemTrust;
      const seed = systemTrust ? [{ at: SYSTEM_TRUST_BUNDLE, from: systemTrust.bundle }, { at: LOCAL_TRUST_AUTHORITY, from: systemTrust.authority }] : [];
      plan = await rootPlan(options, identity, { sandboxDir, layer, readOnlyMounts: readOnlyMounts.map((m) => m.sandbox), hostSystem: () => hostSystemBinds(), rootIds: this.rootIds, seed });
      // The system's bundle with the deployment's CA: in the writable root's layer (seed), else bound over the root's.
      if (systemTrust && !plan.seeded) network.mounts.push({ host: systemTrust.bundle, sandbox: `/${SYSTEM_TRUST_BUNDLE}` });
      cgroup = SandboxCgroup.create(this.cgroupParent, options.id, options.resources);
    } catch (err) {
      await releaseMounts(mounts);
      if (network) await network.networks.release(network.slot);
      throw err;
    }
    warnings.push(...cgroup.warnings);

    const args = this.bwrapArgs(options, identity, plan, workspace, readOnlyMounts, supervisor, hostsFile, mounts.scratch, network?.mounts ?? []);
    let child: LaunchedProcess;
    // The bridge's forwarder stays out of the sandbox's cgroups: it is not the agent's, and a
    // fork bomb must not take its pids. Asked of the launcher right after the sandbox, it comes
    // up while the supervisor boots.
    const bridging = new AbortController();
    let bridge: Promise<ServiceBridge> | null = null;
    try {
      // Through the launcher: a fork of this (large) process would cost tens of milliseconds.
      // The arguments go over fd 5 (`--args`, written by the launcher as it starts it), so the sandbox's pid 1 does not show host paths.
      // Root's network namespace is made by the launch, which lets it bind low ports there.
      const netns = network ? ['--netns', network.slot.namespace] : identity.user === 'root' ? ['--new-netns'] : [];
      const move = mounts.disk?.movingTo ? ['--move', mounts.disk.at, mounts.disk.movingTo] : [];
      child = this.launcher.launch(supervisor, ['launch', cgroup.joinFiles().join(','), ...netns, ...move, ...plan.launch, '--', this.bwrap, '--args', '5', '--', SUPERVISOR_IN_SANDBOX, 'serve', ...plan.serve], { fd5: args.map((a) => `${a}\0`).join('') });
      if (options.service) bridge = ServiceBridge.open(child, path.join(sandboxDir, 'service.sock'), options.service, this.launcher, supervisor, bridging.signal);
      bridge?.catch(() => {});
      await child.started;
    } catch (err) {
      bridging.abort();
      await bridge?.then((b) => b.close(), () => undefined);
      await cgroup.remove();
      await releaseMounts(mounts);
      if (network) await network.networks.release(network.slot);
      throw err;
    }
    const sandbox = new LocalSandbox(options, identity, child, cgroup, sandboxDir, mounts, warnings, this.logger);
    sandbox.adoptRoot(plan);
    if (bridge) sandbox.adoptBridge(bridge, bridging);
    try {
      if (network) sandbox.attachNetwork(network.networks, network.slot, this.bootTimeoutMs);
      await sandbox.ready(this.bootTimeoutMs);
      await mounts.disk?.moved();
    } catch (err) {
      await sandbox.destroy();
      throw err;
    } finally {
      // The next spares only now: their mkfs and mounts would hold up this create's own tools.
      this.refillSpares(mounts, options.resources.memoryBytes, network?.networks ?? null);
    }
    return sandbox;
  }

  /** Starts making the spares a create took (the workspace's disk, the root's, the scratch, the network). */
  private refillSpares(taken: SandboxMounts, memoryBytes: number, networks: LocalNetworks | null): void {
    const [disks, rootDisks] = [this.workspaceDisks(), this.layerDisks()];
    if (typeof disks !== 'string') disks.refill();
    if (taken.root && typeof rootDisks !== 'string') rootDisks.refill();
    this.scratches().refill(memoryBytes);
    networks?.refill();
  }

  /**
   * A network slot, and the files that make the gateway the sandbox's resolver and add the
   * deployment's CA to its trust store (over the system's bundle, where the root has one).
   */
  private async networkFiles(options: CreateSandboxOptions): Promise<{ networks: LocalNetworks; slot: NetworkSlot; mounts: Array<{ host: string; sandbox: string }>; systemTrust: { bundle: string; authority: string } | null }> {
    const networks = await this.sandboxNetworks();
    const slot = await networks.take();
    try {
      const trust = await this.trustFiles(options.rootfs ?? '/', options.network!.trust.trim());
      const mounts = [
        { host: slot.resolvConf, sandbox: '/etc/resolv.conf' },
        { host: trust.bundle, sandbox: TRUST_IN_SANDBOX.bundle },
        { host: trust.authority, sandbox: TRUST_IN_SANDBOX.authority },
      ];
      return { networks, slot, mounts, systemTrust: trust.overSystem ? trust : null };
    } catch (err) {
      await networks.release(slot);
      throw err;
    }
  }

  /** The root's system bundle plus the deployment's CA, and the CA alone: written once per root (and version of its bundle). */
  private trustFiles(root: string, trust: string): Promise<{ bundle: string; authority: string; overSystem: boolean }> {
    const stat = fs.lstatSync(path.join(root, SYSTEM_TRUST_BUNDLE), { throwIfNoEntry: false });
    const key = createHash('sha256').update(`${root}\0${stat?.size}\0${stat?.mtimeMs}\0${trust}`).digest('hex').slice(0, 16);
    let files = this.trust.get(key);
    if (!files) {
      files = (async () => {
        const dir = path.join(this.stateDir, 'trust');
        await fs.promises.mkdir(dir, { recursive: true });
        const system = await readInside(root, SYSTEM_TRUST_BUNDLE);
        const bundle = path.join(dir, `${key}.crt`);
        const authority = path.join(dir, `${key}.ca.pem`);
        await fs.promises.writeFile(bundle, `${system ?? ''}${system && !system.endsWith('\n') ? '\n' : ''}${trust}\n`, { mode: 0o644 });
        await fs.promises.writeFile(authority, `${trust}\n`, { mode: 0o644 });
        return { bundle, authority, overSystem: system !== null && stat?.isFile() === true };
      })();
      files.catch(() => this.trust.delete(key));
      this.trust.set(key, files);
    }
    return files;
  }

  private bwrapArgs(options: CreateSandboxOptions, identity: SandboxIdentity, plan: RootPlan, workspace: string, readOnlyMounts: Array<{ host: string; sandbox: string }>, supervisor: string, hostsFile: string, scratch: Scratch, networkMounts: Array<{ host: string; sandbox: string }>): string[] {
    const args = [
      '--unshare-ipc', '--unshare-pid', '--unshare-uts', '--unshare-cgroup-try',
      // A sandbox with a network starts in the namespace made for it (the supervisor's `launch --netns`), root in its own (`--new-netns`).
      ...(options.network || identity.user === 'root' ? [] : ['--unshare-net']),
      '--die-with-parent', '--new-session',
      '--hostname', options.hostname ?? options.id,
      // the supervisor keeps only what it needs to start commands as the sandbox uid and to kill them
      '--cap-drop', 'ALL', '--cap-add', 'CAP_SETUID', '--cap-add', 'CAP_SETGID', '--cap-add', 'CAP_SETPCAP', '--cap-add', 'CAP_KILL',
    ];
    args.push(...plan.bwrap);
    args.push('--ro-bind', hostsFile, '/etc/hosts');
    args.push('--proc', '/proc', '--dev', '/dev');
    for (const file of PROC_MASKED_FILES) if (fs.existsSync(`/proc/${file}`)) args.push('--ro-bind', '/dev/null', `/proc/${file}`);
    for (const dir of PROC_MASKED_DIRS) if (fs.existsSync(`/proc/${dir}`)) args.push('--perms', '0555', '--tmpfs', `/proc/${dir}`);
    for (const place of scratch.places) args.push('--bind', place.host, place.at);
    if (!plan.writable) args.push('--perms', '0755', '--tmpfs', '/run');
    args.push('--ro-bind', supervisor, SUPERVISOR_IN_SANDBOX);
    for (const mount of networkMounts) args.push('--ro-bind', mount.host, mount.sandbox);
    // Made by bwrap under the runner's umask: readable by the sandbox user only when said so.
    if (networkMounts.length > 0) args.push('--chmod', '0755', path.posix.dirname(TRUST_IN_SANDBOX.bundle));
    args.push('--bind', workspace, '/workspace');
    for (const mount of readOnlyMounts) args.push('--ro-bind', mount.host, mount.sandbox);
    if (!options.rootfs && !plan.writable) args.push('--remount-ro', '/');
    args.push('--chdir', '/workspace');
    return args;
  }
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

class LocalSandbox implements SandboxHandle {
  readonly runtime = 'local';
  id: string;
  readonly exited: Promise<void>;
  private readonly requests: Writable;
  private readonly pending = new Map<number, Pending>();
  private readonly terminals = new Map<number, LocalTerminal>();
  private readonly killWaiters = new Map<number, () => void>();
  private env: Record<string, string>;
  private nextId = 1;
  private buffer: Buffer = Buffer.alloc(0);
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
    this.requests = stdio[3];
    this.requests.on('error', () => {});
    stdio[4].on('data', (chunk: Buffer) => this.onData(chunk));
    stdio[4].on('error', () => {});
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

  private send(type: number, id: number, payload: Buffer = Buffer.alloc(0)): void {
    const header = Buffer.alloc(9);
    header.writeUInt32LE(payload.length + 5, 0);
    header.writeUInt8(type, 4);
    header.writeUInt32LE(id, 5);
    this.requests.write(payload.length ? Buffer.concat([header, payload]) : header);
  }

  private onData(chunk: Buffer): void {
    this.buffer = this.buffer.length ? Buffer.concat([this.buffer, chunk]) : chunk;
    let off = 0;
    while (this.buffer.length - off >= 4) {
      const len = this.buffer.readUInt32LE(off);
      if (this.buffer.length - off < 4 + len) break;
      const type = this.buffer.readUInt8(off + 4);
      const id = this.buffer.readUInt32LE(off + 5);
      this.onFrame(type, id, this.buffer.subarray(off + 9, off + 4 + len));
      off += 4 + len;
    }
    this.buffer = off === this.buffer.length ? Buffer.alloc(0) : this.buffer.subarray(off);
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
      return { started: Promise.resolve(), done: Promise.resolve({ exitCode: 126, stdout: '', stderr, durationMs: 0, timedOut: false, oomKilled: false, outputBytes: 0, truncated: { stdout: false, stderr: false } }) };
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
          this.send(T_KILL, id);
        }, options.timeoutMs);
      }
      this.pending.set(id, p);
    });
    const parts = [options.command.replace(/\0/g, '')];
    for (const [key, value] of Object.entries(env)) {
      if (!key || key.includes('=') || key.includes('\0')) continue;
      parts.push(`${key}=${value.replace(/\0/g, '')}`);
    }
    this.send(T_EXEC, id, Buffer.from(parts.join('\0'), 'utf8'));
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
    const terminal = new LocalTerminal((type, payload) => this.send(type, id, payload), options);
    this.terminals.set(id, terminal);
    void terminal.exited.then(() => this.terminals.delete(id));
    this.send(T_TERMINAL, id, LocalTerminal.request(options, env));
    return terminal.started;
  }

  killAll(): Promise<void> {
    if (this.gone) return Promise.resolve();
    const id = this.nextId++;
    return new Promise<void>((resolve) => {
      this.killWaiters.set(id, resolve);
      this.send(T_KILLALL, id);
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
      this.requests.end();
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
    return { upper: this.upper, lower: this.options.rootfs, merged: `/proc/${processes.supervisorPid}/root`, idShift: this.user.inside === 'root' ? this.user.uid : 0 };
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
    await this.bridge?.then((b) => b.close(), () => undefined);
    if (this.network) await this.named.catch(() => undefined).then(() => this.network!.networks.release(this.network!.slot, this.id));
    if (!(await this.cgroup.remove())) this.logger?.warn({ sandbox_id: this.id }, 'could not remove the sandbox cgroups');
    // Never through a mount: a launch killed before the sandbox took its root leaves them here.
    if (detachBootMounts(this.sandboxDir)) this.logger?.warn({ sandbox_id: this.id }, 'detached the boot mounts its launch left');
    await fs.promises.rm(this.sandboxDir, { recursive: true, force: true });
  }
}

/** What a sandbox holds mounted on the host besides its namespaces. */
interface SandboxMounts {
  disk: WorkspaceDisk | null;
  scratch: Scratch;
  /** the disk of a writable root's layer */
  root: WorkspaceDisk | null;
}

function releaseMounts(mounts: { disk: WorkspaceDisk | null; scratch: Scratch | null; root: WorkspaceDisk | null }): Promise<unknown> {
  return Promise.all([mounts.disk?.release(), mounts.scratch?.release(), mounts.root?.release()]);
}

function settled<T>(result: PromiseSettledResult<T>): T | null {
  return result.status === 'fulfilled' ? result.value : null;
}

/** A regular file of the root at `relative`, read only when nothing on the way leads out of the root (an image may plant links). */
async function readInside(root: string, relative: string): Promise<string | null> {
  const real = await fs.promises.realpath(path.join(root, relative)).catch(() => null);
  if (real === null || (root !== '/' && !real.startsWith(`${path.resolve(root)}/`))) return null;
  const stat = await fs.promises.lstat(real);
  return stat.isFile() && stat.size < 16 * 1024 ** 2 ? fs.promises.readFile(real, 'utf8') : null;
}

function hostsText(id: string, hosts: Record<string, string>): string {
  const lines = ['127.0.0.1\tlocalhost', '::1\tlocalhost ip6-localhost ip6-loopback', `127.0.1.1\t${id}`];
  for (const [name, ip] of Object.entries(hosts)) {
    if (/^[A-Za-z0-9_.:-]+$/.test(ip) && /^[A-Za-z0-9_.-]+$/.test(name)) lines.push(`${ip}\t${name}`);
  }
  return `${lines.join('\n')}\n`;
}

/** Gives the sandbox uid the workspace (without following links or entering the read-only mounts). */
async function chownTree(dir: string, uid: number, gid: number, skip: Set<string>): Promise<void> {
  const stat = await fs.promises.lstat(dir);
  if (stat.uid !== uid || stat.gid !== gid) await fs.promises.lchown(dir, uid, gid);
  if (!stat.isDirectory()) return;
  const entries = await fs.promises.readdir(dir, { withFileTypes: true });
  await Promise.all(
    entries.map(async (entry) => {
      const full = path.join(dir, entry.name);
      if (skip.has(full)) return;
      if (entry.isDirectory()) return chownTree(full, uid, gid, skip);
      const s = await fs.promises.lstat(full);
      if (s.uid !== uid || s.gid !== gid) await fs.promises.lchown(full, uid, gid);
    }),
  );
}

function run(command: string, args: string[]): Promise<{ code: number; stderr: string; error?: string }> {
  return new Promise((resolve) => {
    const child = spawn(command, args, { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString('utf8')));
    child.on('error', (err) => resolve({ code: -1, stderr, error: err.message }));
    child.on('close', (code) => resolve({ code: code ?? -1, stderr }));
  });
}
