/**
 * The HTTP store adapter's transport against a real ClickHouse server: `npm test` starts Debian's
 * clickhouse-server 18.16 (infra/clickhouse/README.md) and passes its URL in
 * SVC_TEST_CLICKHOUSE_URL. That server predates query parameters, DateTime64 and Map, so this
 * checks the transport only (ping, DDL, JSONEachRow insert, select, shapes, errors); the SQL is
 * proven on chDB (store.test.ts). Without a server the suite is skipped with a reason, or fails
 * under CI=true.
 */
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { after, before, describe, test } from 'node:test';
import { AppError } from '../../services/kernel/errors.ts';
import { ClickHouseStore } from '../../services/kernel/store/clickhouse-store.ts';
import { backend } from '../helpers/backend.ts';

const NAME = 'ClickHouseStore transport against a ClickHouse server';
const url = backend('SVC_TEST_CLICKHOUSE_URL', NAME);

if (url) {
  describe(NAME, () => {
    const table = `transport_${randomBytes(4).toString('hex')}`;
    let store: ClickHouseStore;
    before(() => {
      store = new ClickHouseStore({ url });
    });
    after(async () => {
      await store.command(`DROP TABLE IF EXISTS ${table}`).catch(() => {});
      await store.close();
    });

    test('ping answers', async () => {
      assert.equal(await store.ping(), true);
      assert.equal(store.kind, 'clickhouse');
    });

    test('a call without params (or with an empty params object) sends nothing an old server rejects', async () => {
      assert.deepEqual(await store.query('SELECT 1 AS one, toUInt64(2) AS two'), [{ one: 1, two: '2' }]);
      assert.deepEqual(await store.query('SELECT 1 AS one', {}), [{ one: 1 }]);
      await store.command('SELECT 1', {});
    });

    test('command runs DDL (an old-server-friendly MergeTree)', async () => {
      await store.command(
        `CREATE TABLE IF NOT EXISTS ${table} (
           ts DateTime, tenant String, id String, n UInt64, small UInt32, f Float64,
           tags Array(String), note Nullable(String)
         ) ENGINE = MergeTree ORDER BY (tenant, ts, id)`,
      );
      const exists = await store.query<{ result: number }>(`EXISTS TABLE ${table}`);
      assert.deepEqual(exists, [{ result: 1 }]);
    });

    test('insert (JSONEachRow) and select give back the shapes chDB gives', async () => {
      await store.insert(table, [
        { ts: new Date('2026-01-02T03:04:05Z'), tenant: 't1', id: 'a', n: 18446744073709551615n, small: 7, f: 1.5, tags: ["o'neil", 'b"'], note: null },
        { ts: '2026-01-02 03:04:06', tenant: 't1', id: "x'); DROP TABLE x; --", n: '42', small: 0, f: -0.25, tags: [], note: 'line\nbreak' },
        { ts: '2026-01-02 03:04:07', tenant: 't2', id: 'c', n: 1, small: 1, f: 0, tags: ['z'], note: 'other tenant' },
      ]);
      await store.insert(table, []); // no-op, no request
      const rows = await store.query(`SELECT * FROM ${table} WHERE tenant = 't1' ORDER BY ts`);
      assert.deepEqual(rows, [
        { ts: '2026-01-02 03:04:05', tenant: 't1', id: 'a', n: '18446744073709551615', small: 7, f: 1.5, tags: ["o'neil", 'b"'], note: null },
        { ts: '2026-01-02 03:04:06', tenant: 't1', id: "x'); DROP TABLE x; --", n: '42', small: 0, f: -0.25, tags: [], note: 'line\nbreak' },
      ]);
      const [count] = await store.query<{ c: string }>(`SELECT count() AS c FROM ${table}`);
      assert.equal(count?.c, '3'); // count() is UInt64: a string
    });

    test('a query error rejects with the server message; an unreachable server is `unavailable`', async () => {
      await assert.rejects(store.query('SELECT no_such_column FROM system.one'), /no_such_column/);
      const down = new ClickHouseStore({ url: 'http://default:@127.0.0.1:1/default', requestTimeoutMs: 2000 });
      try {
        assert.equal(await down.ping(), false);
        await assert.rejects(down.query('SELECT 1'), (err: unknown) => err instanceof AppError && err.code === 'unavailable' && err.retriable);
      } finally {
        await down.close();
      }
    });
  });
}
