/**
 * The cached template a sandbox's PostgreSQL server starts from (postgres.ts's header, "Start"):
 * `initdb` once per server version, init settings and spec names, with the roles, the database
 * alone, the guard against unlogged tables, the DDL records and the replication slot already in
 * it; spare copies made ahead of need; templates unused for long swept away.
 */
import { spawnSync } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import pg from 'pg';
import {
  connectOver,
  exited,
  JAIL_DATA,
  JAIL_SOCKETS,
  JailedServer,
  makeOwnedDir,
  postgresUser,
  runTool,
  serverSettings,
  spawnJailed,
} from './postgres-jail.ts';
import { DDL_PREFIX, SLOT } from './postgres-write-audit.ts';

/** The runner's own roles (postgres.ts's header says what each may do). */
export const SUPERUSER = 'svc_superuser';
export const GRADER = 'svc_grader';

export function randomPassword(): string {
  return randomBytes(24).toString('base64url');
}

/** What a template is made for: the spec's names are built in (a rename at each start would need a second database to copy). */
interface TemplateNames {
  database: string;
  user: string;
}

export interface Template {
  /** the server's major version */
  major: number;
  /** the template's directory: data/, password, spare-* */
  dir: string;
  dataDir: string;
  /** the superuser's password in the template (replaced at each start) */
  superuserPassword: string;
}

const INITDB_ARGS = [
  '--username',
  SUPERUSER,
  '--auth-local=scram-sha-256',
  '--auth-host=reject',
  '--encoding=UTF8',
  '--locale=C',
  '--no-sync',
  '--wal-segsize=1',
  '--no-instructions',
];

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
export async function templateFor(binDir: string, cacheDir: string, names: TemplateNames, again = false): Promise<Template> {
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

/** Waits for the spare copies made in the background. */
export async function spareCopiesMade(): Promise<void> {
  await Promise.all(refilling.values());
}

/** Whether a spare copy of the template is now `target`. */
export async function takeSpareCopy(template: Template, target: string): Promise<boolean> {
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
export function refillSpareCopies(template: Template, cacheDir: string): void {
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
