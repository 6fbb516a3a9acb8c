/**
 * A sandbox's PostgreSQL backing service: one server per sandbox, started in a fraction of a
 * second from a cached template, jailed, with an audit of the writes the database committed.
 *
 * Start. `initdb` runs once per server version, init settings and spec names (database, user)
 * into a template under `cacheDir` (built in a temporary directory and renamed into place, so
 * concurrent first starts, in this process or another, never see half a template). The
 * template already holds the roles, the database (alone: no postgres, template0/1), the
 * unlogged-table guard and the replication slot. A start takes a spare copy of its data
 * directory made in the background (or copies it), starts the server with settings for an
 * ephemeral database (no fsync, small buffers, unix socket only) and gives the three roles
 * fresh random passwords:
 *   - `svc_superuser`, used by the runner alone (setup, the slot, pg_dump), never for tenant SQL;
 *   - the spec's user, the agent's role: owner of the public schema, with CREATE and TEMP on the
 *     database (which the superuser owns: an owner's ALTER DATABASE SET would reach the grader's
 *     sessions), not a superuser, cannot create roles or databases, no replication, no
 *     BYPASSRLS; fixtures run as this role;
 *   - `svc_grader`, the `sql` invariant's role: read-only (pg_read_all_data, BYPASSRLS, reads in a
 *     READ ONLY transaction).
 * Every connection arrives over the unix socket, so scram-sha-256 passwords are what tell the
 * roles apart.
 *
 * Jail. The server runs as the host's `postgres` user (no capabilities, no_new_privs) inside
 * bubblewrap: its own mount, pid, ipc, uts and network namespaces, the host's system directories
 * read-only (none of the host's data), only its data and socket directories writable, its own /tmp, /run and /dev/shm. Even a
 * superuser statement (COPY ... TO PROGRAM) stays inside. It dies with the runner
 * (--die-with-parent), and stop() kills the namespace's init, which takes every process of the
 * server with it.
 *
 * Audit (auditWrites; postgres-write-audit.ts). The logical replication slot (test_decoding) sees exactly the rows that
 * transactions committed, trigger-written rows included; it is read every 250 ms while writes
 * come (every second when idle) and on flushWrites(), each read bounded, and turned into one
 * DbWrite per transaction, table and operation (consecutive single-table transactions of the
 * same kind are merged, with `transactions` counting them). Not recorded: temporary tables
 * (not in the write-ahead log the slot reads) and sequence values. Large objects (a catalog the
 * slot does not decode) cannot be made. Unlogged tables are not in it
 * either, so creating one (or ALTER TABLE ... SET UNLOGGED) is refused. DDL changes no row the
 * slot shows (a table rewrite, a view where a table was): event triggers put each command in the
 * slot as a message, a DbWrite with operation 'ddl'. Rolled-back writes are
 * never in the slot: observeConnection() watches the gateway's connections for them
 * (postgres-wire.ts) and reports them with `rolled_back: true`. Nothing is reported before
 * startAudit(), and the writes committed before it (fixtures, setup) never are.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import pg from 'pg';
import { readResolvable, refuseReplaced, type Resolvable } from './postgres-pins.ts';
import { PgWireObserver } from './postgres-wire.ts';
import { type DbWrite, DDL_PREFIX, lastResult, SLOT, WriteAudit } from './postgres-write-audit.ts';
import { hostSystemBinds, inHostSystemDirs } from '../runtimes/local/host-tools.ts';

export interface PostgresOptions {
  /** service name (for messages) */
  name: string;
  /** the spec's database and user (the agent's role) */
  database: string;
  user: string;
  /** the agent role's password (default: a random one); the runner may need it before the start ends */
  password?: string;
  /** the spec's major version: selects /usr/lib/postgresql/<version>/bin (default: the newest installed) */
  version?: number | null;
  /** a private directory for this service, created here (0700) and removed by stop() */
  root: string;
  /** where initialised templates are cached (shared by the runner's sandboxes, kept across restarts) */
  cacheDir: string;
  /**
   * where the data directory is made, not existing yet (default: `data` in `root`): on a disk of
   * the sandbox's own, what the agent stores cannot fill the host's. Left for its owner to remove.
   */
  dataDir?: string;
  /** PostgreSQL's bin directory (default: from `version`); when `version` is given too, they must agree */
  binDir?: string;
  /** audit.db_writes */
  auditWrites: boolean;
  onWrite?: (write: DbWrite) => void;
  /** the files of its cgroups the server joins by before it starts (its every process is in them; SandboxCgroup.joinFiles) */
  cgroupJoin?: string[];
  /** sizes the server's memory (shared buffers, decoding memory); default 128 */
  memoryMb?: number;
  /** aborting stops a start under way (the start rejects, nothing is left behind) */
  signal?: AbortSignal;
}

export interface ConnectionObserver {
  fromClient(chunk: Buffer): void;
  fromServer(chunk: Buffer): void;
  close(): void;
}

const SUPERUSER = 'svc_superuser';
const GRADER = 'svc_grader';
/** where the data and socket directories are inside the jail */
const JAIL_DATA = '/run/pg/data';
const JAIL_SOCKETS = '/run/pg/sock';
const PORT = 5432;
const READY_TIMEOUT_MS = 30_000;
/** How long the `sql` invariant's query may run. */
const GRADER_TIMEOUT_MS = 60_000;
/** the host user the server runs as */
const POSTGRES_USER = 'postgres';

export class PostgresService {
  readonly port = PORT;
  readonly socketPath: string;
  readonly credentials: { user: string; password: string; database: string };
  private readonly socketDir: string;
  private readonly superuserPassword = randomPassword();
  private readonly graderPassword = randomPassword();
  private server: JailedServer | null = null;
  /** the template copy under way, killed by a stop() meanwhile */
  private copying: { child: ChildProcess; done: Promise<void> } | null = null;
  private audit: WriteAudit | null = null;
  /** what names resolved to when the sandbox became ready (startAudit), for queryFirst */
  private ready: Resolvable | null = null;
  private stopping: Promise<void> | null = null;

  private constructor(private readonly options: PostgresOptions, private readonly root: string, private readonly binDir: string) {
    this.socketDir = path.join(root, 'sock');
    this.socketPath = path.join(this.socketDir, `.s.PGSQL.${PORT}`);
    this.credentials = { user: options.user, password: options.password ?? randomPassword(), database: options.database };
  }

  /** Waits for the template copies made in the background (before removing cacheDir, say). */
  static async settle(): Promise<void> {
    await Promise.all(refilling.values());
  }

  static async start(options: PostgresOptions): Promise<PostgresService> {
    let service: PostgresService | null = null;
    const abort = (): void => void service?.stop();
    options.signal?.addEventListener('abort', abort, { once: true });
    try {
      checkNames(options);
      const binDir = options.binDir ?? installedBinDir(options.version ?? null);
      const template = await templateFor(binDir, path.resolve(options.cacheDir), { database: options.database, user: options.user });
      if (options.version && template.major !== options.version) throw new Error(`PostgreSQL ${options.version} was asked for, but ${binDir} is PostgreSQL ${template.major}`);
      const root = path.resolve(options.root);
      await fs.promises.mkdir(path.dirname(root), { recursive: true });
      await fs.promises.mkdir(root, { mode: 0o700 }).catch((err: NodeJS.ErrnoException) => {
        throw new Error(`cannot create ${root}: ${err.code === 'EEXIST' ? 'it already exists' : err.message}`);
      });
      service = new PostgresService(options, root, binDir);
      if (options.signal?.aborted) throw new Error('aborted');
      await service.boot(template);
      service.stillStarting();
      return service;
    } catch (err) {
      await service?.stop();
      const why = options.signal?.aborted ? 'stopped while starting' : (err as Error).message;
      throw new Error(`${options.name}: PostgreSQL did not start: ${why}`);
    } finally {
      options.signal?.removeEventListener('abort', abort);
    }
  }

  private async boot(template: Template): Promise<void> {
    const { user, database } = this.options;
    const dataDir = this.options.dataDir ?? path.join(this.root, 'data');
    if (!(await takeSpareCopy(template, dataDir))) {
      // cp -a keeps the postgres user's ownership and modes, which the server insists on.
      const copy = spawn('cp', ['-a', template.dataDir, dataDir], { stdio: ['ignore', 'ignore', 'pipe'] });
      this.copying = { child: copy, done: exited(copy, 'copying the template') };
      await this.copying.done;
    }
    refillSpareCopies(template, path.resolve(this.options.cacheDir));
    await makeOwnedDir(this.socketDir);
    this.stillStarting();
    this.server = new JailedServer(this.binDir, dataDir, this.socketDir, serverSettings(this.options.memoryMb ?? 128), this.options.cgroupJoin ?? []);
    await this.server.ready;
    this.stillStarting();
    // The template's superuser password is the same for every copy: replaced before anyone else connects.
    const superuser = await this.connect(SUPERUSER, template.superuserPassword, database);
    try {
      await superuser.query([
        `ALTER ROLE ${SUPERUSER} PASSWORD ${pg.escapeLiteral(this.superuserPassword)}`,
        `ALTER ROLE ${GRADER} PASSWORD ${pg.escapeLiteral(this.graderPassword)}`,
        `ALTER ROLE ${pg.escapeIdentifier(user)} PASSWORD ${pg.escapeLiteral(this.credentials.password)}`,
        // unread, the slot would keep every WAL segment for the sandbox's life
        ...(this.options.auditWrites ? [] : [`SELECT pg_drop_replication_slot('${SLOT}')`]),
      ].join(';\n'));
      this.stillStarting();
    } catch (err) {
      await superuser.end().catch(() => {});
      throw err;
    }
    if (!this.options.auditWrites) return void (await superuser.end());
    // the audit's reads flush the WAL with a synchronous commit
    await superuser.query('SET synchronous_commit = on');
    this.audit = new WriteAudit(superuser, this.options.onWrite);
  }

  private stillStarting(): void {
    if (this.stopping) throw new Error('stopped while starting');
  }

  /** wait_for: whether the agent's role can connect (and `query`, when given, returns a row). */
  async isReady(query?: string): Promise<boolean> {
    let client: pg.Client | null = null;
    try {
      client = await this.connect(this.credentials.user, this.credentials.password, this.credentials.database);
      if (!query) return true;
      return (lastResult(await client.query(query))?.rows.length ?? 0) > 0;
    } catch {
      return false;
    } finally {
      await client?.end().catch(() => {});
    }
  }

  /** A `sql` fixture: the text (several statements allowed) as the agent's role. */
  async runSql(sql: string): Promise<void> {
    let client: pg.Client | null = null;
    try {
      client = await this.connect(this.credentials.user, this.credentials.password, this.credentials.database);
      await client.query(sql);
    } catch (err) {
      throw new Error(`${this.options.name}: ${describeSqlError(err as pg.DatabaseError, sql)}`);
    } finally {
      await client?.end().catch(() => {});
    }
  }

  /**
   * The `sql` invariant: the first column of the first row as text (null: no row, or NULL),
   * read-only as the grader role. A query whose names resolve otherwise than at ready is refused
   * (refuseReplaced): a view, or another table, where the fixture's table was; a function or
   * operator the agent made that a call would pick over a built-in.
   */
  async queryFirst(sql: string): Promise<string | null> {
    let client: pg.Client | null = null;
    try {
      client = await this.connect(GRADER, this.graderPassword, this.credentials.database);
      await client.query('BEGIN TRANSACTION READ ONLY');
      // The database's owner (the agent) can set the database's defaults (ALTER DATABASE ... SET
      // search_path = its_own_schema, public; statement_timeout): the grader's are its own.
      // pg_catalog first: no built-in is shadowed by a same-named object the agent made.
      await client.query(`SET LOCAL search_path = pg_catalog, public; SET LOCAL statement_timeout = ${GRADER_TIMEOUT_MS}`);
      if (this.ready) refuseReplaced(sql, this.ready, await readResolvable(client));
      // The server's own text for every type (no Date, number or JSON parsing).
      const result = lastResult(await client.query({ text: sql, rowMode: 'array', types: { getTypeParser: () => (value: string) => value } }));
      const first = (result?.rows[0] as unknown[] | undefined)?.[0];
      return first === undefined || first === null ? null : String(first);
    } catch (err) {
      throw new Error(`${this.options.name}: ${describeSqlError(err as pg.DatabaseError, sql)}`);
    } finally {
      await client?.end().catch(() => {});
    }
  }

  /**
   * The world before the agent ends here (the boot's "start audit capture"): the relations are
   * noted for queryFirst, and writes are reported (when audited): those committed before the call
   * (fixtures, setup) are skipped, later ones reported. Before it nothing is reported.
   */
  async startAudit(): Promise<void> {
    if (!this.ready) {
      const client = await this.connect(GRADER, this.graderPassword, this.credentials.database);
      try {
        this.ready = await readResolvable(client);
      } finally {
        await client.end().catch(() => {});
      }
    }
    await this.audit?.begin();
  }

  /** Once audit has started: resolves when every write committed before the call has been passed to onWrite. */
  async flushWrites(): Promise<void> {
    await this.audit?.drain();
  }

  /** An observer for one sandbox connection, fed both directions by the gateway; reports rolled-back writes. */
  observeConnection(): ConnectionObserver {
    const onWrite = this.options.onWrite;
    if (!this.options.auditWrites || !onWrite) return { fromClient() {}, fromServer() {}, close() {} };
    return new PgWireObserver((write) => {
      if (!this.audit?.started) return;
      try {
        onWrite({ ...write, transactions: 1, rolled_back: true, ts: new Date().toISOString() });
      } catch {
        // the gateway's connection must not fail for a listener's error
      }
    });
  }

  /** pg_dump of the database, plain SQL (the runner's own machinery left out). */
  async dump(): Promise<Buffer> {
    // An archive first, so the guard's event trigger can be left out by its table-of-contents entry.
    const archive = path.join(this.root, `dump-${randomBytes(4).toString('hex')}`);
    const connection = ['--host', this.socketDir, '--port', String(PORT), '--username', SUPERUSER, '--dbname', this.credentials.database, '--no-password'];
    const env = { ...process.env, PGPASSWORD: this.superuserPassword };
    try {
      await runTool(path.join(this.binDir, 'pg_dump'), [...connection, '--format=custom', '--exclude-schema=svc_internal', `--file=${archive}`], env);
      const contents = (await runTool(path.join(this.binDir, 'pg_restore'), ['--list', archive])).toString('utf8');
      await fs.promises.writeFile(`${archive}.list`, contents.split('\n').filter((line) => !/ EVENT TRIGGER - svc_| ACL pg_catalog FUNCTION pg_logical_emit_message\(/.test(line)).join('\n'));
      return await runTool(path.join(this.binDir, 'pg_restore'), [`--use-list=${archive}.list`, '--file=-', archive]);
    } finally {
      await Promise.all([archive, `${archive}.list`].map((file) => fs.promises.rm(file, { force: true })));
    }
  }

  /** Kills every process of the server and removes root. Idempotent; safe while starting. */
  stop(): Promise<void> {
    this.stopping ??= (async () => {
      this.copying?.child.kill('SIGKILL');
      await this.copying?.done.catch(() => {});
      const auditStopped = this.audit?.stop();
      await this.server?.kill();
      await auditStopped;
      await fs.promises.rm(this.root, { recursive: true, force: true });
    })();
    return this.stopping;
  }

  private connect(user: string, password: string, database: string): Promise<pg.Client> {
    return connectOver(this.socketDir, user, password, database);
  }
}

async function connectOver(socketDir: string, user: string, password: string, database: string): Promise<pg.Client> {
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

function randomPassword(): string {
  return randomBytes(24).toString('base64url');
}

/** The database's message, with the line and column of its position in `sql` when it gave one. */
function describeSqlError(err: pg.DatabaseError, sql: string): string {
  let text = err.message;
  const position = Number(err.position);
  if (position > 0) {
    const before = sql.slice(0, position - 1);
    const line = before.split('\n').length;
    text += ` (line ${line}, column ${position - before.lastIndexOf('\n') - 1})`;
  }
  if (err.detail) text += `: ${err.detail}`;
  return text;
}

function checkNames(options: PostgresOptions): void {
  for (const [what, name] of [['user', options.user], ['database', options.database]] as const) {
    if (!name || Buffer.byteLength(name) > 63 || name.includes('\0')) throw new Error(`the ${what} name must be 1 to 63 bytes: ${JSON.stringify(name)}`);
  }
  if (options.user.startsWith('svc_') || options.user.startsWith('pg_')) throw new Error(`the user name ${options.user} is reserved`);
  if (['template0', 'template1'].includes(options.database) || options.database.startsWith('svc_')) throw new Error(`the database name ${options.database} is reserved`);
}

/** The bin directory of that installed major version (null: the newest). */
function installedBinDir(version: number | null): string {
  const base = '/usr/lib/postgresql';
  const versions = (fs.existsSync(base) ? fs.readdirSync(base) : []).filter((v) => fs.existsSync(path.join(base, v, 'bin', 'postgres'))).sort((a, b) => Number(b) - Number(a));
  const chosen = version === null ? versions[0] : versions.find((v) => Number(v) === version);
  if (!chosen) {
    const wanted = version === null ? 'PostgreSQL' : `PostgreSQL ${version}`;
    throw new Error(`${wanted} is not installed here (installed: ${versions.join(', ') || 'none'}; apt-get install postgresql-<version>)`);
  }
  return path.join(base, chosen, 'bin');
}

/** Settings of an ephemeral server (durability off, unix socket only, logical decoding on). */
function serverSettings(memoryMb: number): string[] {
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

// ---------------------------------------------------------------------------------------------
// The jail.

/**
 * The bubblewrap arguments for a server on `dataDir` with sockets in `socketDir` (host paths),
 * running `program`: the host's system directories read-only (and the installation `program` is
 * in, when it is elsewhere), never the host's root, so nothing of the host's data (the runner's,
 * other sandboxes') is in sight even of the runner's superuser.
 */
function jailArgs(dataDir: string, socketDir: string, program: string): string[] {
  const installation = path.dirname(path.dirname(program));
  return [
    '--unshare-pid', '--unshare-ipc', '--unshare-net', '--unshare-uts', '--unshare-cgroup-try',
    '--die-with-parent', '--new-session',
    ...hostSystemBinds(),
    ...(inHostSystemDirs(program) ? [] : ['--ro-bind', installation, installation]),
    '--proc', '/proc', '--dev', '/dev',
    '--perms', '1777', '--tmpfs', '/dev/shm',
    '--perms', '1777', '--tmpfs', '/tmp',
    // the host paths sit in the runner's 0700 directories: mounted where the postgres user reaches them
    '--tmpfs', '/run', '--perms', '0755', '--dir', '/run/pg',
    '--bind', dataDir, JAIL_DATA,
    '--bind', socketDir, JAIL_SOCKETS,
    '--chdir', '/',
    '--',
    'setpriv', `--reuid=${postgresUser().uid}`, `--regid=${postgresUser().gid}`, '--clear-groups', '--inh-caps=-all', '--bounding-set=-all', '--no-new-privs', '--',
  ];
}

/** A directory the jailed postgres user owns. */
async function makeOwnedDir(dir: string): Promise<void> {
  await fs.promises.mkdir(dir, { mode: 0o700 });
  const { uid, gid } = postgresUser();
  await fs.promises.chown(dir, uid, gid);
}

let postgresIds: { uid: number; gid: number } | null = null;

function postgresUser(): { uid: number; gid: number } {
  if (postgresIds) return postgresIds;
  const line = fs.readFileSync('/etc/passwd', 'utf8').split('\n').find((l) => l.startsWith(`${POSTGRES_USER}:`));
  if (!line) throw new Error(`there is no ${POSTGRES_USER} user on this host (apt-get install postgresql creates it)`);
  const [, , uid, gid] = line.split(':');
  postgresIds = { uid: Number(uid), gid: Number(gid) };
  return postgresIds;
}

const JAIL_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

/** A PostgreSQL program in the jail, the cgroups joined first when given. */
function spawnJailed(dataDir: string, socketDir: string, command: string[], cgroupJoin: string[] = []): ChildProcess {
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
class JailedServer {
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
async function runTool(command: string, args: string[], env: NodeJS.ProcessEnv = process.env): Promise<Buffer> {
  const child = spawn(command, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
  const chunks: Buffer[] = [];
  child.stdout!.on('data', (chunk: Buffer) => chunks.push(chunk));
  await exited(child, path.basename(command));
  return Buffer.concat(chunks);
}

/** Resolves when the child exits 0, rejects with its stderr otherwise. */
function exited(child: ChildProcess, what: string): Promise<void> {
  let stderr = '';
  child.stderr?.on('data', (chunk: Buffer) => (stderr = (stderr + chunk.toString('utf8')).slice(-2048)));
  return new Promise((resolve, reject) => {
    child.once('error', (err) => reject(new Error(`${what}: ${err.message}`)));
    child.once('close', (code, signal) => (code === 0 ? resolve() : reject(new Error(`${what} failed (${signal ?? code}): ${stderr.trim()}`))));
  });
}

// ---------------------------------------------------------------------------------------------
// The template.

/** What a template is made for: the spec's names are built in (a rename at each start would need a second database to copy). */
interface TemplateNames {
  database: string;
  user: string;
}

interface Template {
  /** the server's major version */
  major: number;
  /** the template's directory: data/, password, spare-* */
  dir: string;
  dataDir: string;
  /** the superuser's password in the template (replaced at each start) */
  superuserPassword: string;
}

const INITDB_ARGS = ['--username', SUPERUSER, '--auth-local=scram-sha-256', '--auth-host=reject', '--encoding=UTF8', '--locale=C', '--no-sync', '--wal-segsize=1', '--no-instructions'];

/** Local sockets only, by password: the socket is all there is, so passwords tell the roles apart. */
const PG_HBA = 'local all all scram-sha-256\n';

/**
 * The roles, and the database alone (what a sandbox does not need is not copied at each start).
 * The runner's superuser owns the database, not the agent's role: a database's owner can ALTER
 * DATABASE ... SET defaults (transform_null_equals, DateStyle ...) for every session, the
 * grader's included. The agent owns the public schema and may create schemas instead.
 */
function templateRolesSql({ database, user }: TemplateNames): string[] {
  const owner = pg.escapeIdentifier(user);
  const db = pg.escapeIdentifier(database);
  return [
    `CREATE ROLE ${owner} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS`,
    `CREATE ROLE ${GRADER} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION BYPASSRLS IN ROLE pg_read_all_data`,
    `ALTER ROLE ${GRADER} SET default_transaction_read_only = on`,
    ...(database === 'postgres' ? [] : [`CREATE DATABASE ${db} TEMPLATE template0`, 'DROP DATABASE postgres']),
    `GRANT CREATE, TEMPORARY ON DATABASE ${db} TO ${owner}`,
    'ALTER DATABASE template0 IS_TEMPLATE false',
    'DROP DATABASE template0',
  ];
}

/** In the agent's database: its public schema, the guard against unlogged tables (invisible to the slot), the DDL records, then the slot. */
const templateDatabaseSql = ({ user }: TemplateNames): string[] => [
  'ALTER DATABASE template1 IS_TEMPLATE false',
  'DROP DATABASE template1',
  `ALTER SCHEMA public OWNER TO ${pg.escapeIdentifier(user)}`,
  'CREATE SCHEMA svc_internal',
  'REVOKE ALL ON SCHEMA svc_internal FROM PUBLIC',
  `CREATE FUNCTION svc_internal.refuse_unlogged() RETURNS event_trigger LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  relation record;
BEGIN
  FOR relation IN
    SELECT n.nspname, c.relname FROM pg_event_trigger_ddl_commands() d
    JOIN pg_class c ON c.oid = d.objid JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE d.classid = 'pg_class'::regclass AND c.relpersistence = 'u' AND c.relkind IN ('r', 'p', 'm')
  LOOP
    RAISE EXCEPTION 'unlogged tables are not allowed here: %.% would hide its writes from the audit of database writes, which reads the write-ahead log that unlogged tables bypass', quote_ident(relation.nspname), quote_ident(relation.relname)
      USING ERRCODE = 'feature_not_supported', HINT = 'Create a regular (logged) table instead.';
  END LOOP;
END
$$`,
  `CREATE EVENT TRIGGER svc_refuse_unlogged ON ddl_command_end
  WHEN TAG IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO', 'ALTER TABLE')
  EXECUTE FUNCTION svc_internal.refuse_unlogged()`,
  // DDL (and the table rewrites some of it makes) changes no row the slot shows: each command
  // is a transactional message in the slot instead, made by event triggers the agent's role
  // does not own and cannot disable (ENABLE ALWAYS: session_replication_role cannot skip them).
  `CREATE FUNCTION svc_internal.record_ddl() RETURNS event_trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
DECLARE
  command record;
BEGIN
  IF TG_EVENT = 'sql_drop' THEN
    FOR command IN SELECT object_type, schema_name, object_name, object_identity FROM pg_event_trigger_dropped_objects() WHERE original LOOP
      PERFORM svc_internal.emit_ddl(TG_TAG, command.object_type, CASE WHEN command.object_name IS NOT NULL AND command.schema_name IS NOT NULL
        THEN svc_internal.table_name(command.schema_name, command.object_name) ELSE command.object_identity END);
    END LOOP;
  ELSE
    FOR command IN SELECT d.command_tag, d.object_type, d.object_identity, svc_internal.owning_relation(d.classid, d.objid) AS relation
      FROM pg_event_trigger_ddl_commands() d LOOP
      PERFORM svc_internal.emit_ddl(command.command_tag, command.object_type, coalesce(
        (SELECT svc_internal.table_name(n.nspname, c.relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = command.relation),
        command.object_identity, ''));
    END LOOP;
  END IF;
END
$$`,
  `CREATE FUNCTION svc_internal.table_name(schema name, relation name) RETURNS text LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp AS $$ SELECT CASE WHEN schema = 'public' THEN relation::text ELSE schema || '.' || relation END $$`,
  // the table a relation-level object (index, trigger, rule, policy, constraint, column default) belongs to
  `CREATE FUNCTION svc_internal.owning_relation(classid oid, objid oid) RETURNS oid LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp AS $$ SELECT CASE classid
  WHEN 'pg_class'::regclass THEN coalesce((SELECT indrelid FROM pg_index WHERE indexrelid = objid), objid)
  WHEN 'pg_trigger'::regclass THEN (SELECT tgrelid FROM pg_trigger WHERE oid = objid)
  WHEN 'pg_rewrite'::regclass THEN (SELECT ev_class FROM pg_rewrite WHERE oid = objid)
  WHEN 'pg_policy'::regclass THEN (SELECT polrelid FROM pg_policy WHERE oid = objid)
  WHEN 'pg_constraint'::regclass THEN (SELECT nullif(conrelid, 0) FROM pg_constraint WHERE oid = objid)
  WHEN 'pg_attrdef'::regclass THEN (SELECT adrelid FROM pg_attrdef WHERE oid = objid)
END $$`,
  `CREATE FUNCTION svc_internal.emit_ddl(command text, object_type text, object text) RETURNS void LANGUAGE sql
SET search_path = pg_catalog, pg_temp AS $$
SELECT pg_logical_emit_message(true, '${DDL_PREFIX}', json_build_object('command', command, 'object_type', object_type, 'table', left(object, 1024))::text) $$`,
  // only the runner's machinery writes into the slot: the agent cannot forge (or flood) records
  // (every overload: 17 adds one with a `flush` argument)
  `DO $$ DECLARE overload regprocedure; BEGIN
  FOR overload IN SELECT oid::regprocedure FROM pg_proc WHERE proname = 'pg_logical_emit_message' AND pronamespace = 'pg_catalog'::regnamespace LOOP
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', overload);
  END LOOP;
END $$`,
  'REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA svc_internal FROM PUBLIC',
  // Large objects live in a catalog the slot does not decode: like unlogged tables, none can be made.
  `DO $$ DECLARE overload regprocedure; BEGIN
  FOR overload IN SELECT oid::regprocedure FROM pg_proc WHERE proname IN ('lo_creat', 'lo_create', 'lo_from_bytea', 'lo_import') AND pronamespace = 'pg_catalog'::regnamespace LOOP
    EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', overload);
  END LOOP;
END $$`,
  `CREATE EVENT TRIGGER svc_record_ddl ON ddl_command_end EXECUTE FUNCTION svc_internal.record_ddl()`,
  `CREATE EVENT TRIGGER svc_record_drops ON sql_drop EXECUTE FUNCTION svc_internal.record_ddl()`,
  'ALTER EVENT TRIGGER svc_record_ddl ENABLE ALWAYS',
  'ALTER EVENT TRIGGER svc_record_drops ENABLE ALWAYS',
  'ALTER EVENT TRIGGER svc_refuse_unlogged ENABLE ALWAYS',
  `SELECT pg_create_logical_replication_slot('${SLOT}', 'test_decoding')`,
];

/** A template unused for this long is removed when another is built. */
const TEMPLATE_UNUSED_MS = 7 * 24 * 3600_000;

const templates = new Map<string, Promise<Template>>();

/** The cached template for this server, these settings and names, built on first use. */
async function templateFor(binDir: string, cacheDir: string, names: TemplateNames, again = false): Promise<Template> {
  const key = JSON.stringify([binDir, cacheDir, names]);
  if (!templates.has(key)) {
    const finding = findOrBuildTemplate(binDir, cacheDir, names);
    templates.set(key, finding);
    finding.catch(() => templates.delete(key));
  }
  const template = await templates.get(key)!;
  try {
    // Its modification time says when it was last used (sweepCache removes those unused for long).
    const now = new Date();
    await fs.promises.utimes(template.dir, now, now);
    return template;
  } catch (err) {
    // Removed meanwhile, by a runner sweeping the cache: found or built again.
    templates.delete(key);
    if (again) throw err;
    return templateFor(binDir, cacheDir, names, true);
  }
}

async function findOrBuildTemplate(binDir: string, cacheDir: string, names: TemplateNames): Promise<Template> {
  const version = spawnSync(path.join(binDir, 'postgres'), ['--version'], { encoding: 'utf8' });
  if (version.status !== 0) throw new Error(`cannot run ${binDir}/postgres: ${version.error?.message ?? version.stderr.trim()}`);
  const settings = JSON.stringify([version.stdout.trim(), INITDB_ARGS, PG_HBA, templateRolesSql(names), templateDatabaseSql(names), serverSettings(128)]);
  const major = Number(/(\d+)/.exec(version.stdout)?.[1]);
  const dir = path.join(cacheDir, `postgres-${major}-${createHash('sha256').update(settings).digest('hex').slice(0, 16)}`);
  const found = readTemplate(dir, major);
  if (found) return found;
  await fs.promises.mkdir(cacheDir, { recursive: true, mode: 0o700 });
  await sweepCache(cacheDir);
  const build = path.join(cacheDir, `.build-${process.pid}-${randomBytes(4).toString('hex')}`);
  try {
    await buildTemplate(binDir, build, names);
    try {
      await fs.promises.rename(build, dir);
    } catch (err) {
      // another runner finished first: its template is as good
      if (!['EEXIST', 'ENOTEMPTY'].includes((err as NodeJS.ErrnoException).code ?? '')) throw err;
    }
  } finally {
    await fs.promises.rm(build, { recursive: true, force: true });
  }
  const built = readTemplate(dir, major);
  if (!built) throw new Error(`the PostgreSQL template ${dir} is incomplete`);
  return built;
}

function readTemplate(dir: string, major: number): Template | null {
  try {
    const superuserPassword = fs.readFileSync(path.join(dir, 'password'), 'utf8');
    return fs.existsSync(path.join(dir, 'data', 'PG_VERSION')) ? { major, dir, dataDir: path.join(dir, 'data'), superuserPassword } : null;
  } catch {
    return null;
  }
}

/**
 * Copies of a template made ahead of need: a start renames one into place (when on the same
 * filesystem) instead of copying on its critical path. A copy creates some 300 files, which
 * ext4 makes slow (a quarter of a second) right after many deletions, as sandboxes come and go.
 */
const SPARE_COPIES = 2;
/** the refills under way, by template directory */
const refilling = new Map<string, Promise<void>>();

/** Whether a spare copy of the template is now `target`. */
async function takeSpareCopy(template: Template, target: string): Promise<boolean> {
  const spares = (await fs.promises.readdir(template.dir)).filter((entry) => entry.startsWith('spare-'));
  for (const spare of spares) {
    try {
      await fs.promises.rename(path.join(template.dir, spare), target);
      return true;
    } catch (err) {
      // ENOENT: another start took it; EXDEV: the sandbox is on another filesystem
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') return false;
    }
  }
  return false;
}

/** Makes spare copies in the background, one at a time, up to SPARE_COPIES; a failure leaves starts to copy. */
function refillSpareCopies(template: Template, cacheDir: string): void {
  if (refilling.has(template.dir)) return;
  const refill = (async () => {
    const spares = async (): Promise<number> => (await fs.promises.readdir(template.dir)).filter((entry) => entry.startsWith('spare-')).length;
    while ((await spares()) < SPARE_COPIES) {
      const building = path.join(cacheDir, `.build-${process.pid}-${randomBytes(4).toString('hex')}`);
      try {
        await runTool('cp', ['-a', template.dataDir, building]);
        await fs.promises.rename(building, path.join(template.dir, `spare-${randomBytes(4).toString('hex')}`));
      } finally {
        await fs.promises.rm(building, { recursive: true, force: true });
      }
    }
  })()
    .catch(() => {})
    .finally(() => refilling.delete(template.dir));
  refilling.set(template.dir, refill);
}

/** Build directories of runners that died while building, and templates unused for a week. */
async function sweepCache(cacheDir: string): Promise<void> {
  for (const entry of await fs.promises.readdir(cacheDir)) {
    const pid = Number(/^\.build-(\d+)-/.exec(entry)?.[1]);
    const abandoned = pid > 0 && pid !== process.pid && !processAlive(pid);
    const unused = entry.startsWith('postgres-') && Date.now() - (await fs.promises.stat(path.join(cacheDir, entry))).mtimeMs > TEMPLATE_UNUSED_MS;
    if (abandoned || unused) await fs.promises.rm(path.join(cacheDir, entry), { recursive: true, force: true });
  }
}

function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** initdb, the roles, database, guard and slot, a clean shutdown: a data directory ready to copy. */
async function buildTemplate(binDir: string, build: string, names: TemplateNames): Promise<void> {
  const dataDir = path.join(build, 'data');
  const socketDir = path.join(build, 'sock');
  const password = randomPassword();
  await fs.promises.mkdir(build, { mode: 0o700 });
  await makeOwnedDir(dataDir);
  await makeOwnedDir(socketDir);
  await fs.promises.writeFile(path.join(socketDir, 'pw'), password, { mode: 0o600 });
  await fs.promises.chown(path.join(socketDir, 'pw'), postgresUser().uid, postgresUser().gid);
  await exited(spawnJailed(dataDir, socketDir, [path.join(binDir, 'initdb'), '-D', JAIL_DATA, `--pwfile=${JAIL_SOCKETS}/pw`, ...INITDB_ARGS]), 'initdb');
  await fs.promises.rm(path.join(socketDir, 'pw'));
  await fs.promises.writeFile(path.join(dataDir, 'pg_hba.conf'), PG_HBA);
  const server = new JailedServer(binDir, dataDir, socketDir, serverSettings(128), []);
  try {
    await server.ready;
    await runAsSuperuser(socketDir, password, 'template1', templateRolesSql(names));
    await runAsSuperuser(socketDir, password, names.database, templateDatabaseSql(names));
    await server.shutdown();
  } finally {
    await server.kill();
  }
  await slimDataDir(dataDir);
  await fs.promises.writeFile(path.join(build, 'password'), password, { mode: 0o600 });
}

/**
 * Fewer files to copy at each start: the free space and visibility maps (the server makes them
 * again when it needs them) and the relation cache files (removed at every start anyway).
 */
async function slimDataDir(dataDir: string): Promise<void> {
  const files = await fs.promises.readdir(dataDir, { recursive: true });
  const removable = files.filter((f) => /(_fsm|_vm|pg_internal\.init)$/.test(f) || f === 'postmaster.opts');
  await Promise.all(removable.map((f) => fs.promises.rm(path.join(dataDir, f))));
}

async function runAsSuperuser(socketDir: string, password: string, database: string, statements: string[]): Promise<void> {
  const client = await connectOver(socketDir, SUPERUSER, password, database);
  try {
    // one at a time: CREATE/DROP DATABASE cannot run in a multi-statement transaction
    for (const statement of statements) await client.query(statement);
  } finally {
    await client.end();
  }
}
