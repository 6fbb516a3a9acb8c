/**
 * Backing services' figures (issue 16), side by side in one run: sandbox create with one postgres
 * and one http_mock vs without services, with the database's own start as its share; a
 * write-heavy agent (10,000 single-row inserts, each its own transaction, through the gateway)
 * with `audit.db_writes` on vs off; and 20 such sandboxes at once.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { PostgresService } from '../../services/sandbox-runner/backing/postgres.ts';
import { startServer, type TestServer } from '../helpers/server.ts';
import { pct } from './queries.ts';
import { interleavedCreates, timedSandboxes } from './sandbox-timing.ts';

const BASE = 'version: 1\nbase: debian:bookworm\ntask: {prompt: bench}\ninvariants: {ok: {check: {type: command_exit, command: "true"}}}\n';
const SERVICES = `services:
  - {name: db, type: postgres}
  - {name: api, type: http_mock, routes: [{method: GET, path: /ok, response: {status: 200, body: ok}}]}
fixtures: [{type: sql, service: db, sql: "CREATE TABLE t (id serial PRIMARY KEY, v int)"}]
`;
/** 10,000 inserts, one statement (and transaction) each, from one psql session. */
const WRITER = `python3 -c "print('\\n'.join('insert into t(v) values (%d);' % i for i in range(10000)))" | psql -q -v ON_ERROR_STOP=1`;

export async function benchServices(): Promise<string[]> {
  const dir = await mkdtemp(path.join(os.tmpdir(), 'svc-bench-services-'));
  let server: TestServer | null = null;
  try {
    server = await startServer({ SVC_SANDBOX_HOST_ROOTFS: 'true', SVC_RATE_LIMIT_READS: '0', SVC_RATE_LIMIT_WRITES: '0' });
    const s = server;
    const { create, destroy } = await timedSandboxes(s, [
      `id: plain\n${BASE}`,
      `id: backed\n${BASE}${SERVICES}`,
      `id: audited\n${BASE}${SERVICES}audit: {db_writes: true}\n`,
    ]);
    const command = async (id: string, text: string) => {
      const res = await s.request('POST', `/v1/sandboxes/${id}/commands`, { body: { command: text, timeout: '5m' } });
      if (res.body.exit_code !== 0) throw new Error(`command: ${res.text.slice(0, 500)}`);
      return res.body.duration_ms as number;
    };

    const creates = await interleavedCreates({ create, destroy }, ['plain', 'backed'] as const, 3, 20);
    const database = await postgresStarts(dir, 10);

    const writes: Record<'off' | 'on', number[]> = { off: [], on: [] };
    for (let i = 0; i < 3; i++) {
      for (const [audit, spec] of [
        ['off', 'backed'],
        ['on', 'audited'],
      ] as const) {
        const { id } = await create(spec);
        writes[audit].push(await command(id, WRITER));
        await destroy(id);
      }
    }

    // 20 at once: create, write, destroy.
    const started = performance.now();
    const together = await Promise.all(
      Array.from({ length: 20 }, async () => {
        const { id, ms } = await create('audited');
        const wrote = await command(id, WRITER);
        await destroy(id);
        return { ms, wrote };
      }),
    );
    const allMs = performance.now() - started;

    const f = (n: number) => n.toFixed(1);
    const median = (xs: number[]) => pct(xs, 0.5);
    const slower = median(writes.on) / median(writes.off) - 1;
    return [
      `| sandbox create to ready: one postgres + one http_mock vs no services (interleaved, 20 each) | p50 ${f(pct(creates.backed, 0.5))} ms, p95 ${f(pct(creates.backed, 0.95))} ms | p50 ${f(pct(creates.plain, 0.5))} ms, p95 ${f(pct(creates.plain, 0.95))} ms | target p50 < 400 ms |`,
      `| its shares: the database's own start (template copy, server start, roles; 10 starts) / the rest | p50 ${f(database.p50)} ms, p95 ${f(database.p95)} ms | sandbox and services' wait p50 ${f(pct(creates.backed, 0.5) - database.p50)} ms | the database starts while the runtime does; the mock is in-process (< 1 ms) |`,
      `| write-heavy agent: 10,000 single-row inserts through the gateway, audit.db_writes on vs off (3 each, median) | ${f(median(writes.on))} ms | ${f(median(writes.off))} ms | ${slower >= 0 ? '+' : ''}${(slower * 100).toFixed(1)}% (target <= +20%) |`,
      `| 20 such sandboxes at once (audited; create, 10,000 inserts, destroy) | all done in ${f(allMs / 1000)} s | create p50 ${f(
        pct(
          together.map((t) => t.ms),
          0.5,
        ),
      )} ms, p95 ${f(
        pct(
          together.map((t) => t.ms),
          0.95,
        ),
      )} ms; inserts p50 ${f(
        pct(
          together.map((t) => t.wrote),
          0.5,
        ),
      )} ms | |`,
    ];
  } finally {
    await server?.cleanup();
    await PostgresService.settle();
    await rm(dir, { recursive: true, force: true });
  }
}

/** The database's own start, alone: `n` starts and stops (the template already made by the warm-up). */
async function postgresStarts(dir: string, n: number): Promise<{ p50: number; p95: number }> {
  const times: number[] = [];
  for (let i = 0; i < n + 1; i++) {
    const started = performance.now();
    const service = await PostgresService.start({
      name: 'bench',
      database: 'app',
      user: 'app',
      root: path.join(dir, `pg-${i}`),
      cacheDir: path.join(dir, 'templates'),
      auditWrites: true,
    });
    if (i > 0) times.push(performance.now() - started);
    await service.stop();
  }
  return { p50: pct(times, 0.5), p95: pct(times, 0.95) };
}
