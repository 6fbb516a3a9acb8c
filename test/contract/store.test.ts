/**
 * The Store contract: the SQL the project relies on (migrations, bound parameters, the
 * trace_events round trip, keyset pagination, replay dedup, persistence), run on chDB always (a
 * temp data dir). The same suite runs on a modern ClickHouse server over HTTP when
 * SVC_TEST_CLICKHOUSE_MODERN_URL points at one (>= 23, in UTC, an empty database): none can be
 * installed on these machines, so it is skipped with a reason otherwise, also under CI
 * (Debian's 18.16 server only gets the transport test, store.clickhouse-server.test.ts).
 */
import assert from 'node:assert/strict';
import { readdirSync, cpSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { ChdbStore } from '../../services/kernel/store/chdb-store.ts';
import { ClickHouseStore } from '../../services/kernel/store/clickhouse-store.ts';
import { migrate, MIGRATIONS_DIR } from '../../services/kernel/store/migrations.ts';
import type { Store } from '../../services/kernel/store/store.ts';

interface Harness {
  open(): Store;
  /** Removes what the suite left behind (the data dir). */
  cleanup(): Promise<void>;
}

/** Every numbered file of the project, in order (each issue adds its own). */
const MIGRATION_NAMES = readdirSync(MIGRATIONS_DIR)
  .filter((f) => /^\d{4}_.+\.sql$/.test(f))
  .sort()
  .map((f) => f.replace(/\.sql$/, ''));

/** A trace_events row with every column set; `over` replaces some. */
function traceRow(over: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    Timestamp: '2026-01-02 03:04:05.123456789',
    TraceId: '0af7651916cd43dd8448eb211c80319c',
    SpanId: 'b7ad6b7169203331',
    ParentSpanId: '',
    SpanName: 'bash',
    SpanKind: 'Internal',
    ServiceName: 'agent-x',
    ResourceAttributes: { 'service.name': 'agent-x' },
    SpanAttributes: { model: 'gpt-4o', attempt: '2' },
    Duration: 1_500_000,
    StatusCode: 'Ok',
    StatusMessage: '',
    TenantId: 'tenant-a',
    EventId: 'evt_1',
    SandboxId: 'sb-0123456789ab',
    ExperimentId: 'exp-1',
    AgentSnapshotId: 'snap_abc',
    EventType: 'tool_call',
    Phase: 'run',
    Input: 'ls -la',
    Output: 'total 0\n',
    CostModel: 'gpt-4o',
    InputTokens: 1200,
    OutputTokens: 300,
    CacheReadTokens: 0,
    ReasoningTokens: 0,
    EstimatedUsd: 0.0125,
    HasCost: 1,
    IngestedAt: new Date('2026-01-02T03:04:06.789Z'),
    LogPartition: 3,
    LogOffset: 41n,
    ...over,
  };
}

function storeContract(name: string, harness: Harness | string): void {
  if (typeof harness === 'string') {
    test(name, { skip: harness }, () => {});
    return;
  }
  describe(name, () => {
    let store: Store;
    before(() => {
      store = harness.open();
    });
    after(async () => {
      await store.close();
      await harness.cleanup();
    });

    test('ping answers', async () => {
      assert.equal(await store.ping(), true);
    });

    test('migrate applies the numbered files in order, then is a no-op', async () => {
      assert.deepEqual(await store.migrate(), MIGRATION_NAMES);
      assert.deepEqual(await store.migrate(), []);
      const rows = await store.query<{ version: number; name: string; checksum: string }>(
        'SELECT version, name, checksum FROM schema_migrations ORDER BY version',
      );
      assert.deepEqual(
        rows.map((r) => [r.version, r.name]),
        MIGRATION_NAMES.map((n, i) => [i + 1, n]),
      );
      for (const row of rows) assert.match(row.checksum, /^[0-9a-f]{64}$/);
      const tables = await store.query<{ name: string }>(
        "SELECT name FROM system.tables WHERE database = currentDatabase() AND name IN ('trace_events', 'dead_letters') ORDER BY name",
      );
      assert.deepEqual(
        tables.map((t) => t.name),
        ['dead_letters', 'trace_events'],
      );
    });

    test('a changed, already applied migration is an error naming the file', async () => {
      const dir = mkdtempSync(join(tmpdir(), 'svc-migrations-'));
      try {
        cpSync(MIGRATIONS_DIR, dir, { recursive: true });
        const file = join(dir, '0003_dead_letters.sql');
        writeFileSync(file, readFileSync(file, 'utf8') + '\n-- edited after the fact\n');
        await assert.rejects(migrate(store, dir), /0003_dead_letters\.sql was changed after it was applied/);
        // A new file after the applied ones is applied, and only it.
        writeFileSync(file, readFileSync(join(MIGRATIONS_DIR, '0003_dead_letters.sql')));
        writeFileSync(join(dir, '9999_extra.sql'), '-- test\nCREATE TABLE IF NOT EXISTS extra_t (a UInt8)\nENGINE = MergeTree ORDER BY a;\n\nSELECT 1;\n');
        assert.deepEqual(await migrate(store, dir), ['9999_extra']);
        assert.deepEqual(await migrate(store, dir), []);
      } finally {
        await store.command('DROP TABLE IF EXISTS extra_t');
        await store.command('ALTER TABLE schema_migrations DELETE WHERE version = 9999 SETTINGS mutations_sync = 1');
        rmSync(dir, { recursive: true, force: true });
      }
    });

    test('bound params of String, DateTime64, UInt64 and Array(String) come back typed as documented', async () => {
      const [row] = await store.query(
        `SELECT {s:String} AS s, {t:DateTime64(9)} AS t, {d:DateTime64(3)} AS d, {u:UInt64} AS u, {b:UInt64} AS b,
                {a:Array(String)} AS a, length({a:Array(String)}) AS n, toUInt32(7) AS u32, 1.5 AS f, {nul:Nullable(String)} AS nul`,
        {
          s: 'it\'s "quoted"\\ and\nmultiline',
          t: '2026-01-02 03:04:05.123456789',
          d: new Date('2026-01-02T03:04:05.678Z'),
          u: '18446744073709551615',
          b: 42n,
          a: ["o'neil", 'back\\slash', 'comma,inside', ''],
          nul: null,
        },
      );
      assert.deepEqual(row, {
        s: 'it\'s "quoted"\\ and\nmultiline',
        t: '2026-01-02 03:04:05.123456789',
        d: '2026-01-02 03:04:05.678',
        u: '18446744073709551615', // 64-bit integers are strings
        b: '42',
        a: ["o'neil", 'back\\slash', 'comma,inside', ''],
        n: '4', // length() is UInt64
        u32: 7, // 32-bit and smaller are numbers
        f: 1.5,
        nul: null,
      });
    });

    test('a parameter never becomes SQL', async () => {
      await store.insert('trace_events', [traceRow({ TenantId: 'tenant-inj', EventId: 'evt_inj' })]);
      const attacks = ["tenant-inj' OR 1=1 --", "x'); DROP TABLE trace_events; --", '{t:String}', 'tenant-inj\\'];
      for (const attack of attacks) {
        const rows = await store.query('SELECT EventId FROM trace_events WHERE TenantId = {t:String}', { t: attack });
        assert.deepEqual(rows, [], attack);
      }
      // The value is stored and compared verbatim, quotes and all.
      await store.insert('trace_events', [traceRow({ TenantId: 'tenant-inj', EventId: attacks[1] })]);
      const rows = await store.query<{ EventId: string }>('SELECT EventId FROM trace_events WHERE TenantId = {t:String} AND EventId = {e:String}', {
        t: 'tenant-inj',
        e: attacks[1],
      });
      assert.deepEqual(rows, [{ EventId: attacks[1] }]);
      const [count] = await store.query<{ c: string }>("SELECT count() AS c FROM trace_events WHERE TenantId = 'tenant-inj'");
      assert.equal(count?.c, '2');
      // Through the other kinds of placeholder: an array's elements and a number's text.
      const inArray = await store.query<{ EventId: string }>(
        'SELECT EventId FROM trace_events WHERE TenantId = {t:String} AND EventId IN {ids:Array(String)}',
        {
          t: 'tenant-inj',
          ids: ["x'] OR 1=1 --", "x\\'], ['", attacks[1]],
        },
      );
      assert.deepEqual(inArray, [{ EventId: attacks[1] }]);
      await assert.rejects(store.query('SELECT count() AS c FROM trace_events WHERE LogPartition = {n:UInt32}', { n: '1 OR 1=1' }));
      await assert.rejects(store.query('SELECT count() AS c FROM trace_events WHERE LogPartition = {n:UInt32}', { n: "1') OR ('1'='1" }));
    });

    test("placeholders in the SQL's literals, quoted names and comments stay text; a missing parameter or a value not of its type is the engine's error", async () => {
      const value = 'nul\0 tab\t cr\r bs\\ quote\' dq" bq` {x:String} */ --';
      const [row] = await store.query<Record<string, string>>(
        `SELECT '{v:String}' AS "{v:String}", {v:String} AS v, toString(1) AS \`b{v:String}\`, 'it''s {v:String}' AS doubled -- {absent:String}
         /* {absent:String} */`,
        { v: value },
      );
      assert.deepEqual(row, { '{v:String}': '{v:String}', v: value, 'b{v:String}': '1', doubled: "it's {v:String}" });
      await assert.rejects(store.query('SELECT {absent:String} AS a', { v: 'x' }), /absent/);
      await assert.rejects(store.query('SELECT {u:UInt32} AS u', { u: -1 }));
      await assert.rejects(store.query('SELECT {u:UInt32} AS u', { u: 'twelve' }));
      const many = Array.from({ length: 10_000 }, (_, i) => `trace-${i}'`);
      const [found] = await store.query<{ n: string; last: string }>('SELECT length({a:Array(String)}) AS n, {a:Array(String)}[-1] AS last', { a: many });
      assert.deepEqual(found, { n: '10000', last: "trace-9999'" });
    });

    test('trace_events round trip: Map, Nullable, DateTime64 and 64-bit columns keep their values', async () => {
      const full = traceRow({ TenantId: 'tenant-rt', EventId: 'evt_full' });
      const sparse = traceRow({
        TenantId: 'tenant-rt',
        EventId: 'evt_sparse',
        Timestamp: '2026-01-02 03:04:05.123456790',
        SandboxId: null,
        SpanAttributes: {},
        StatusCode: 'Error',
        StatusMessage: 'exit 1',
        HasCost: 0,
        InputTokens: '18446744073709551615',
      });
      await store.insert('trace_events', [full, sparse]);
      const rows = await store.query<Record<string, unknown>>('SELECT * FROM trace_events WHERE TenantId = {t:String} ORDER BY Timestamp, EventId', {
        t: 'tenant-rt',
      });
      assert.equal(rows.length, 2);
      assert.deepEqual(rows[0], {
        ...full,
        Duration: '1500000',
        InputTokens: '1200',
        OutputTokens: '300',
        CacheReadTokens: '0',
        ReasoningTokens: '0',
        IngestedAt: '2026-01-02 03:04:06.789',
        LogOffset: '41',
      });
      assert.equal(rows[1]?.SandboxId, null);
      assert.deepEqual(rows[1]?.SpanAttributes, {});
      assert.equal(rows[1]?.InputTokens, '18446744073709551615');
      assert.equal(rows[1]?.Timestamp, '2026-01-02 03:04:05.123456790');
      const bySandbox = await store.query('SELECT EventId FROM trace_events WHERE TenantId = {t:String} AND SandboxId = {sb:String}', {
        t: 'tenant-rt',
        sb: 'sb-0123456789ab',
      });
      assert.deepEqual(bySandbox, [{ EventId: 'evt_full' }]);
      const byAttr = await store.query("SELECT EventId FROM trace_events WHERE TenantId = {t:String} AND SpanAttributes['model'] = {m:String}", {
        t: 'tenant-rt',
        m: 'gpt-4o',
      });
      assert.deepEqual(byAttr, [{ EventId: 'evt_full' }]);
    });

    test('keyset pagination on (Timestamp, EventId) returns every row once, in order, one tenant only', async () => {
      const rows: Record<string, unknown>[] = [];
      for (let i = 0; i < 25; i++) {
        // Groups of three share a Timestamp, so ties are broken by EventId; the group crosses a
        // day boundary (two partitions).
        const ns = String(Math.floor(i / 3)).padStart(9, '0');
        const ts = i < 12 ? `2026-01-31 23:59:59.${ns}` : `2026-02-01 00:00:00.${ns}`;
        rows.push(traceRow({ TenantId: 'tenant-page', EventId: `evt_${String(24 - i).padStart(2, '0')}`, Timestamp: ts, LogOffset: i }));
        rows.push(traceRow({ TenantId: 'tenant-other', EventId: `evt_o${i}`, Timestamp: ts }));
      }
      await store.insert('trace_events', rows);
      const expected = rows
        .filter((r) => r.TenantId === 'tenant-page')
        .map((r) => [r.Timestamp as string, r.EventId as string] as const)
        .sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : a[1] < b[1] ? -1 : a[1] > b[1] ? 1 : 0));

      const sql = `SELECT Timestamp, EventId FROM trace_events
        WHERE TenantId = {tenant:String}
          AND Timestamp >= {ts:DateTime64(9)}
          AND (Timestamp, EventId) > ({ts:DateTime64(9)}, {id:String})
        ORDER BY Timestamp, EventId
        LIMIT {limit:UInt32}`;
      const pages: (readonly [string, string])[][] = [];
      let cursor = { ts: '1970-01-01 00:00:00', id: '' };
      for (;;) {
        const page = await store.query<{ Timestamp: string; EventId: string }>(sql, { tenant: 'tenant-page', ...cursor, limit: 10 });
        if (page.length === 0) break;
        pages.push(page.map((r) => [r.Timestamp, r.EventId] as const));
        const last = page.at(-1)!;
        cursor = { ts: last.Timestamp, id: last.EventId };
      }
      assert.deepEqual(
        pages.map((p) => p.length),
        [10, 10, 5],
      );
      assert.deepEqual(pages.flat(), expected);
    });

    test('a replayed row collapses by the sort key, and max(LogOffset) per LogPartition is the high-water mark', async () => {
      const rows = [
        traceRow({ TenantId: 'tenant-dup', EventId: 'evt_a', LogPartition: 0, LogOffset: 7 }),
        traceRow({ TenantId: 'tenant-dup', EventId: 'evt_b', LogPartition: 1, LogOffset: 9 }),
      ];
      await store.insert('trace_events', rows);
      await store.insert('trace_events', rows); // the replay
      const [final] = await store.query<{ c: string }>('SELECT count() AS c FROM trace_events FINAL WHERE TenantId = {t:String}', { t: 'tenant-dup' });
      assert.equal(final?.c, '2');
      const marks = await store.query(
        'SELECT LogPartition, max(LogOffset) AS hw FROM trace_events WHERE TenantId = {t:String} GROUP BY LogPartition ORDER BY LogPartition',
        { t: 'tenant-dup' },
      );
      assert.deepEqual(marks, [
        { LogPartition: 0, hw: '7' },
        { LogPartition: 1, hw: '9' },
      ]);
    });

    test('a Nullable column keeps a 0 or an empty string even when every row of the batch has it', async () => {
      await store.command(
        'CREATE TABLE IF NOT EXISTS nullable_probe (Id String, Score Nullable(Float64), Note Nullable(String), Plain Float64) ENGINE = MergeTree ORDER BY Id',
      );
      await store.insert('nullable_probe', [
        { Id: 'a', Score: 0, Note: '', Plain: 0 },
        { Id: 'b', Score: 0, Note: '', Plain: 0 },
      ]);
      await store.insert('nullable_probe', [{ Id: 'c', Score: null, Note: null, Plain: 0 }]);
      const rows = await store.query<{ Id: string; Score: number | null; Note: string | null; Plain: number }>(
        'SELECT Id, Score, Note, Plain FROM nullable_probe ORDER BY Id',
      );
      assert.deepEqual(rows, [
        { Id: 'a', Score: 0, Note: '', Plain: 0 },
        { Id: 'b', Score: 0, Note: '', Plain: 0 },
        { Id: 'c', Score: null, Note: null, Plain: 0 },
      ]);
    });

    test('dead_letters takes a row', async () => {
      const value = Buffer.from([0, 255, 1, 2]).toString('base64');
      await store.insert('dead_letters', [
        {
          TenantId: 't',
          Topic: 'trace-events',
          Partition: 2,
          Offset: 10n,
          Key: 'k',
          Error: 'bad',
          Attempts: 5,
          FailedAt: new Date('2026-01-02T00:00:00.5Z'),
          Value: value,
        },
      ]);
      const rows = await store.query('SELECT Partition, Offset, Attempts, FailedAt, Value FROM dead_letters');
      assert.deepEqual(rows, [{ Partition: 2, Offset: '10', Attempts: 5, FailedAt: '2026-01-02 00:00:00.500', Value: value }]);
    });

    test('the event loop keeps running while a query works', async () => {
      let ticks = 0;
      const timer = setInterval(() => ticks++, 1);
      try {
        const started = performance.now();
        await store.query('SELECT sum(cityHash64(toString(number))) AS s FROM numbers(20000000)'); // ~150 ms here
        const elapsed = performance.now() - started;
        // A query that blocked the loop would leave ticks at 0, however long it took.
        if (elapsed >= 20) assert.ok(ticks > 0, `no timer tick in ${elapsed.toFixed(0)} ms`);
      } finally {
        clearInterval(timer);
      }
    });

    test('a read does not wait for a running write', async () => {
      const order: string[] = [];
      const heavy = store.command('SELECT sum(cityHash64(toString(number))) FROM numbers(60000000)').then(() => order.push('write'));
      await new Promise((resolve) => setTimeout(resolve, 20));
      await store.query('SELECT 1 AS one').then(() => order.push('read'));
      await heavy;
      assert.deepEqual(order, ['read', 'write']);
    });

    test('a read does not wait for a running read, parameters and all', async () => {
      const order: string[] = [];
      const slow = store.query('SELECT sleep(1.5) AS s, {tag:String} AS tag', { tag: 'slow' }).then(() => order.push('slow'));
      await new Promise((resolve) => setTimeout(resolve, 100));
      await store.query('SELECT {tag:String} AS tag', { tag: 'quick' }).then(() => order.push('quick'));
      await slow;
      assert.deepEqual(order, ['quick', 'slow']);
    });

    test('data survives close and reopen; migrate then has nothing to do', async () => {
      await store.close();
      await store.close(); // idempotent
      store = harness.open();
      assert.deepEqual(await store.migrate(), []);
      const [row] = await store.query<{ c: string }>('SELECT count() AS c FROM trace_events WHERE TenantId = {t:String}', { t: 'tenant-rt' });
      assert.equal(row?.c, '2');
    });
  });
}

const dataDir = mkdtempSync(join(tmpdir(), 'svc-chdb-'));
storeContract('Store contract on chDB', {
  open: () => new ChdbStore({ path: dataDir }),
  cleanup: async () => rmSync(dataDir, { recursive: true, force: true }),
});

describe('ChdbStore specifics', () => {
  test('one data directory per process: a second path is refused until the first store is closed', async () => {
    const a = mkdtempSync(join(tmpdir(), 'svc-chdb-a-'));
    const b = mkdtempSync(join(tmpdir(), 'svc-chdb-b-'));
    try {
      const first = new ChdbStore({ path: a });
      const again = new ChdbStore({ path: a }); // the same path may be opened twice
      await again.close();
      assert.equal(await first.ping(), true);
      assert.throws(() => new ChdbStore({ path: b }), /only one active data directory per process/);
      await first.close();
      const second = new ChdbStore({ path: b });
      assert.equal(await second.ping(), true);
      await second.close();
      await assert.rejects(second.query('SELECT 1'), /closed/);
    } finally {
      rmSync(a, { recursive: true, force: true });
      rmSync(b, { recursive: true, force: true });
    }
  });

  test("engine calls never hold all of libuv's threads: the file system goes on while as many queries as the pool has threads sleep", async () => {
    // Each chDB call holds a thread of libuv's pool until its query ends; the same pool runs
    // every file system call of the process (the log's appends and fsync).
    const poolThreads = Number(process.env.UV_THREADPOOL_SIZE) || 4;
    const dir = mkdtempSync(join(tmpdir(), 'svc-chdb-pool-'));
    const store = new ChdbStore({ path: dir });
    try {
      const settled: string[] = [];
      const sleeping = Array.from({ length: poolThreads }, (_, i) =>
        store
          .rawQuery({ sql: 'SELECT sleep(1.5)', format: 'TabSeparated', settings: [], params: {}, queryId: 'pool-test' })
          .then(() => settled.push(`query ${i}`)),
      );
      await new Promise((resolve) => setTimeout(resolve, 300)); // every query has reached the engine or its queue
      await stat(dir).then(() => settled.push('stat'));
      await Promise.all(sleeping);
      assert.equal(settled[0], 'stat', `a stat waited behind ${poolThreads} sleeping queries: ${settled.join(', ')}`);
    } finally {
      await store.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

const modernUrl = process.env.SVC_TEST_CLICKHOUSE_MODERN_URL;
storeContract(
  'Store contract on a ClickHouse server',
  modernUrl
    ? { open: () => new ClickHouseStore({ url: modernUrl }), cleanup: async () => {} }
    : 'no modern ClickHouse server: SVC_TEST_CLICKHOUSE_MODERN_URL is unset (none installs here; the SQL is proven on chDB)',
);
