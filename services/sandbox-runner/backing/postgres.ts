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
 *
 * Here: the service and its life. The template and its spare copies are made in
 * postgres-template.ts, the server is jailed in postgres-jail.ts.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import pg from 'pg';
import { connectOver, exited, JailedServer, makeOwnedDir, PORT, runTool, serverSettings } from './postgres-jail.ts';
import { readResolvable, refuseReplaced, type Resolvable } from './postgres-pins.ts';
import { GRADER, randomPassword, refillSpareCopies, spareCopiesMade, SUPERUSER, takeSpareCopy, templateFor, type Template } from './postgres-template.ts';
import { PgWireObserver } from './postgres-wire.ts';
import { type DbWrite, lastResult, SLOT, WriteAudit } from './postgres-write-audit.ts';

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

/** How long the `sql` invariant's query may run. */
const GRADER_TIMEOUT_MS = 60_000;

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

  private constructor(
    private readonly options: PostgresOptions,
    private readonly root: string,
    private readonly binDir: string,
  ) {
    this.socketDir = path.join(root, 'sock');
    this.socketPath = path.join(this.socketDir, `.s.PGSQL.${PORT}`);
    this.credentials = { user: options.user, password: options.password ?? randomPassword(), database: options.database };
  }

  /** Waits for the template copies made in the background (before removing cacheDir, say). */
  static async settle(): Promise<void> {
    await spareCopiesMade();
  }

  static async start(options: PostgresOptions): Promise<PostgresService> {
    let service: PostgresService | null = null;
    const abort = (): void => void service?.stop();
    options.signal?.addEventListener('abort', abort, { once: true });
    try {
      checkNames(options);
      const binDir = options.binDir ?? installedBinDir(options.version ?? null);
      const template = await templateFor(binDir, path.resolve(options.cacheDir), { database: options.database, user: options.user });
      if (options.version && template.major !== options.version)
        throw new Error(`PostgreSQL ${options.version} was asked for, but ${binDir} is PostgreSQL ${template.major}`);
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
      await superuser.query(
        [
          `ALTER ROLE ${SUPERUSER} PASSWORD ${pg.escapeLiteral(this.superuserPassword)}`,
          `ALTER ROLE ${GRADER} PASSWORD ${pg.escapeLiteral(this.graderPassword)}`,
          `ALTER ROLE ${pg.escapeIdentifier(user)} PASSWORD ${pg.escapeLiteral(this.credentials.password)}`,
          // unread, the slot would keep every WAL segment for the sandbox's life
          ...(this.options.auditWrites ? [] : [`SELECT pg_drop_replication_slot('${SLOT}')`]),
        ].join(';\n'),
      );
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
      await fs.promises.writeFile(
        `${archive}.list`,
        contents
          .split('\n')
          .filter((line) => !/ EVENT TRIGGER - svc_| ACL pg_catalog FUNCTION pg_logical_emit_message\(/.test(line))
          .join('\n'),
      );
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
  for (const [what, name] of [
    ['user', options.user],
    ['database', options.database],
  ] as const) {
    if (!name || Buffer.byteLength(name) > 63 || name.includes('\0')) throw new Error(`the ${what} name must be 1 to 63 bytes: ${JSON.stringify(name)}`);
  }
  if (options.user.startsWith('svc_') || options.user.startsWith('pg_')) throw new Error(`the user name ${options.user} is reserved`);
  if (['template0', 'template1'].includes(options.database) || options.database.startsWith('svc_'))
    throw new Error(`the database name ${options.database} is reserved`);
}

/** The bin directory of that installed major version (null: the newest). */
function installedBinDir(version: number | null): string {
  const base = '/usr/lib/postgresql';
  const versions = (fs.existsSync(base) ? fs.readdirSync(base) : [])
    .filter((v) => fs.existsSync(path.join(base, v, 'bin', 'postgres')))
    .sort((a, b) => Number(b) - Number(a));
  const chosen = version === null ? versions[0] : versions.find((v) => Number(v) === version);
  if (!chosen) {
    const wanted = version === null ? 'PostgreSQL' : `PostgreSQL ${version}`;
    throw new Error(`${wanted} is not installed here (installed: ${versions.join(', ') || 'none'}; apt-get install postgresql-<version>)`);
  }
  return path.join(base, chosen, 'bin');
}
