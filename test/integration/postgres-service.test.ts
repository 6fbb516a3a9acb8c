// The per-sandbox PostgreSQL service (services/sandbox-runner/backing/postgres.ts) against a real
// server: the jail, the roles, fixtures and invariants, the committed-write audit (the
// replication slot) and the rolled-back writes seen on the wire (postgres-wire.ts), through a
// real psql and the pg client as an agent would use them. No mocks. Skipped with a reason
// without root, bubblewrap (SVC_TEST_BWRAP: npm test installs it) or PostgreSQL; under CI=true
// that is a failure instead.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import pg from 'pg';
import { PgWireObserver, type ObservedWrite } from '../../services/sandbox-runner/backing/postgres-wire.ts';
import { PostgresService, type PostgresOptions } from '../../services/sandbox-runner/backing/postgres.ts';
import type { DbWrite } from '../../services/sandbox-runner/backing/postgres-write-audit.ts';

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'svc-postgres-'));
const cacheDir = path.join(root, 'cache');
const live: PostgresService[] = [];

after(async () => {
  await Promise.all(live.map((service) => service.stop()));
  await PostgresService.settle();
  fs.rmSync(root, { recursive: true, force: true });
});

function unavailable(): string | null {
  if (process.platform !== 'linux' || process.getuid?.() !== 0) return 'needs root on Linux (the server runs as the postgres user in a bubblewrap jail)';
  if (spawnSync('bwrap', ['--version']).status !== 0) return 'bubblewrap is not installed (apt-get install bubblewrap)';
  if (!fs.existsSync('/usr/lib/postgresql') || spawnSync('psql', ['--version']).status !== 0) return 'PostgreSQL is not installed (apt-get install postgresql)';
  return null;
}

async function start(overrides: Partial<PostgresOptions> = {}): Promise<PostgresService> {
  const service = await PostgresService.start({
    name: 'db',
    database: 'shop',
    user: 'agent',
    root: path.join(root, `svc-${randomBytes(4).toString('hex')}`),
    cacheDir,
    auditWrites: false,
    ...overrides,
  });
  live.push(service);
  return service;
}

interface PsqlResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** psql as the agent: over the service's socket, or through `port` (the observing proxy). */
function psql(service: PostgresService, sql: string, options: { port?: number; stdin?: string; password?: string } = {}): Promise<PsqlResult> {
  const { user, password, database } = service.credentials;
  const host = options.port ? ['-h', '127.0.0.1', '-p', String(options.port)] : ['-h', path.dirname(service.socketPath), '-p', String(service.port)];
  const child = spawn('psql', ['-X', '-q', '-At', '-v', 'ON_ERROR_STOP=1', ...host, '-U', user, '-d', database, '-c', sql], {
    env: { PATH: process.env.PATH, PGPASSWORD: options.password ?? password, PGCONNECT_TIMEOUT: '10' },
  });
  child.stdin.end(options.stdin ?? '');
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (c: Buffer) => (stdout += c));
  child.stderr.on('data', (c: Buffer) => (stderr += c));
  return new Promise((resolve) => child.on('close', (code) => resolve({ code, stdout, stderr })));
}

/** A TCP proxy to the service that feeds an observer with both directions, as the egress gateway does. */
async function observingProxy(service: PostgresService): Promise<{ port: number; close: () => Promise<void> }> {
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const upstream = net.connect({ path: service.socketPath });
    const observer = service.observeConnection();
    sockets.add(client).add(upstream);
    client.on('data', (chunk: Buffer) => {
      observer.fromClient(chunk);
      upstream.write(chunk);
    });
    upstream.on('data', (chunk: Buffer) => {
      observer.fromServer(chunk);
      client.write(chunk);
    });
    const end = (): void => {
      observer.close();
      client.destroy();
      upstream.destroy();
    };
    for (const socket of [client, upstream]) socket.on('close', end).on('error', end);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as net.AddressInfo).port,
    close: () => {
      for (const socket of sockets) socket.destroy();
      return new Promise((resolve) => server.close(() => resolve()));
    },
  };
}

/** Every process of the jail(s) whose bubblewrap mounts something of `dir`, with their descendants. */
function jailProcesses(dir: string): number[] {
  const found: number[] = [];
  const visit = (pid: number): void => {
    found.push(pid);
    let children = '';
    try {
      children = fs.readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8');
    } catch {
      // gone meanwhile
    }
    for (const child of children.trim().split(/\s+/).filter(Boolean)) visit(Number(child));
  };
  for (const entry of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const cmdline = fs.readFileSync(`/proc/${entry}/cmdline`, 'utf8');
      if (cmdline.startsWith('bwrap\0') && cmdline.includes(dir) && !found.includes(Number(entry))) visit(Number(entry));
    } catch {
      // gone meanwhile
    }
  }
  return found;
}

const alive = (pid: number): boolean => fs.existsSync(`/proc/${pid}`);

// ---------------------------------------------------------------------------------------------
// The wire observer alone, on conversations written here byte for byte (no server needed).

const message = (type: string, body: Buffer | string = ''): Buffer => {
  const payload = typeof body === 'string' ? Buffer.from(body, 'latin1') : body;
  const header = Buffer.alloc(5);
  header.write(type, 0, 'latin1');
  header.writeInt32BE(payload.length + 4, 1);
  return Buffer.concat([header, payload]);
};
const untyped = (code: number, rest = Buffer.alloc(0)): Buffer => {
  const header = Buffer.alloc(8);
  header.writeInt32BE(rest.length + 8, 0);
  header.writeInt32BE(code, 4);
  return Buffer.concat([header, rest]);
};
const SSL_REQUEST = untyped(80877103);
const STARTUP = untyped(196608, Buffer.from('user\0agent\0\0'));
const query = (sql: string): Buffer => message('Q', `${sql}\0`);
const complete = (...tags: string[]): Buffer => Buffer.concat(tags.map((tag) => message('C', `${tag}\0`)));
const ready = (status: 'I' | 'T' | 'E'): Buffer => message('Z', status);
const failure = message('E', 'SERROR\0C22012\0Mdivision by zero\0\0');

/** Client and server chunks in conversation order, fed whole or `split` into pieces of that many bytes. */
function observe(conversation: Array<['client' | 'server', Buffer]>, split = 0): ObservedWrite[] {
  const reported: ObservedWrite[] = [];
  const observer = new PgWireObserver((write) => reported.push(write));
  for (const [side, bytes] of conversation) {
    const pieces = split ? Array.from({ length: Math.ceil(bytes.length / split) }, (_, i) => bytes.subarray(i * split, (i + 1) * split)) : [bytes];
    for (const piece of pieces) side === 'client' ? observer.fromClient(piece) : observer.fromServer(piece);
  }
  observer.close();
  return reported;
}

const opening: Array<['client' | 'server', Buffer]> = [
  ['client', SSL_REQUEST],
  ['server', Buffer.from('N')],
  ['client', STARTUP],
  ['server', Buffer.concat([message('R', Buffer.alloc(4)), message('S', 'TimeZone\0UTC\0'), message('K', Buffer.alloc(8)), ready('I')])],
];

describe('postgres wire observer', () => {
  test('a rollback, a failed implicit transaction and a savepoint, whole or split byte by byte', () => {
    const conversation: Array<['client' | 'server', Buffer]> = [
      ...opening,
      ['client', query(`BEGIN; INSERT INTO "Orders" VALUES (1), (2); UPDATE public.stock SET n = 0; ROLLBACK`)],
      ['server', Buffer.concat([complete('BEGIN', 'INSERT 0 2', 'UPDATE 5', 'ROLLBACK'), ready('I')])],
      ['client', query(`INSERT INTO audit.log VALUES (1); SELECT 1/0`)],
      ['server', Buffer.concat([complete('INSERT 0 1'), failure, ready('I')])],
      ['client', query(`BEGIN; DELETE FROM t; SAVEPOINT a; DELETE FROM u WHERE x = ';'; ROLLBACK TO a; COMMIT`)],
      ['server', Buffer.concat([complete('BEGIN', 'DELETE 3', 'SAVEPOINT', 'DELETE 4', 'ROLLBACK', 'COMMIT'), ready('I')])],
      ['client', query(`INSERT INTO committed VALUES (1)`)],
      ['server', Buffer.concat([complete('INSERT 0 1'), ready('I')])],
    ];
    const expected = [
      { table: 'Orders', operation: 'insert', row_count: 2 },
      { table: 'stock', operation: 'update', row_count: 5 },
      { table: 'audit.log', operation: 'insert', row_count: 1 },
      { table: 'u', operation: 'delete', row_count: 4 },
    ];
    assert.deepEqual(observe(conversation), expected);
    assert.deepEqual(observe(conversation, 1), expected);
    assert.deepEqual(observe(conversation, 7), expected);
  });

  test('the extended protocol: a named statement executed in a transaction that fails at COMMIT', () => {
    const parse = message('P', 'ins\0INSERT INTO items (id) VALUES ($1)\0\0\0');
    const bind = message('B', Buffer.concat([Buffer.from('\0ins\0'), Buffer.from([0, 0, 0, 1, 0, 0, 0, 1]), Buffer.from('7'), Buffer.from([0, 0])]));
    const execute = message('E', Buffer.from('\0\0\0\0\0'));
    const sync = message('S');
    const conversation: Array<['client' | 'server', Buffer]> = [
      ...opening,
      ['client', query('BEGIN')],
      ['server', Buffer.concat([complete('BEGIN'), ready('T')])],
      ['client', Buffer.concat([parse, bind, execute, sync, bind, execute, sync])],
      ['server', Buffer.concat([message('1'), message('2'), complete('INSERT 0 1'), ready('T'), message('2'), complete('INSERT 0 1'), ready('T')])],
      ['client', query('SELECT nope')],
      ['server', Buffer.concat([failure, ready('E')])],
      ['client', query('COMMIT')],
      ['server', Buffer.concat([complete('ROLLBACK'), ready('I')])],
    ];
    assert.deepEqual(observe(conversation), [{ table: 'items', operation: 'insert', row_count: 2 }]);
  });

  test('a transaction left open when the connection ends is rolled back; not when a COMMIT was unanswered', () => {
    const open: Array<['client' | 'server', Buffer]> = [
      ...opening,
      ['client', query(`BEGIN; INSERT INTO t VALUES (1)`)],
      ['server', Buffer.concat([complete('BEGIN', 'INSERT 0 1'), ready('T')])],
    ];
    assert.deepEqual(observe(open), [{ table: 't', operation: 'insert', row_count: 1 }]);
    assert.deepEqual(observe([...open, ['client', query('COMMIT')]]), []);
  });

  test('a huge query keeps its table; garbage, and bytes after it, never throw', () => {
    const huge = `INSERT INTO big VALUES ${Array.from({ length: 200_000 }, (_, i) => `(${i})`).join(', ')}`;
    const conversation: Array<['client' | 'server', Buffer]> = [
      ...opening,
      ['client', query(`BEGIN; ${huge}; ROLLBACK`)],
      ['server', Buffer.concat([complete('BEGIN', 'INSERT 0 200000', 'ROLLBACK'), ready('I')])],
    ];
    assert.deepEqual(observe(conversation, 65_536), [{ table: 'big', operation: 'insert', row_count: 200_000 }]);
    const observer = new PgWireObserver(() => assert.fail('nothing to report'));
    observer.fromClient(STARTUP);
    observer.fromClient(Buffer.from([0x51, 0xff, 0xff, 0xff, 0xff, 1, 2, 3])); // a negative length
    observer.fromServer(randomBytes(4096));
    observer.fromClient(randomBytes(4096));
    observer.close();
    observer.fromServer(Buffer.concat([complete('ROLLBACK'), ready('I')]));
  });
});

const problem = unavailable();
if (problem) {
  if (process.env.CI === 'true') test('postgres service', () => assert.fail(`${problem}; under CI=true it is mandatory`));
  else test('postgres service', { skip: problem }, () => {});
} else {
  describe('postgres service: lifecycle and isolation', () => {
    test('starts, answers psql over its socket, and stop() leaves no process and no directory', { timeout: 60_000 }, async () => {
      const service = await start();
      const dir = path.dirname(path.dirname(service.socketPath));
      const result = await psql(service, 'SELECT current_user, current_database(), 6 * 7');
      assert.equal(result.stderr, '');
      assert.equal(result.stdout, 'agent|shop|42\n');
      assert.equal(await service.queryFirst(`SELECT count(*) FROM pg_replication_slots`), '0', 'without the audit, no slot keeps WAL');
      const processes = jailProcesses(dir);
      assert.ok(processes.length >= 4, `bwrap, its init, the postmaster and its helpers: ${processes.join(' ')}`);
      // (the backend that served psql may have gone meanwhile)
      const owners = processes.flatMap((pid) => fs.statSync(`/proc/${pid}`, { throwIfNoEntry: false })?.uid ?? []);
      assert.ok(owners.filter((uid) => uid !== 0).every((uid) => uid === owners.at(-1)) && owners.at(-1) !== 0, 'the server does not run as root');
      await service.stop();
      assert.deepEqual(processes.filter(alive), []);
      assert.equal(fs.existsSync(dir), false);
      await service.stop(); // idempotent
    });

    test('start-up takes a fraction of a second once the template is cached', { timeout: 120_000 }, async (t) => {
      await (await start()).stop();
      const times: number[] = [];
      for (let i = 0; i < 5; i++) {
        const begun = performance.now();
        const service = await start({ auditWrites: true });
        times.push(performance.now() - begun);
        await service.stop();
      }
      times.sort((a, b) => a - b);
      t.diagnostic(`start ms: ${times.map(Math.round).join(' ')}`);
      assert.ok(times[2]! < 2_000, `median start ${Math.round(times[2]!)} ms`);
    });

    test('two services have separate data and separate passwords', { timeout: 60_000 }, async () => {
      const [a, b] = await Promise.all([start(), start()]);
      await a.runSql(`CREATE TABLE only_in_a (id int); INSERT INTO only_in_a VALUES (1)`);
      assert.equal(await a.queryFirst(`SELECT count(*) FROM only_in_a`), '1');
      assert.equal(await b.queryFirst(`SELECT to_regclass('only_in_a')::text`), null);
      assert.notEqual(a.credentials.password, b.credentials.password);
      const crossed = await psql(b, 'SELECT 1', { password: a.credentials.password });
      assert.notEqual(crossed.code, 0);
      assert.match(crossed.stderr, /password authentication failed for user "agent"/);
    });

    test('stop() during a start: the start rejects and nothing is left', { timeout: 60_000 }, async () => {
      await (await start()).stop(); // the template is built: the abort lands in the start proper
      for (const delayMs of [0, 5, 20, 40]) {
        const controller = new AbortController();
        const dir = path.join(root, `aborted-${delayMs}`);
        const starting = PostgresService.start({
          name: 'db',
          database: 'shop',
          user: 'agent',
          root: dir,
          cacheDir,
          auditWrites: true,
          signal: controller.signal,
        });
        setTimeout(() => controller.abort(), delayMs);
        const outcome = await starting.then(
          (service) => service,
          (err: Error) => err,
        );
        if (outcome instanceof PostgresService) {
          await outcome.stop(); // it won the race
        } else {
          assert.match(outcome.message, /db: PostgreSQL did not start: stopped while starting/);
        }
        assert.deepEqual(jailProcesses(dir), []);
        assert.equal(fs.existsSync(dir), false);
      }
    });

    test('names that would collide with the runner’s own roles are refused', async () => {
      await assert.rejects(start({ user: 'svc_superuser' }), /the user name svc_superuser is reserved/);
      await assert.rejects(start({ database: 'template1' }), /the database name template1 is reserved/);
    });
  });

  describe('postgres service: fixtures, invariants, roles', () => {
    let service: PostgresService;
    before(async () => {
      service = await start({ database: 'app', user: 'postgres' });
    });

    test('a fixture runs as the agent’s role; an invalid one rejects with the database’s message and line', { timeout: 30_000 }, async () => {
      await service.runSql(`CREATE TABLE items (id int PRIMARY KEY, name text);\nINSERT INTO items VALUES (1, 'one'), (2, 'two');`);
      assert.equal(await service.queryFirst(`SELECT tableowner FROM pg_tables WHERE tablename = 'items'`), 'postgres');
      await assert.rejects(
        service.runSql(`SELECT 1;\nINSERT INTO items VALUES (3, 'three');\nSELEC name FROM items`),
        /^Error: db: syntax error at or near "SELEC" \(line 3, column 1\)$/,
      );
      await assert.rejects(
        service.runSql(`INSERT INTO items VALUES (1, 'again')`),
        /duplicate key value violates unique constraint "items_pkey": Key \(id\)=\(1\) already exists/,
      );
      assert.equal(await service.queryFirst(`SELECT count(*) FROM items`), '2', 'the failed fixture wrote nothing');
    });

    test('queryFirst: the first column of the first row as text, null for no row or NULL, read-only', { timeout: 30_000 }, async () => {
      assert.equal(await service.queryFirst(`SELECT name, id FROM items ORDER BY id`), 'one');
      assert.equal(await service.queryFirst(`SELECT name FROM items WHERE id = 99`), null);
      assert.equal(await service.queryFirst(`SELECT NULL::int`), null);
      assert.equal(await service.queryFirst(`SELECT '2026-01-02 03:04:05+00'::timestamptz`), '2026-01-02 03:04:05+00');
      assert.equal(await service.queryFirst(`SELECT '{"a": 1}'::jsonb`), '{"a": 1}');
      assert.equal(await service.queryFirst(`SELECT current_user`), 'svc_grader');
      await assert.rejects(service.queryFirst(`DELETE FROM items RETURNING id`), /cannot execute DELETE in a read-only transaction/);
      await assert.rejects(service.queryFirst(`SELECT nope FROM items`), /column "nope" does not exist \(line 1, column 8\)/);
    });

    test('isReady: the agent can connect; with a query, when it returns a row', { timeout: 30_000 }, async () => {
      assert.equal(await service.isReady(), true);
      assert.equal(await service.isReady(`SELECT 1 FROM items WHERE id = 1`), true);
      assert.equal(await service.isReady(`SELECT 1 FROM items WHERE id = 99`), false);
      assert.equal(await service.isReady(`SELECT 1 FROM missing_table`), false);
    });

    test('the agent’s role cannot create roles, run programs, touch the audit slot or read the server’s files', { timeout: 30_000 }, async () => {
      const attempts: Array<[string, RegExp]> = [
        [`CREATE ROLE intruder LOGIN`, /permission denied to create role/],
        [`ALTER ROLE postgres SUPERUSER`, /permission denied|must be superuser/],
        [`COPY (SELECT 1) TO PROGRAM 'id'`, /must be superuser or have privileges of the pg_execute_server_program role/],
        [`SELECT pg_drop_replication_slot('svc_audit')`, /must be superuser or replication role/],
        [`SELECT * FROM pg_logical_slot_get_changes('svc_audit', NULL, NULL)`, /must be superuser or replication role/],
        [`SELECT pg_read_binary_file('pg_replslot/svc_audit/state')`, /permission denied for function pg_read_binary_file/],
        [`SELECT pg_ls_dir('pg_replslot')`, /permission denied for function pg_ls_dir/],
        [`ALTER EVENT TRIGGER svc_refuse_unlogged DISABLE`, /must be owner of event trigger/],
        [`SET session_replication_role = replica`, /permission denied to set parameter/],
      ];
      for (const [sql, expected] of attempts) {
        const result = await psql(service, sql);
        assert.notEqual(result.code, 0, sql);
        assert.match(result.stderr, expected, sql);
      }
    });

    test("even the runner’s superuser is jailed: a program it runs is the postgres user, sees the host's system read-only and none of its data, no network", {
      timeout: 30_000,
    }, async () => {
      // The superuser's password is private to the service (it never runs tenant SQL); read here to test the jail.
      const password = (service as unknown as { superuserPassword: string }).superuserPassword;
      const client = new pg.Client({ host: path.dirname(service.socketPath), port: 5432, user: 'svc_superuser', password, database: 'app' });
      await client.connect();
      const marker = path.join('/usr', `svc-escape-${randomBytes(4).toString('hex')}`);
      // Host data any user may read (another sandbox's world-readable file, say): out of the jail's sight.
      const hostData = path.join('/var/tmp', `svc-host-data-${randomBytes(4).toString('hex')}`);
      fs.writeFileSync(hostData, 'host data\n', { mode: 0o644 });
      try {
        await client.query(`CREATE TEMP TABLE out (line text)`);
        await client.query(
          `COPY out FROM PROGRAM 'id -un; touch ${marker} 2>&1 || true; cat ${hostData} 2>&1 || true; tail -n +3 /proc/net/dev | cut -d: -f1'`,
        );
        const lines = (await client.query(`SELECT line FROM out`)).rows.map((r: { line: string }) => r.line);
        assert.equal(lines[0], 'postgres');
        assert.match(lines[1]!, /Read-only file system/);
        assert.match(lines[2]!, /No such file or directory/, "the host's data is not in the jail");
        assert.deepEqual(
          lines.slice(3).map((l) => l.trim()),
          ['lo'],
          'its own network namespace: loopback only',
        );
        assert.equal(fs.existsSync(marker), false);
      } finally {
        await client.end();
        fs.rmSync(marker, { force: true });
        fs.rmSync(hostData, { force: true });
      }
    });

    test('creating an unlogged table, or making one unlogged, is refused with the reason', { timeout: 30_000 }, async () => {
      const created = await psql(service, `CREATE UNLOGGED TABLE hidden (a int)`);
      assert.match(created.stderr, /unlogged tables are not allowed here: public\.hidden would hide its writes from the audit of database writes/);
      const altered = await psql(service, `CREATE TABLE later (a int); ALTER TABLE later SET UNLOGGED`);
      assert.match(altered.stderr, /unlogged tables are not allowed here: public\.later/);
      assert.equal(await service.queryFirst(`SELECT count(*) FROM pg_class WHERE relpersistence = 'u' AND relkind = 'r'`), '0');
      const temporary = await psql(service, `CREATE TEMP TABLE scratch (a int); INSERT INTO scratch VALUES (1)`);
      assert.equal(temporary.code, 0, 'temporary tables stay allowed');
    });

    test('dump() is plain SQL with the data, without the runner’s machinery', { timeout: 30_000 }, async () => {
      const dump = (await service.dump()).toString('utf8');
      assert.match(dump, /CREATE TABLE public\.items/);
      assert.match(dump, /COPY public\.items \(id, name\) FROM stdin;\n1\tone\n2\ttwo\n\\\.\n/);
      assert.doesNotMatch(dump, /svc_internal|svc_refuse_unlogged|svc_audit/);
    });
  });

  describe('postgres service: the db_write audit', () => {
    let service: PostgresService;
    let proxy: { port: number; close: () => Promise<void> };
    const writes: DbWrite[] = [];
    before(async () => {
      service = await start({ auditWrites: true, onWrite: (write) => writes.push(write) });
      await service.runSql(`
        CREATE TABLE orders (id serial PRIMARY KEY, v text);
        CREATE TABLE order_log (id serial, note text);
        CREATE FUNCTION log_order() RETURNS trigger LANGUAGE plpgsql AS $$
          BEGIN INSERT INTO order_log (note) VALUES ('order ' || NEW.id); RETURN NEW; END $$;
        CREATE TRIGGER orders_logged AFTER INSERT ON orders FOR EACH ROW EXECUTE FUNCTION log_order();
        CREATE SCHEMA sales;
        CREATE TABLE sales."Big Orders" (id int);
        CREATE TABLE bulk (id int);
        INSERT INTO orders (v) VALUES ('fixture');`);
      await service.startAudit();
      proxy = await observingProxy(service);
    });
    after(() => proxy.close());

    /** The records of what `act` does, once the audit has read them. */
    async function writesOf(act: () => Promise<unknown>): Promise<Array<Omit<DbWrite, 'ts'>>> {
      const from = writes.length;
      await act();
      await service.flushWrites();
      for (const write of writes.slice(from)) assert.ok(!Number.isNaN(Date.parse(write.ts)), write.ts);
      return writes.slice(from).map(({ ts: _ts, ...rest }) => rest);
    }

    const committed = (table: string, operation: DbWrite['operation'], row_count: number, transactions = 1) => ({
      table,
      operation,
      row_count,
      transactions,
      rolled_back: false,
    });
    const rolledBack = (table: string, operation: DbWrite['operation'], row_count: number) => ({
      table,
      operation,
      row_count,
      transactions: 1,
      rolled_back: true,
    });
    const agent = (sql: string, stdin?: string) => async () => {
      const result = await psql(service, sql, { port: proxy.port, stdin });
      return result;
    };

    test('the fixture’s writes, made before the audit started, are not reported', async () => {
      assert.deepEqual(writes, []);
      assert.equal(await service.queryFirst(`SELECT slot_name || ' ' || plugin FROM pg_replication_slots`), 'svc_audit test_decoding');
    });

    test('insert, update, delete, with the rows a trigger wrote', { timeout: 30_000 }, async () => {
      assert.deepEqual(await writesOf(agent(`INSERT INTO orders (v) VALUES ('a'), ('b'), ('c')`)), [
        committed('orders', 'insert', 3),
        committed('order_log', 'insert', 3),
      ]);
      assert.deepEqual(await writesOf(agent(`UPDATE orders SET v = 'z' WHERE v IN ('a', 'b')`)), [committed('orders', 'update', 2)]);
      assert.deepEqual(await writesOf(agent(`DELETE FROM orders WHERE v = 'c'`)), [committed('orders', 'delete', 1)]);
    });

    test('COPY FROM STDIN counts its rows', { timeout: 30_000 }, async () => {
      const records = await writesOf(agent(`COPY orders (v) FROM STDIN`, 'x\ny\n'));
      assert.deepEqual(records, [committed('orders', 'insert', 2), committed('order_log', 'insert', 2)]);
    });

    test('a prepared statement (a named query of the pg client), executed twice', { timeout: 30_000 }, async () => {
      const records = await writesOf(async () => {
        const client = new pg.Client({ host: '127.0.0.1', port: proxy.port, ...service.credentials });
        await client.connect();
        for (const v of ['p1', 'p2']) await client.query({ name: 'add-order', text: 'INSERT INTO sales."Big Orders" (id) VALUES ($1)', values: [v.length] });
        await client.end();
      });
      // one record for both when one read of the slot found both, else one each
      assert.ok(
        records.every((w) => w.table === 'sales.Big Orders' && w.operation === 'insert' && !w.rolled_back),
        JSON.stringify(records),
      );
      assert.equal(
        records.reduce((sum, w) => sum + w.row_count, 0),
        2,
      );
      assert.equal(
        records.reduce((sum, w) => sum + w.transactions, 0),
        2,
      );
    });

    test('a multi-statement query is one transaction with a record per table and operation', { timeout: 30_000 }, async () => {
      const records = await writesOf(
        agent(`INSERT INTO orders (v) VALUES ('m1'); UPDATE orders SET v = 'm2' WHERE v = 'm1'; DELETE FROM orders WHERE v = 'm2'`),
      );
      assert.deepEqual(records, [
        committed('orders', 'insert', 1),
        committed('order_log', 'insert', 1),
        committed('orders', 'update', 1),
        committed('orders', 'delete', 1),
      ]);
    });

    test('rolled-back writes are reported as such (from the wire), never as committed', { timeout: 30_000 }, async () => {
      await service.runSql(`DELETE FROM orders WHERE v = 'z'; INSERT INTO orders (v) VALUES ('z'), ('z')`);
      await service.flushWrites();
      const explicit = await writesOf(agent(`BEGIN; INSERT INTO orders (v) VALUES ('r1'), ('r2'); UPDATE orders SET v = 'r' WHERE v = 'z'; ROLLBACK`));
      assert.deepEqual(explicit, [rolledBack('orders', 'insert', 2), rolledBack('orders', 'update', 2)]);
      const failed = await writesOf(async () => {
        const result = await agent(`INSERT INTO "orders" (v) VALUES ('f'); SELECT 1 / 0`)();
        assert.match(result.stderr, /division by zero/);
      });
      assert.deepEqual(failed, [rolledBack('orders', 'insert', 1)]);
      const savepoint = await writesOf(
        agent(
          `BEGIN; INSERT INTO orders (v) VALUES ('s'); SAVEPOINT before_delete; DELETE FROM orders WHERE v = 's'; ROLLBACK TO SAVEPOINT before_delete; COMMIT`,
        ),
      );
      assert.deepEqual(savepoint, [rolledBack('orders', 'delete', 1), committed('orders', 'insert', 1), committed('order_log', 'insert', 1)]);
      const failedCommit = await writesOf(async () => {
        const client = new pg.Client({ host: '127.0.0.1', port: proxy.port, ...service.credentials });
        await client.connect();
        await client.query('BEGIN');
        await client.query({ text: 'DELETE FROM public.orders WHERE v = $1', values: ['z'] });
        await client.query('SELECT missing_column FROM orders').catch(() => {});
        await client.query('COMMIT'); // answered ROLLBACK: the transaction had failed
        await client.end();
      });
      assert.deepEqual(failedCommit, [rolledBack('orders', 'delete', 2)]);
      assert.equal(await service.queryFirst(`SELECT count(*) FROM orders WHERE v = 'z'`), '2');
    });

    test('TRUNCATE is recorded per table', { timeout: 30_000 }, async () => {
      assert.deepEqual(await writesOf(agent(`TRUNCATE order_log, sales."Big Orders"`)), [
        committed('order_log', 'truncate', 0),
        committed('sales.Big Orders', 'truncate', 0),
      ]);
    });

    test('10,000 autocommit inserts make a handful of records; a 200,000-row transaction one', { timeout: 120_000 }, async () => {
      const many = await writesOf(async () => {
        const client = new pg.Client({ host: path.dirname(service.socketPath), port: 5432, ...service.credentials });
        await client.connect();
        for (let i = 0; i < 10_000; i++) await client.query({ text: 'INSERT INTO bulk VALUES ($1)', values: [i] });
        await client.end();
      });
      assert.ok(many.length >= 1 && many.length <= 100, `${many.length} records`);
      assert.ok(many.every((w) => w.table === 'bulk' && w.operation === 'insert' && !w.rolled_back));
      assert.equal(
        many.reduce((sum, w) => sum + w.row_count, 0),
        10_000,
      );
      assert.equal(
        many.reduce((sum, w) => sum + w.transactions, 0),
        10_000,
      );
      const big = await writesOf(agent(`INSERT INTO bulk SELECT generate_series(1, 200000)`));
      assert.deepEqual(big, [committed('bulk', 'insert', 200_000)]);
    });
  });
}
