/**
 * The jail of a sandbox's PostgreSQL server (postgres.ts's header, "Jail"): the server runs as
 * the host's `postgres` user inside bubblewrap, with settings for an ephemeral database, and is
 * reached over its unix socket only. Also the small process helpers the service and its
 * template share.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import pg from 'pg';
import { hostSystemBinds, inHostSystemDirs } from '../runtimes/local/host-tools.ts';

/** where the data and socket directories are inside the jail */
export const JAIL_DATA = '/run/pg/data';
export const JAIL_SOCKETS = '/run/pg/sock';
export const PORT = 5432;
const READY_TIMEOUT_MS = 30_000;
/** the host user the server runs as */
const POSTGRES_USER = 'postgres';

export async function connectOver(socketDir: string, user: string, password: string, database: string): Promise<pg.Client> {
  const client = new pg.Client({ host: socketDir, port: PORT, user, password, database, connectionTimeoutMillis: 10_000 });
  // A connection lost later (the server stopped) must not crash the runner; its queries fail.
  client.on('error', () => {});
  try {
    await client.connect();
  } catch (err) {
    await client.end().catch(() => {});
    throw err;
  }
  return client;
}

/** Settings of an ephemeral server (durability off, unix socket only, logical decoding on). */
export function serverSettings(memoryMb: number): string[] {
  const sharedBuffersMb = Math.max(16, Math.min(1024, Math.floor(memoryMb / 8)));
  return [
    `listen_addresses=`,
    `unix_socket_directories=${JAIL_SOCKETS}`,
    `port=${PORT}`,
    'fsync=off',
    'synchronous_commit=off',
    'full_page_writes=off',
    `shared_buffers=${sharedBuffersMb}MB`,
    `logical_decoding_work_mem=${Math.max(1, Math.min(64, Math.floor(memoryMb / 16)))}MB`,
    'max_connections=30',
    'wal_level=logical',
    'max_replication_slots=4',
    'max_wal_senders=0',
    'min_wal_size=2MB',
    // old segments are removed, not renamed into future ones (fewer files in the template)
    'wal_recycle=off',
    'max_wal_size=64MB',
    'dynamic_shared_memory_type=posix',
    'huge_pages=off',
    'jit=off',
    'TimeZone=UTC',
    'log_timezone=UTC',
    // tenant statements are not echoed into the runner's log
    'log_min_error_statement=panic',
  ];
}

/**
 * The bubblewrap arguments for a server on `dataDir` with sockets in `socketDir` (host paths),
 * running `program`: the host's system directories read-only (and the installation `program` is
 * in, when it is elsewhere), never the host's root, so nothing of the host's data (the runner's,
 * other sandboxes') is in sight even of the runner's superuser.
 */
function jailArgs(dataDir: string, socketDir: string, program: string): string[] {
  const installation = path.dirname(path.dirname(program));
  return [
    '--unshare-pid',
    '--unshare-ipc',
    '--unshare-net',
    '--unshare-uts',
    '--unshare-cgroup-try',
    '--die-with-parent',
    '--new-session',
    ...hostSystemBinds(),
    ...(inHostSystemDirs(program) ? [] : ['--ro-bind', installation, installation]),
    '--proc',
    '/proc',
    '--dev',
    '/dev',
    '--perms',
    '1777',
    '--tmpfs',
    '/dev/shm',
    '--perms',
    '1777',
    '--tmpfs',
    '/tmp',
    // the host paths sit in the runner's 0700 directories: mounted where the postgres user reaches them
    '--tmpfs',
    '/run',
    '--perms',
    '0755',
    '--dir',
    '/run/pg',
    '--bind',
    dataDir,
    JAIL_DATA,
    '--bind',
    socketDir,
    JAIL_SOCKETS,
    '--chdir',
    '/',
    '--',
    'setpriv',
    `--reuid=${postgresUser().uid}`,
    `--regid=${postgresUser().gid}`,
    '--clear-groups',
    '--inh-caps=-all',
    '--bounding-set=-all',
    '--no-new-privs',
    '--',
  ];
}

/** A directory the jailed postgres user owns. */
export async function makeOwnedDir(dir: string): Promise<void> {
  await fs.promises.mkdir(dir, { mode: 0o700 });
  const { uid, gid } = postgresUser();
  await fs.promises.chown(dir, uid, gid);
}

let postgresIds: { uid: number; gid: number } | null = null;

export function postgresUser(): { uid: number; gid: number } {
  if (postgresIds) return postgresIds;
  const line = fs
    .readFileSync('/etc/passwd', 'utf8')
    .split('\n')
    .find((l) => l.startsWith(`${POSTGRES_USER}:`));
  if (!line) throw new Error(`there is no ${POSTGRES_USER} user on this host (apt-get install postgresql creates it)`);
  const [, , uid, gid] = line.split(':');
  postgresIds = { uid: Number(uid), gid: Number(gid) };
  return postgresIds;
}

const JAIL_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

/** A PostgreSQL program in the jail, the cgroups joined first when given. */
export function spawnJailed(dataDir: string, socketDir: string, command: string[], cgroupJoin: string[] = []): ChildProcess {
  const bwrap = ['bwrap', ...jailArgs(dataDir, socketDir, command[0]!), ...command];
  // Joining the cgroups before exec'ing bwrap puts every later process of the server in them.
  // The shell writes 0 (itself, one thread) to each: see SandboxCgroup.joinFiles.
  const argv = cgroupJoin.length
    ? ['/bin/sh', '-c', 'while [ "$1" != -- ]; do echo 0 > "$1" || exit 97; shift; done; shift; exec "$@"', 'sh', ...cgroupJoin, '--', ...bwrap]
    : bwrap;
  // Nothing of the runner's environment (its secrets) goes in.
  return spawn(argv[0]!, argv.slice(1), { stdio: ['ignore', 'ignore', 'pipe'], env: { PATH: JAIL_PATH, LANG: 'C.UTF-8' } });
}

/** The jailed postmaster: ready once it accepts connections. */
export class JailedServer {
  readonly ready: Promise<void>;
  private readonly child: ChildProcess;
  private readonly exit: Promise<void>;
  private stderrTail = '';

  constructor(binDir: string, dataDir: string, socketDir: string, settings: string[], cgroupJoin: string[]) {
    const command = [path.join(binDir, 'postgres'), '-D', JAIL_DATA, ...settings.flatMap((s) => ['-c', s])];
    this.child = spawnJailed(dataDir, socketDir, command, cgroupJoin);
    this.exit = new Promise((resolve) => this.child.once('close', () => resolve()));
    this.ready = new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`not ready after ${READY_TIMEOUT_MS / 1000} s: ${this.stderrTail.trim()}`)), READY_TIMEOUT_MS);
      // Its log goes on being read (and dropped) so the server never blocks on a full pipe.
      this.child.stderr!.on('data', (chunk: Buffer) => {
        this.stderrTail = (this.stderrTail + chunk.toString('utf8')).slice(-4096);
        if (this.stderrTail.includes('database system is ready to accept connections')) {
          clearTimeout(timer);
          resolve();
        }
      });
      this.child.once('error', reject);
      void this.exit.then(() => {
        clearTimeout(timer);
        const status = this.child.exitCode === 97 ? 'could not join its cgroups' : `exited (${this.child.signalCode ?? this.child.exitCode})`;
        reject(new Error(`${status}: ${this.stderrTail.trim().split('\n').slice(-3).join(' | ')}`));
      });
    });
    this.ready.catch(() => {});
  }

  /** Fast shutdown (a clean checkpoint, for the template), then waits for the jail to go. */
  async shutdown(): Promise<void> {
    const postmaster = childPids(this.jailInitPid() ?? undefined)[0];
    if (postmaster) process.kill(postmaster, 'SIGINT');
    await this.exit;
  }

  /** Kills the jail's init: the kernel then kills every process in its pid namespace. */
  async kill(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    try {
      process.kill(this.jailInitPid() ?? this.child.pid!, 'SIGKILL');
    } catch {
      // already gone
    }
    // bwrap outside waits for its init, which the kernel reaps only once the namespace is empty.
    const timer = setTimeout(() => this.child.kill('SIGKILL'), 5_000);
    await this.exit;
    clearTimeout(timer);
  }

  private jailInitPid(): number | null {
    return childPids(this.child.pid)[0] ?? null;
  }
}

function childPids(pid: number | undefined): number[] {
  if (!pid) return [];
  try {
    return fs.readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim().split(/\s+/).filter(Boolean).map(Number);
  } catch {
    return [];
  }
}

/** A program's standard output; rejects with its stderr when it fails. */
export async function runTool(command: string, args: string[], env: NodeJS.ProcessEnv = process.env): Promise<Buffer> {
  const child = spawn(command, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
  const chunks: Buffer[] = [];
  child.stdout!.on('data', (chunk: Buffer) => chunks.push(chunk));
  await exited(child, path.basename(command));
  return Buffer.concat(chunks);
}

/** Resolves when the child exits 0, rejects with its stderr otherwise. */
export function exited(child: ChildProcess, what: string): Promise<void> {
  let stderr = '';
  child.stderr?.on('data', (chunk: Buffer) => (stderr = (stderr + chunk.toString('utf8')).slice(-2048)));
  return new Promise((resolve, reject) => {
    child.once('error', (err) => reject(new Error(`${what}: ${err.message}`)));
    child.once('close', (code, signal) => (code === 0 ? resolve() : reject(new Error(`${what} failed (${signal ?? code}): ${stderr.trim()}`))));
  });
}
